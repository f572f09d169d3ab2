// The ring allreduce under mpirun (registered with ctest for np = 1..5): exact sums and
// averages against closed forms, random floats against a double-precision reference, the same
// bits on every rank and on every repetition, agreement with MPI_Allreduce, and broadcast
// from every root. Any failed check prints the rank and ends the whole job with exit code 1.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ringtrain/mpi_comm.h"
#include "ringtrain/ring.h"

using namespace ringtrain;

namespace {

int g_rank = 0;

#define EXPECT(cond, ...)                                                                        \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "rank %d: %s:%d: check failed: %s: %s\n", g_rank, __FILE__, __LINE__, \
                   #cond, fmt::format(__VA_ARGS__).c_str());                                     \
      MpiSession::abort_job(1);                                                                  \
    }                                                                                            \
  } while (0)

// Every rank holds the same bits.
void expect_identical(Comm& comm, const std::vector<float>& data, const char* what) {
  const auto hashes = allgather_value(comm, hash_bytes(data.data(), data.size() * sizeof(float)));
  for (int r = 0; r < comm.size(); ++r) {
    EXPECT(hashes[static_cast<size_t>(r)] == hashes[0], "{}: rank {} differs from rank 0", what, r);
  }
}

float integer_input(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}

float random_input(int rank, size_t i) {
  // A counter-based value: any rank can compute any other rank's input for the reference.
  uint64_t z = (static_cast<uint64_t>(rank) << 40) ^ (i * 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) * 0x1.0p-24 * 2.0 - 1.0);
}

void check_exact(Comm& comm, size_t count, ReduceOp op, RingScratch& scratch) {
  const int n = comm.size();
  std::vector<float> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = integer_input(comm.rank(), i);
  ring_allreduce(comm, data.data(), count, op, scratch);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const auto sum = static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 13 + 1));
    const float expected = op == ReduceOp::kSum ? sum : sum / static_cast<float>(n);
    wrong += data[i] != expected;
  }
  EXPECT(wrong == 0, "{} of {} elements wrong ({}, {} ranks)", wrong, count, to_string(op), n);
  expect_identical(comm, data, "exact inputs");
}

void check_random(Comm& comm, size_t count, RingScratch& scratch) {
  const int n = comm.size();
  std::vector<float> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = random_input(comm.rank(), i);
  std::vector<float> first = data;
  ring_allreduce(comm, first.data(), count, ReduceOp::kSum, scratch);
  for (size_t i = 0; i < count; ++i) {
    double exact = 0.0, magnitude = 0.0;
    for (int r = 0; r < n; ++r) {
      exact += random_input(r, i);
      magnitude += std::fabs(random_input(r, i));
    }
    const double bound = n * 0x1.0p-24 * magnitude;
    EXPECT(std::fabs(first[i] - exact) <= bound, "element {}: {} vs {} (bound {})", i, first[i],
           exact, bound);
  }
  expect_identical(comm, first, "random inputs");
  // The same inputs again: the same bits.
  std::vector<float> second = data;
  ring_allreduce(comm, second.data(), count, ReduceOp::kSum, scratch);
  EXPECT(std::memcmp(first.data(), second.data(), count * sizeof(float)) == 0,
         "a repeated allreduce of {} elements gave other bits", count);
}

void check_against_library(Comm& comm, size_t count, RingScratch& scratch) {
  std::vector<float> ring(count), library(count);
  for (size_t i = 0; i < count; ++i) ring[i] = library[i] = integer_input(comm.rank(), i);
  ring_allreduce(comm, ring.data(), count, ReduceOp::kSum, scratch);
  comm.allreduce_library(library.data(), count, ReduceOp::kSum);
  EXPECT(ring == library, "ring and MPI_Allreduce disagree on {} elements", count);
}

void check_broadcast(Comm& comm) {
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<float> values(1000, -1.0f);
    if (comm.rank() == root) {
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(root * 1000 + i);
    }
    broadcast_values(comm, values, root);
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT(values[i] == static_cast<float>(root * 1000 + i), "broadcast from {}: element {}",
             root, i);
    }
  }
  const auto ranks = allgather_value(comm, comm.rank() * 10);
  for (int r = 0; r < comm.size(); ++r)
    EXPECT(ranks[static_cast<size_t>(r)] == r * 10, "allgather");
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);
  try {
    MpiComm comm;
    g_rank = comm.rank();
    const auto n = static_cast<size_t>(comm.size());
    RingScratch scratch;  // one for all sizes: reused, as in training
    for (size_t count : {size_t{0}, size_t{1}, n - 1, n + 1, size_t{1009}, (size_t{1} << 20) + 3}) {
      check_exact(comm, count, ReduceOp::kSum, scratch);
      check_exact(comm, count, ReduceOp::kAvg, scratch);
    }
    check_random(comm, 100003, scratch);
    check_against_library(comm, 65537, scratch);
    check_broadcast(comm);
    comm.barrier();
    if (comm.rank() == 0) std::printf("mpi_ring_test: all checks passed on %zu ranks\n", n);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, error.what());
    MpiSession::abort_job(1);
  }
  return 0;
}
