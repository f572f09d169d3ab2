// The NaN guard (see finite_guard.h).
#include "finite_guard.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "ringtrain/check.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

namespace {
bool all_finite(std::span<const float> values) {
  bool finite = true;
  for (const float v : values) finite &= std::isfinite(v);  // branch-free: the loop vectorises
  return finite;
}
}  // namespace

FiniteGuard::FiniteGuard(const Options& o, Comm& comm)
    : o_(o), comm_(comm), flags_(static_cast<size_t>(comm.size())) {}

BeforeUpdateFn FiniteGuard::hook() {
  if (!o_.check_finite) return {};
  return
      [this](const StepStats& stats, std::span<const float> grads) { return check(stats, grads); };
}

bool FiniteGuard::check(const StepStats& stats, std::span<const float> grads) {
  // Bit 0: this rank's loss; bit 1: the averaged gradients (the same on every rank).
  // A device step counts the non-finite gradients on the GPU (grads is then empty).
  const bool grads_finite = stats.grads_finite ? *stats.grads_finite : all_finite(grads);
  const uint8_t bad =
      static_cast<uint8_t>((std::isfinite(stats.loss) ? 0 : 1) | (grads_finite ? 0 : 2));
  {
    const PhaseScope phase(comm_.board(), "finite check");
    comm_.allgather(&bad, flags_.data(), sizeof(bad));
  }
  std::string bad_ranks;
  bool any = false;
  for (int r = 0; r < comm_.size(); ++r) {
    const uint8_t flag = flags_[static_cast<size_t>(r)];
    any |= flag != 0;
    if (flag & 1) bad_ranks += fmt::format("{}{}", bad_ranks.empty() ? "" : ", ", r);
  }
  if (!any) {
    bad_in_a_row_ = 0;
    return true;
  }
  bad_ranks = bad_ranks.empty() ? "the averaged gradients"
                                : fmt::format("the loss on rank(s) {}", bad_ranks);
  ++bad_in_a_row_;
  ++skipped_;
  if (bad_in_a_row_ >= o_.max_bad_steps) {
    throw Error(fmt::format("--check-finite: {} steps in a row (the last, step {}) had NaN "
                            "or Inf ({}); stopping. Lower --lr or check the data; the "
                            "checkpoints already written are unaffected",
                            bad_in_a_row_, step_, bad_ranks),
                ExitCode::kNonFinite, /*on_every_rank=*/true);
  }
  if (comm_.rank() == 0)
    spdlog::warn(
        "step {}: NaN or Inf in {}; the update is skipped on every rank ({} in a "
        "row; the job stops at {})",
        step_, bad_ranks, bad_in_a_row_, o_.max_bad_steps);
  return false;
}

}  // namespace ringtrain::app
