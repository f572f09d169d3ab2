// The chief's checkpoint writes, shared by the ring's loop and the parameter-server chief: the
// header every checkpoint of this run carries, the write itself (with the crash-consistency
// test's kill point), and its log line and metrics record.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "options.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/comm.h"
#include "ringtrain/model.h"
#include "ringtrain/report.h"
#include "run_plan.h"

namespace ringtrain::app {

// What every checkpoint of this run says about the run.
struct CheckpointHeader {
  std::string model;
  std::string layers;  // Model::signature()
  int64_t num_params = 0;
  int64_t steps_per_epoch = 1;
  uint64_t seed = 0;
  int64_t global_batch = 0;
  int ranks = 1;            // the data ranks
  int64_t micro_batch = 0;  // --reproducible's --micro-batch; 0 without it
  LrSchedule schedule;
  std::string optimizer;
};
// This run's header: `ranks` are the data ranks, `optimizer` its name.
CheckpointHeader checkpoint_header(const Options& o, const Model& model, const RunPlan& plan,
                                   int ranks, const std::string& optimizer);
// A checkpoint of `step` with the header filled in; the caller adds the state.
Checkpoint checkpoint_at(const CheckpointHeader& header, int64_t step);

class CheckpointWriter {
 public:
  // Writes nothing without --checkpoint-dir. A long write posts progress on `board` (the
  // others wait for the chief in their next collective).
  CheckpointWriter(const Options& o, MetricsWriter& metrics, ProgressBoard& board);
  // The fault hook keeps `this`.
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  bool enabled() const { return dir_.has_value(); }
  // Writes `c` (the chief only), logs "checkpoint: step {}{note} written to {} in {} ms" and
  // records it in the metrics. Non-finite values are refused with advice, naming the step;
  // the checkpoints already written stay intact.
  void save(const Checkpoint& c, const std::string& note = "");

 private:
  const Options& o_;
  MetricsWriter& metrics_;
  std::optional<CheckpointDir> dir_;
};

// When the ring's loop writes: every --checkpoint-every steps, every --checkpoint-secs, and
// under local SGD at the first parameter average after a write fell due (the chief's replica
// is the job's whole state only then).
class CheckpointSchedule {
 public:
  CheckpointSchedule(const Options& o, int64_t start_step)
      : every_(o.checkpoint_every), secs_(o.checkpoint_secs), last_step_(start_step) {}
  // Call once per step: whether a write is due after step `done`, where `replicas_equal` says
  // whether the replicas are identical now.
  bool due(int64_t done, bool replicas_equal);
  void written(int64_t done);
  int64_t last_written() const { return last_step_; }

 private:
  int64_t every_;
  double secs_;
  int64_t last_step_;
  std::chrono::steady_clock::time_point last_time_ = std::chrono::steady_clock::now();
  bool pending_ = false;
};

}  // namespace ringtrain::app
