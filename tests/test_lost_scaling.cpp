// The lost-scaling account (apps/mnist_train/lost_scaling.h): which part of a step's wait was
// the slowest rank and which the wire, who was last, and the bandwidth figures. Pure
// arithmetic on given step figures, so every expectation is exact; the end-to-end checks
// (a delayed rank, a slowed transport) are in tests/lost_scaling_test.sh.
#include <vector>

#include <catch2/catch.hpp>

#include "lost_scaling.h"
#include "support/thread_comm.h"

using namespace ringtrain;
using namespace ringtrain::app;

TEST_CASE("lost scaling: the wait is the slowest rank's lead, the rest of the exposure is the wire",
          "[lost_scaling]") {
  // Rank 0 of 3; rank 2 computes 30 ms longer. Rank 0 waited 35 ms: 30 for rank 2, 5 on the wire.
  LostScaling lost(0, 3, 4'000'000);
  lost.add(std::vector<double>{10.0, 12.0, 40.0}, 35.0, 38.0);
  CHECK(lost.steps() == 1);
  CHECK(lost.mean_wait_ms() == 30.0);
  CHECK(lost.mean_exposed_ms() == 5.0);
  CHECK(lost.mean_comm_ms() == 8.0);  // the allreduces' 38 ms, less the 30 spent waiting
  CHECK(lost.slowest_rank() == 2);
  CHECK(lost.slowest_share() == 1.0);
  // A step where rank 1 is last by 2 ms and the wire adds 4.
  lost.add(std::vector<double>{10.0, 12.0, 9.0}, 6.0, 6.0);
  CHECK(lost.mean_wait_ms() == 16.0);    // (30 + 2) / 2
  CHECK(lost.mean_exposed_ms() == 4.5);  // (5 + 4) / 2
  CHECK(lost.slowest_rank() == 1);       // 2 was last once, 1 once: the lowest on a tie
}

TEST_CASE("lost scaling: the slowest rank is the one last most often", "[lost_scaling]") {
  LostScaling lost(1, 4, 1000);
  for (int step = 0; step < 10; ++step) {
    std::vector<double> compute = {5.0, 5.0, 5.0, 5.0};
    compute[step < 7 ? 3 : 0] = 9.0;  // rank 3 last in 7 of 10 steps, rank 0 in 3
    lost.add(compute, 4.0, 4.0);
  }
  CHECK(lost.slowest_rank() == 3);
  CHECK(lost.slowest_share() == Approx(0.7));
  CHECK(lost.mean_wait_ms() == 4.0);
  CHECK(lost.mean_exposed_ms() == 0.0);
  const LostScaling::Window window = lost.take_window();
  CHECK(window.steps == 10);
  CHECK(window.slowest_rank == 3);
  CHECK(lost.take_window().steps == 0);  // a window starts anew
}

TEST_CASE("lost scaling: a wait is never more than the time the rank waited", "[lost_scaling]") {
  // Rank 1 is 20 ms behind, but rank 0 waited only 3 ms: the rest of the lead was hidden (its
  // allreduce started late for its own reasons, or the skew fell outside the wait).
  LostScaling lost(0, 2, 1000);
  lost.add(std::vector<double>{10.0, 30.0}, 3.0, 3.0);
  CHECK(lost.mean_wait_ms() == 3.0);
  CHECK(lost.mean_exposed_ms() == 0.0);
  CHECK(lost.mean_comm_ms() == 0.0);
  // The slowest rank itself never waits for anyone.
  LostScaling slow(1, 2, 1000);
  slow.add(std::vector<double>{10.0, 30.0}, 2.0, 2.0);
  CHECK(slow.mean_wait_ms() == 0.0);
  CHECK(slow.mean_exposed_ms() == 2.0);
}

TEST_CASE("lost scaling: bus bandwidth is nccl-tests' 2 (N-1)/N x bytes / time", "[lost_scaling]") {
  CHECK(bus_bandwidth_gbps(1'000'000'000, 2, 1000.0) == Approx(1.0));
  CHECK(bus_bandwidth_gbps(1'000'000'000, 4, 1000.0) == Approx(1.5));
  CHECK(bus_bandwidth_gbps(1'000'000'000, 1, 1000.0) == 0.0);
  CHECK(bus_bandwidth_gbps(1000, 2, 0.0) == 0.0);
  LostScaling lost(0, 2, 8'000'000);
  lost.add(std::vector<double>{1.0, 1.0}, 0.5, 8.0);
  CHECK(lost.achieved_busbw_gbps() == Approx(1.0));  // 8 MB in 8 ms, x 2 (1)/2
}

TEST_CASE("lost scaling: the reference times every bucket size alone, on every rank alike",
          "[lost_scaling]") {
  // Over thread ranks with a slowed transport: each run() sleeps 5 ms, so one step's three
  // buckets take at least 15 ms alone (whatever the machine; the sleep is a lower bound).
  std::vector<double> results(2);
  run_ranks(2, [&](Comm& comm) {
    const auto allreduce = make_allreduce(comm, AllreduceConfig{.test_delay_ms = 5.0}, Context{});
    const std::vector<Bucket> buckets = {{0, 100}, {100, 1100}, {1100, 2100}};
    results[static_cast<size_t>(comm.rank())] = time_buckets_alone(comm, *allreduce, buckets);
  });
  CHECK(results[0] >= 15.0);
  CHECK(results[0] == results[1]);  // the slowest rank's time, the same on every rank
}
