// The lost-scaling account (see lost_scaling.h).
#include "lost_scaling.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "ringtrain/check.h"
#include "ringtrain/report.h"

namespace ringtrain::app {

LostScaling::LostScaling(int rank, int ranks, int64_t gradient_bytes)
    : rank_(rank),
      ranks_(ranks),
      gradient_bytes_(gradient_bytes),
      last_counts_(static_cast<size_t>(ranks)),
      window_last_counts_(static_cast<size_t>(ranks)) {
  RINGTRAIN_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {}", rank, ranks);
}

void LostScaling::add(std::span<const double> compute_ms, double exposed_ms, double comm_ms) {
  RINGTRAIN_CHECK(compute_ms.size() == static_cast<size_t>(ranks_), "{} compute times for {} ranks",
                  compute_ms.size(), ranks_);
  const auto slowest = std::max_element(compute_ms.begin(), compute_ms.end());
  const auto last = static_cast<size_t>(slowest - compute_ms.begin());
  const double wait = *slowest - compute_ms[static_cast<size_t>(rank_)];
  // The wait cannot be longer than the time this rank waited at all: the rest of the skew was
  // hidden behind its own optimizer step or the next step's data.
  const double waited = std::clamp(wait, 0.0, std::max(exposed_ms, 0.0));
  ++steps_;
  wait_ms_ += waited;
  exposed_ms_ += std::max(exposed_ms, 0.0) - waited;
  comm_ms_ += std::max(comm_ms - waited, 0.0);
  ++last_counts_[last];
  ++window_.steps;
  window_.wait_ms += waited;
  window_.exposed_ms += std::max(exposed_ms, 0.0) - waited;
  ++window_last_counts_[last];
}

int LostScaling::slowest_rank() const {
  if (steps_ == 0) return -1;
  return static_cast<int>(std::max_element(last_counts_.begin(), last_counts_.end()) -
                          last_counts_.begin());
}

double LostScaling::slowest_share() const {
  if (steps_ == 0) return 0.0;
  return static_cast<double>(last_counts_[static_cast<size_t>(slowest_rank())]) /
         static_cast<double>(steps_);
}

double LostScaling::achieved_busbw_gbps() const {
  return bus_bandwidth_gbps(gradient_bytes_, ranks_, mean_comm_ms());
}

LostScaling::Window LostScaling::take_window() {
  Window result = window_;
  if (result.steps > 0) {
    const auto n = static_cast<double>(result.steps);
    result.wait_ms /= n;
    result.exposed_ms /= n;
    result.slowest_rank =
        static_cast<int>(std::max_element(window_last_counts_.begin(), window_last_counts_.end()) -
                         window_last_counts_.begin());
  }
  window_ = {};
  std::fill(window_last_counts_.begin(), window_last_counts_.end(), 0);
  return result;
}

double bus_bandwidth_gbps(int64_t bytes, int ranks, double ms) {
  if (ms <= 0.0 || ranks < 2) return 0.0;
  const double algbw = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  return algbw * 2.0 * (ranks - 1) / ranks;
}

double time_buckets_alone(Comm& comm, Allreduce& allreduce, const std::vector<Bucket>& buckets) {
  if (device_of(allreduce.kind()) != Device::kCpu || allreduce.kind() == AllreduceKind::kExactRing)
    return 0.0;
  // allreduce_bench's defaults, scaled down: start-up should not notice it.
  constexpr int kWarmup = 2, kIterations = 3, kRepeats = 3;
  std::map<int64_t, int64_t> sizes;  // elements -> buckets of that size
  for (const Bucket& bucket : buckets) ++sizes[bucket.size()];
  int64_t largest = 0;
  for (const auto& [elements, count] : sizes) largest = std::max(largest, elements);
  std::vector<float> scratch(static_cast<size_t>(largest), 1.0f);
  double total_ms = 0.0;
  for (const auto& [elements, count] : sizes) {
    const auto n = static_cast<size_t>(elements);
    for (int i = 0; i < kWarmup; ++i) allreduce.run(scratch.data(), n, ReduceOp::kAvg);
    std::vector<double> repeats;
    for (int repeat = 0; repeat < kRepeats; ++repeat) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kIterations; ++i) allreduce.run(scratch.data(), n, ReduceOp::kAvg);
      const double mine =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
          kIterations;
      std::vector<double> all(static_cast<size_t>(comm.size()));
      comm.allgather(&mine, all.data(), sizeof(double));
      repeats.push_back(*std::max_element(all.begin(), all.end()));
    }
    total_ms += median(repeats) * 1e3 * static_cast<double>(count);
  }
  return total_ms;
}

}  // namespace ringtrain::app
