// --check-finite: the NaN guard. Every rank contributes whether its loss or the averaged
// gradients hold a NaN or Inf; all see the same flags and so skip the same steps, and the job
// stops after --max-bad-steps in a row.
#pragma once

#include <cstdint>
#include <vector>

#include "options.h"
#include "ringtrain/comm.h"
#include "ringtrain/train.h"

namespace ringtrain::app {

class FiniteGuard {
 public:
  FiniteGuard(const Options& o, Comm& comm);
  FiniteGuard(const FiniteGuard&) = delete;  // hook() keeps `this`
  FiniteGuard& operator=(const FiniteGuard&) = delete;
  // The step's before_update hook (empty without --check-finite). Collective: one allgather
  // of a byte per step. Throws ExitCode::kNonFinite on every rank after --max-bad-steps.
  BeforeUpdateFn hook();
  void set_step(int64_t step) { step_ = step; }  // for the messages
  int64_t skipped_steps() const { return skipped_; }

 private:
  bool check(const StepStats& stats, std::span<const float> grads);

  const Options& o_;
  Comm& comm_;
  int64_t step_ = 0, bad_in_a_row_ = 0, skipped_ = 0;
  std::vector<uint8_t> flags_;  // one per rank, reused: no per-step allocation
};

}  // namespace ringtrain::app
