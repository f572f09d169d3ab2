// The ring allreduce over the thread transport: ranks are threads, so the algorithm is swept
// over world sizes 1..16 and awkward counts without mpirun (tests/mpi_ring_test.cpp runs the
// same checks over MPI).
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>

#include <catch2/catch.hpp>

#include "ringtrain/ring.h"
#include "support/thread_comm.h"

using namespace ringtrain;

namespace {

// Integer-valued inputs, so every partial sum is exact and the expected value is closed-form.
float integer_input(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}
float integer_sum(int ranks, size_t i) {
  return static_cast<float>(ranks * (ranks + 1) / 2 * static_cast<int>(i % 13 + 1));
}

// Runs ring_allreduce on `ranks` threads over inputs from `input(rank, i)` and returns every
// rank's result.
template <typename Input>
std::vector<std::vector<float>> run_allreduce(int ranks, size_t count, ReduceOp op, Input input,
                                              const RingOptions& options = {}) {
  std::vector<std::vector<float>> results(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](Comm& comm) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = input(comm.rank(), i);
    RingScratch scratch;
    ring_allreduce(comm, data.data(), count, op, scratch, options);
    results[static_cast<size_t>(comm.rank())] = std::move(data);
  });
  return results;
}

bool all_identical(const std::vector<std::vector<float>>& results) {
  for (const auto& r : results) {
    if (r.size() != results[0].size() ||
        std::memcmp(r.data(), results[0].data(), r.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

std::vector<size_t> sweep_counts(int ranks) {
  const auto n = static_cast<size_t>(ranks);
  return {0, 1, n - 1, n + 1, 1009, (size_t{1} << 20) + 3};
}

}  // namespace

TEST_CASE("ring_chunk splits any count into N contiguous chunks, the first count % N longer",
          "[ring]") {
  for (int ranks = 1; ranks <= 16; ++ranks) {
    for (size_t count : sweep_counts(ranks)) {
      size_t next = 0;
      for (int c = 0; c < ranks; ++c) {
        const ChunkRange chunk = ring_chunk(count, ranks, c);
        CHECK(chunk.begin == next);
        const size_t expected = count / static_cast<size_t>(ranks) +
                                (static_cast<size_t>(c) < count % static_cast<size_t>(ranks));
        CHECK(chunk.size == expected);
        next = chunk.begin + chunk.size;
      }
      CHECK(next == count);
    }
  }
  CHECK_THROWS_AS(ring_chunk(10, 3, 3), Error);
}

TEST_CASE("ring allreduce sums exactly for world sizes 1..16 and awkward counts", "[ring]") {
  for (int ranks = 1; ranks <= 16; ++ranks) {
    for (size_t count : sweep_counts(ranks)) {
      INFO(ranks << " ranks, " << count << " elements");
      const auto results = run_allreduce(ranks, count, ReduceOp::kSum, integer_input);
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += results[0][i] != integer_sum(ranks, i);
      CHECK(wrong == 0);
      CHECK(all_identical(results));
    }
  }
}

TEST_CASE("ring allreduce averages: the sum divided by N, the same bits on every rank", "[ring]") {
  for (int ranks : {1, 2, 3, 5, 7, 16}) {
    for (size_t count : sweep_counts(ranks)) {
      INFO(ranks << " ranks, " << count << " elements");
      const auto results = run_allreduce(ranks, count, ReduceOp::kAvg, integer_input);
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        wrong += results[0][i] != integer_sum(ranks, i) / static_cast<float>(ranks);
      }
      CHECK(wrong == 0);
      CHECK(all_identical(results));
    }
  }
}

TEST_CASE("ring allreduce of random floats is within rounding of a double-precision sum",
          "[ring]") {
  const auto random_input = [](int rank, size_t i) {
    std::mt19937 rng(static_cast<uint32_t>(rank * 7919 + 17));
    rng.discard(i % 64);  // cheap per-element variety without a table
    return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng) * static_cast<float>(i % 31 + 1);
  };
  for (int ranks : {2, 3, 4, 8, 13}) {
    const size_t count = 10007;
    const auto results = run_allreduce(ranks, count, ReduceOp::kSum, random_input);
    double worst = 0.0;
    for (size_t i = 0; i < count; ++i) {
      double exact = 0.0, magnitude = 0.0;
      for (int r = 0; r < ranks; ++r) {
        exact += static_cast<double>(random_input(r, i));
        magnitude += std::fabs(static_cast<double>(random_input(r, i)));
      }
      // N-1 float additions: each adds at most one rounding of half an ulp of the running sum.
      const double bound = static_cast<double>(ranks) * 0x1.0p-24 * magnitude;
      worst = std::max(worst, std::fabs(static_cast<double>(results[0][i]) - exact) / bound);
    }
    INFO(ranks << " ranks: worst error / bound = " << worst);
    CHECK(worst <= 1.0);
    CHECK(all_identical(results));
  }
}

TEST_CASE("the ring's bits do not depend on segment size or window, and repeat exactly", "[ring]") {
  const auto input = [](int rank, size_t i) {
    return std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(rank)) * 1e3f;
  };
  const size_t count = 5003;
  const auto reference = run_allreduce(5, count, ReduceOp::kAvg, input);
  CHECK(all_identical(reference));
  for (const RingOptions options : {RingOptions{1, 1}, RingOptions{3, 2}, RingOptions{64, 5},
                                    RingOptions{100000, 1}, RingOptions{}}) {
    INFO("segment " << options.segment_elements << ", window " << options.window);
    const auto results = run_allreduce(5, count, ReduceOp::kAvg, input, options);
    CHECK(std::memcmp(results[0].data(), reference[0].data(), count * sizeof(float)) == 0);
  }
  CHECK_THROWS_AS(run_allreduce(2, 10, ReduceOp::kSum, input, RingOptions{0, 1}), Error);
}

TEST_CASE("after scatter-reduce rank r holds the full sum of chunk (r + 1) mod N", "[ring]") {
  for (int ranks : {2, 3, 6}) {
    const size_t count = 100;
    std::mutex mutex;
    size_t wrong = 0;
    run_ranks(ranks, [&](Comm& comm) {
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = integer_input(comm.rank(), i);
      RingScratch scratch;
      ring_reduce_scatter(comm, data.data(), count, scratch);
      const ChunkRange owned = ring_chunk(count, ranks, (comm.rank() + 1) % ranks);
      size_t local_wrong = 0;
      for (size_t i = owned.begin; i < owned.begin + owned.size; ++i) {
        local_wrong += data[i] != integer_sum(ranks, i);
      }
      std::lock_guard lock(mutex);
      wrong += local_wrong;
    });
    CHECK(wrong == 0);
  }
}

TEST_CASE("the ring and the library allreduce agree on exact inputs", "[ring]") {
  for (int ranks : {1, 2, 4, 7}) {
    const size_t count = 3001;
    std::vector<std::vector<float>> ring(static_cast<size_t>(ranks)), library(ring.size());
    run_ranks(ranks, [&](Comm& comm) {
      std::vector<float> a(count), b(count);
      for (size_t i = 0; i < count; ++i) a[i] = b[i] = integer_input(comm.rank(), i);
      RingScratch scratch;
      ring_allreduce(comm, a.data(), count, ReduceOp::kSum, scratch);
      comm.allreduce_library(b.data(), count, ReduceOp::kSum);
      ring[static_cast<size_t>(comm.rank())] = a;
      library[static_cast<size_t>(comm.rank())] = b;
    });
    CHECK(ring == library);
  }
}
