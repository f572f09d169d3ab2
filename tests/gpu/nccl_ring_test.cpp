// The NCCL transport under mpirun, one GPU per rank: the device ring (ring_allreduce_device
// over NcclComm) and ncclAllReduce (NcclComm::allreduce_library) against the closed form, for
// several sizes (non-divisible ones included), segment sizes and windows, sum and avg; the same
// bits on every rank; both against each other on random inputs; several allreduces queued
// back to back with one synchronize() at the end (no host sync inside a step); broadcast from
// every root, allgather and barrier on device buffers.
//
// Exits 77 with "SKIPPED: why" when some node has more ranks than visible GPUs (NCCL refuses
// two ranks on one device; the host-staged path has its own test in test_nccl_staged.cpp).
// With --expect-timeout (2 ranks): rank 0 sends to a rank 1 that never receives; rank 0's
// synchronize() must abort the communicator and throw after RINGTRAIN_COMM_TIMEOUT_S.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ringtrain/cuda_check.h"
#include "ringtrain/gpu.h"
#include "ringtrain/mpi_comm.h"
#include "ringtrain/nccl_comm.h"
#include "ringtrain/staged_ring.h"

using namespace ringtrain;

namespace {

int failures = 0;

void fail(const MpiComm& host, const std::string& what) {
  ++failures;
  std::printf("FAIL (rank %d): %s\n", host.rank(), what.c_str());
  std::fflush(stdout);
}

// A device buffer of floats, freed at scope end.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t count) {
    RINGTRAIN_CHECK_CUDA(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(float)));
  }
  ~DeviceFloats() { cudaFree(data_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return data_; }

 private:
  float* data_ = nullptr;
};

// Copies on the comm stream (non-blocking: a plain cudaMemcpy would not be ordered with it).
void upload(NcclComm& comm, float* device, const std::vector<float>& host) {
  if (host.empty()) return;
  RINGTRAIN_CHECK_CUDA(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float),
                                       cudaMemcpyHostToDevice, comm.stream()));
}
std::vector<float> download(NcclComm& comm, const float* device, size_t count) {
  std::vector<float> host(count);
  if (count > 0) {
    RINGTRAIN_CHECK_CUDA(cudaMemcpyAsync(host.data(), device, count * sizeof(float),
                                         cudaMemcpyDeviceToHost, comm.stream()));
  }
  comm.synchronize();
  return host;
}

// (rank + 1) * (i % 97 + 1): integers, every partial sum exact.
std::vector<float> pattern(size_t count, int rank) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 97 + 1));
  return v;
}
std::vector<float> random_values(size_t count, int rank) {
  std::vector<float> v(count);
  uint64_t x = 0x1234567ull + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1 << 23) - 1.0);
  }
  return v;
}

int64_t ordered_bits(float value) {
  const auto bits = std::bit_cast<int32_t>(value);
  return bits >= 0 ? int64_t{bits} : -int64_t{bits & 0x7fffffff};
}

// Elements off the closed form of `times` chained allreduces of pattern() by more than `ulps`.
size_t mismatches(const std::vector<float>& got, int ranks, ReduceOp op, int times, int64_t ulps) {
  const double rank_sum = static_cast<double>(ranks) * (ranks + 1) / 2.0;
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    float want = static_cast<float>(static_cast<double>(i % 97 + 1) * rank_sum);
    if (op == ReduceOp::kAvg) want /= static_cast<float>(ranks);
    for (int t = 1; t < times; ++t)
      want = op == ReduceOp::kSum ? want * static_cast<float>(ranks) : want;
    if (!std::isfinite(got[i]) || std::abs(ordered_bits(got[i]) - ordered_bits(want)) > ulps)
      ++wrong;
  }
  return wrong;
}

bool same_bits_everywhere(MpiComm& host, const std::vector<float>& values) {
  const auto hashes =
      allgather_value(host, hash_bytes(values.data(), values.size() * sizeof(float)));
  return std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return h == hashes[0]; });
}

void check_sizes(MpiComm& host, NcclComm& comm) {
  const int n = comm.size();
  const auto ranks = static_cast<size_t>(n);
  std::vector<size_t> counts = {
      0, 1, ranks + 1, 1009, 65536, (size_t{1} << 20) + 3, (size_t{3} << 20) + 7};
  if (n > 1) counts.push_back(ranks - 1);
  DeviceFloats buffer(counts.size() > 0 ? *std::max_element(counts.begin(), counts.end()) : 1);
  DeviceRingScratch scratch;
  for (size_t count : counts) {
    std::vector<RingOptions> options = {
        {}, {.segment_elements = 1000, .window = 2}, {.segment_elements = 4096, .window = 1}};
    if (count <= 1009) options.push_back({.segment_elements = 1, .window = 3});
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (const RingOptions& option : options) {
        const std::string what =
            fmt::format("ring {} of {} floats, segment {}, window {}", to_string(op), count,
                        option.segment_elements, option.window);
        upload(comm, buffer.get(), pattern(count, comm.rank()));
        ring_allreduce_device(comm, buffer.get(), count, op, scratch, option);
        const auto ring = download(comm, buffer.get(), count);
        // gpu::divide is an IEEE division: the ring's average of integers is exact as well.
        if (const size_t wrong = mismatches(ring, n, op, 1, 0); wrong > 0)
          fail(host, fmt::format("{}: {} element(s) off the closed form", what, wrong));
        if (!same_bits_everywhere(host, ring)) fail(host, what + ": ranks hold different bits");
      }
      const std::string what = fmt::format("ncclAllReduce {} of {} floats", to_string(op), count);
      upload(comm, buffer.get(), pattern(count, comm.rank()));
      comm.allreduce_library(buffer.get(), count, op);
      const auto nccl = download(comm, buffer.get(), count);
      // ncclAvg may scale before summing: allow a few ulps there, none for sums of integers.
      const int64_t ulps = op == ReduceOp::kSum ? 0 : n + 1;
      if (const size_t wrong = mismatches(nccl, n, op, 1, ulps); wrong > 0)
        fail(host, fmt::format("{}: {} element(s) off the closed form", what, wrong));
      if (!same_bits_everywhere(host, nccl)) fail(host, what + ": ranks hold different bits");
    }
  }
}

void check_random(MpiComm& host, NcclComm& comm) {
  const int n = comm.size();
  for (size_t count : {size_t{1009}, (size_t{1} << 20) + 3}) {
    DeviceFloats buffer(count);
    DeviceRingScratch scratch;
    const auto input = random_values(count, comm.rank());
    upload(comm, buffer.get(), input);
    ring_allreduce_device(comm, buffer.get(), count, ReduceOp::kSum, scratch);
    const auto ring = download(comm, buffer.get(), count);
    upload(comm, buffer.get(), input);
    comm.allreduce_library(buffer.get(), count, ReduceOp::kSum);
    const auto nccl = download(comm, buffer.get(), count);
    // Both are float sums of n values in [-1, 1) in some order: each within (n-1) eps n of
    // the exact sum, so within twice that of each other.
    const double bound = 2.0 * (n - 1) * n * 1.2e-7 + 1e-30;
    size_t far = 0;
    for (size_t i = 0; i < count; ++i)
      far += std::abs(static_cast<double>(ring[i]) - nccl[i]) > bound ? 1 : 0;
    if (far > 0)
      fail(host, fmt::format("random sum of {} floats: ring and ncclAllReduce differ by more "
                             "than {:g} at {} element(s)",
                             count, bound, far));
    if (!same_bits_everywhere(host, ring))
      fail(host, fmt::format("random ring sum of {} floats: ranks hold different bits", count));
  }
}

// Ring, NCCL, ring queued back to back, one synchronize at the end: stream order alone must
// keep them apart (the training step's pattern: no host sync inside the step).
void check_queued(MpiComm& host, NcclComm& comm) {
  const int n = comm.size();
  const size_t count = (size_t{1} << 19) + 5;
  DeviceFloats buffer(count);
  DeviceRingScratch scratch;
  scratch.reserve(count, n);
  upload(comm, buffer.get(), pattern(count, comm.rank()));
  ring_allreduce_device(comm, buffer.get(), count, ReduceOp::kSum, scratch);
  comm.allreduce_library(buffer.get(), count, ReduceOp::kSum);
  ring_allreduce_device(comm, buffer.get(), count, ReduceOp::kSum, scratch);
  const auto got = download(comm, buffer.get(), count);
  if (const size_t wrong = mismatches(got, n, ReduceOp::kSum, 3, 0); wrong > 0)
    fail(host, fmt::format("ring, nccl, ring queued: {} element(s) off the closed form", wrong));
}

void check_collectives(MpiComm& host, NcclComm& comm) {
  const int n = comm.size();
  const size_t count = 1001;
  DeviceFloats buffer(count);
  for (int root = 0; root < n; ++root) {
    upload(comm, buffer.get(), pattern(count, comm.rank()));
    comm.broadcast(buffer.get(), count * sizeof(float), root);
    if (download(comm, buffer.get(), count) != pattern(count, root))
      fail(host, fmt::format("broadcast from rank {}: wrong bytes", root));
  }
  const size_t each = 3;
  DeviceFloats mine(each), all(each * static_cast<size_t>(n));
  const std::vector<float> contribution = {static_cast<float>(comm.rank()) + 0.5f, -1.0f, 7.0f};
  upload(comm, mine.get(), contribution);
  comm.allgather(mine.get(), all.get(), each * sizeof(float));
  const auto gathered = download(comm, all.get(), each * static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (gathered[static_cast<size_t>(r) * each] != static_cast<float>(r) + 0.5f)
      fail(host, fmt::format("allgather: rank {}'s part is wrong", r));
  }
  comm.barrier();
}

int expect_timeout(MpiComm& host, NcclComm& comm) {
  if (comm.size() != 2) {
    if (host.rank() == 0) std::printf("--expect-timeout needs exactly 2 ranks\n");
    return 2;
  }
  // First a matched exchange: NCCL connects a pair of ranks in the first group between them,
  // on the host (ncclGroupEnd), which needs both; after that, an unmatched receive blocks only
  // the stream, which is what synchronize()'s deadline is for.
  DeviceFloats buffer(1024);
  const int peer = 1 - comm.rank();
  CommRequest out = comm.isend(buffer.get(), 512, peer, 0);
  CommRequest in = comm.irecv(buffer.get() + 512, 512, peer, 0);
  comm.wait(out);
  comm.wait(in);
  comm.synchronize();
  int result = 0;
  if (comm.rank() == 0) {
    // A receive (a small send may complete into NCCL's buffers without the peer) that rank 1
    // never matches.
    CommRequest recv = comm.irecv(buffer.get(), 1024, 1, 0);
    comm.wait(recv);  // launches the group; returns at once
    try {
      comm.synchronize();
      std::printf("FAIL: synchronize() returned although rank 1 never received\n");
      result = 1;
    } catch (const Error& error) {
      const std::string message = error.what();
      const bool ok = message.find("no progress for") != std::string::npos &&
                      message.find("aborted") != std::string::npos && comm.aborted();
      std::printf("%s timeout: %s\n", ok ? "expected" : "FAIL: unexpected", message.c_str());
      result = ok ? 0 : 1;
    }
  }
  host.barrier();  // rank 1 waits here, over MPI, until rank 0 has given up
  if (comm.rank() == 1) comm.abort();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);
  MpiComm host;
  const bool timeout_mode = argc > 1 && std::strcmp(argv[1], "--expect-timeout") == 0;
  std::string why;
  const int gpus = visible_gpus(&why);
  if (ranks_share_a_gpu(host, gpus)) {
    if (host.rank() == 0) {
      std::printf(
          "SKIPPED: %d rank(s) on this node but %d visible GPU(s)%s%s; the NCCL tests need "
          "one GPU per rank (NCCL refuses two ranks on one device)\n",
          host.local_size(), gpus, why.empty() ? "" : ": ", why.c_str());
    }
    return 77;
  }
  int result = 0;
  try {
    NcclComm comm(host, {.timeout_s = host.timeout()});
    if (timeout_mode) {
      result = expect_timeout(host, comm);
    } else {
      check_sizes(host, comm);
      check_random(host, comm);
      check_queued(host, comm);
      check_collectives(host, comm);
      const auto all = allgather_value(host, failures);
      int total = 0;
      for (int f : all) total += f;
      if (host.rank() == 0) {
        if (total == 0)
          std::printf("nccl_ring_test: all checks passed on %d rank(s)\n", host.size());
        else
          std::printf("nccl_ring_test: %d failure(s)\n", total);
      }
      result = total == 0 ? 0 : 1;
    }
  } catch (const std::exception& error) {
    std::printf("FAIL (rank %d): %s\n", host.rank(), error.what());
    MpiSession::abort_job(1);
  }
  return result;
}
