// The injected failures (see test_faults.h).
#include "test_faults.h"

#include <chrono>
#include <thread>

#include "ringtrain/check.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

void stall_for_test(const Options& o, int rank, const std::string& where) {
  if (rank != o.test_stall_rank) return;
  spdlog::warn("--test-stall-rank: rank {} stalls for {:g} s {}", rank, o.test_stall_seconds,
               where);
  std::this_thread::sleep_for(std::chrono::duration<double>(o.test_stall_seconds));
}

void inject_test_failures(const Options& o, int rank, int64_t step) {
  if (rank == o.test_fail_rank && step == o.test_fail_at_step)
    RINGTRAIN_FAIL("--test-fail-rank: rank {} fails on purpose at step {}", rank, step);
  if (step == o.test_stall_at_step) stall_for_test(o, rank, fmt::format("at step {}", step));
  if (rank == o.test_slow_rank)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.test_slow_ms));
}

}  // namespace ringtrain::app
