// The NCCL transport's schedule and the host-staged path, without MPI:
//  - the device ring's calls, grouped by NcclComm's rule (P2pBatcher), replayed for every rank
//    and run through a model of NCCL's matching (sends and receives between a pair match in
//    issue order; a group completes once every op's partner is in the partner's current group):
//    neighbours' groups must match op for op, sizes included, and the model must never stall;
//  - the device ring over thread ranks with host-memory slots computes ring_allreduce's bits;
//  - the host-staged allreduce with ranks as threads sharing this process's GPU 0 (a single-GPU
//    machine suffices) gives the CPU ring's bits exactly, twice in a row on reused buffers;
//  - ranks_share_a_gpu.
// (The binary's main() skips everything when no GPU is visible; the first two need none and
// are pure host code.)
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/cuda_check.h"
#include "ringtrain/nccl_comm.h"
#include "ringtrain/ring.h"
#include "ringtrain/staged_ring.h"
#include "support/thread_comm.h"

using namespace ringtrain;

namespace {

// ---- the grouping replay ----

struct RecordedOp {
  bool send = false;
  int peer = -1;
  size_t count = 0;
};
using Group = std::vector<RecordedOp>;

// A Comm that only records: isend/irecv go into a P2pBatcher and wait() "launches" the batch
// exactly when NcclComm::wait would, appending it as one group. No data moves.
class RecorderComm final : public Comm {
 public:
  RecorderComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return size_; }
  std::string name() const override { return "recorder"; }
  CommRequest isend(const float* data, size_t n, int peer, int) override {
    return {
        batcher_.add({.send = true, .data = const_cast<float*>(data), .count = n, .peer = peer})};
  }
  CommRequest irecv(float* data, size_t n, int peer, int) override {
    return {batcher_.add({.send = false, .data = data, .count = n, .peer = peer})};
  }
  void wait(CommRequest& request) override {
    if (!request.active()) return;
    const int64_t id = request.id;
    request.id = -1;
    if (!batcher_.is_pending(id)) return;
    Group group;
    for (const auto& op : batcher_.pending())
      if (op.count > 0) group.push_back({op.send, op.peer, op.count});  // as NcclComm skips 0
    groups.push_back(std::move(group));
    batcher_.launched();
  }
  void add_inplace(float*, const float*, size_t) override {}
  void divide_inplace(float*, size_t, float) override {}
  void allreduce_library(float*, size_t, ReduceOp) override {}
  void broadcast(void*, size_t, int) override {}
  void allgather(const void*, void*, size_t) override {}
  void barrier() override {}
  bool has_pending() const { return batcher_.has_pending(); }

  std::vector<Group> groups;

 private:
  int rank_, size_;
  P2pBatcher batcher_;
};

// Returns "" when the ranks' groups match pairwise and the NCCL model runs them to completion,
// else what went wrong.
std::string simulate_nccl(const std::vector<std::vector<Group>>& ranks) {
  const int n = static_cast<int>(ranks.size());
  // Position of an op: (group, index in group).
  using Pos = std::pair<size_t, size_t>;
  std::map<std::pair<int, int>, std::vector<Pos>> sends, recvs;  // (src, dst) -> ops in order
  for (int r = 0; r < n; ++r) {
    for (size_t g = 0; g < ranks[r].size(); ++g) {
      for (size_t i = 0; i < ranks[r][g].size(); ++i) {
        const RecordedOp& op = ranks[r][g][i];
        if (op.send)
          sends[{r, op.peer}].push_back({g, i});
        else
          recvs[{op.peer, r}].push_back({g, i});
      }
    }
  }
  // partner[r][g][i] = (peer rank, group, index)
  std::vector<std::vector<std::vector<std::tuple<int, size_t, size_t>>>> partner(
      static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    partner[r].resize(ranks[r].size());
    for (size_t g = 0; g < ranks[r].size(); ++g) partner[r][g].resize(ranks[r][g].size());
  }
  std::map<std::pair<int, int>, bool> pairs;
  for (const auto& [key, list] : sends) pairs[key] = true;
  for (const auto& [key, list] : recvs) pairs[key] = true;
  for (const auto& [key, unused] : pairs) {
    const auto& s = sends[key];
    const auto& v = recvs[key];
    if (s.size() != v.size())
      return fmt::format("{} sends from rank {} to rank {} but {} receives", s.size(), key.first,
                         key.second, v.size());
    for (size_t k = 0; k < s.size(); ++k) {
      const RecordedOp& send = ranks[key.first][s[k].first][s[k].second];
      const RecordedOp& recv = ranks[key.second][v[k].first][v[k].second];
      if (send.count != recv.count)
        return fmt::format("transfer {} from rank {} to rank {}: {} floats sent, {} expected", k,
                           key.first, key.second, send.count, recv.count);
      partner[key.first][s[k].first][s[k].second] = {key.second, v[k].first, v[k].second};
      partner[key.second][v[k].first][v[k].second] = {key.first, s[k].first, s[k].second};
    }
  }
  std::vector<size_t> head(static_cast<size_t>(n), 0);
  std::vector<std::vector<std::vector<bool>>> done(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    done[r].resize(ranks[r].size());
    for (size_t g = 0; g < ranks[r].size(); ++g) done[r][g].assign(ranks[r][g].size(), false);
  }
  for (;;) {
    bool progress = false, finished = true;
    for (int r = 0; r < n; ++r) {
      if (head[r] >= ranks[r].size()) continue;
      finished = false;
      const size_t g = head[r];
      bool all = true;
      for (size_t i = 0; i < ranks[r][g].size(); ++i) {
        if (done[r][g][i]) continue;
        const auto [p, pg, pi] = partner[r][g][i];
        if (head[p] == pg) {
          done[r][g][i] = true;
          done[p][pg][pi] = true;
          progress = true;
        } else {
          all = false;
        }
      }
      if (all) {
        ++head[r];
        progress = true;
      }
    }
    if (finished) return "";
    if (!progress) {
      std::string where;
      for (int r = 0; r < n; ++r)
        where += fmt::format(" rank {} at group {}/{};", r, head[r], ranks[r].size());
      return "deadlock:" + where;
    }
  }
}

float integer_input(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}

float random_input(int rank, size_t i) {
  // A cheap hash to [-1, 1): reproducible, different per rank and index.
  uint64_t x = (static_cast<uint64_t>(rank) << 40) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1 << 23) - 1.0);
}

// A device buffer and a non-blocking stream on GPU 0, for one thread rank.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t count) {
    RINGTRAIN_CHECK_CUDA(cudaSetDevice(0));
    RINGTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const cudaError_t status = cudaMalloc(&data, std::max<size_t>(count, 1) * sizeof(float));
    if (status != cudaSuccess) cudaStreamDestroy(stream);
    RINGTRAIN_CHECK_CUDA(status);
  }
  ~DeviceBuffer() {
    cudaStreamSynchronize(stream);
    cudaFree(data);
    cudaStreamDestroy(stream);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* data = nullptr;
  cudaStream_t stream = nullptr;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The CPU ring's result on `ranks` thread ranks, applied `times` times in a row.
std::vector<std::vector<float>> cpu_ring(int ranks, size_t count, ReduceOp op, bool random,
                                         const RingOptions& options, int times = 1) {
  std::vector<std::vector<float>> results(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](Comm& comm) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i)
      data[i] = random ? random_input(comm.rank(), i) : integer_input(comm.rank(), i);
    RingScratch scratch;
    for (int t = 0; t < times; ++t) ring_allreduce(comm, data.data(), count, op, scratch, options);
    results[static_cast<size_t>(comm.rank())] = std::move(data);
  });
  return results;
}

}  // namespace

TEST_CASE("the device ring's NCCL groups match between neighbours and cannot deadlock",
          "[nccl][schedule]") {
  const std::vector<RingOptions> options = {
      {.segment_elements = 1, .window = 1},   {.segment_elements = 1, .window = 3},
      {.segment_elements = 7, .window = 2},   {.segment_elements = 64, .window = 4},
      {.segment_elements = 100, .window = 5}, {}};
  for (int ranks = 1; ranks <= 8; ++ranks) {
    const auto n = static_cast<size_t>(ranks);
    for (size_t count : {size_t{0}, size_t{1}, n - 1, n + 1, size_t{1009}, size_t{5000}}) {
      for (const RingOptions& option : options) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          std::vector<std::vector<Group>> groups;
          bool leftover = false;
          for (int r = 0; r < ranks; ++r) {
            RecorderComm comm(r, ranks);
            std::vector<float> data(count);
            DeviceRingScratch scratch(/*host_memory=*/true);
            ring_allreduce_device(comm, data.data(), count, op, scratch, option);
            leftover = leftover || comm.has_pending();
            groups.push_back(std::move(comm.groups));
          }
          INFO("ranks " << ranks << ", count " << count << ", segment " << option.segment_elements
                        << ", window " << option.window);
          CHECK_FALSE(leftover);
          CHECK(simulate_nccl(groups) == "");
          // Every group holds both directions' segments of one window (or one side's, at the
          // tail of an uneven step): never more than window sends and window receives.
          size_t oversized = 0;
          for (const auto& rank_groups : groups) {
            for (const Group& group : rank_groups) {
              size_t s = 0, v = 0;
              for (const RecordedOp& o : group) (o.send ? s : v) += 1;
              const auto window = static_cast<size_t>(option.window);
              oversized += s > window || v > window ? 1 : 0;
            }
          }
          CHECK(oversized == 0);
        }
      }
    }
  }
}

TEST_CASE("the replay model catches a batch of receives alone (the grouping it rules out)",
          "[nccl][schedule]") {
  // Two ranks, each launching its receive before its send as separate groups: a cycle.
  const std::vector<std::vector<Group>> split = {
      {{{false, 1, 4}}, {{true, 1, 4}}},
      {{{false, 0, 4}}, {{true, 0, 4}}},
  };
  CHECK(simulate_nccl(split).rfind("deadlock", 0) == 0);
  const std::vector<std::vector<Group>> grouped = {
      {{{false, 1, 4}, {true, 1, 4}}},
      {{{false, 0, 4}, {true, 0, 4}}},
  };
  CHECK(simulate_nccl(grouped) == "");
}

TEST_CASE("the device ring over thread ranks computes the CPU ring's bits", "[nccl][threads]") {
  const std::vector<RingOptions> options = {
      {.segment_elements = 3, .window = 2}, {.segment_elements = 1000, .window = 4}, {}};
  for (int ranks : {1, 2, 3, 4, 5, 7}) {
    const auto n = static_cast<size_t>(ranks);
    for (size_t count : {size_t{0}, size_t{1}, n + 1, size_t{1009}, size_t{20011}}) {
      for (const RingOptions& option : options) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          for (bool random : {false, true}) {
            const auto expected = cpu_ring(ranks, count, op, random, option);
            std::vector<std::vector<float>> got(n);
            run_ranks(ranks, [&](Comm& comm) {
              std::vector<float> data(count);
              for (size_t i = 0; i < count; ++i)
                data[i] = random ? random_input(comm.rank(), i) : integer_input(comm.rank(), i);
              DeviceRingScratch scratch(/*host_memory=*/true);
              ring_allreduce_device(comm, data.data(), count, op, scratch, option);
              got[static_cast<size_t>(comm.rank())] = std::move(data);
            });
            INFO("ranks " << ranks << ", count " << count << ", segment " << option.segment_elements
                          << ", window " << option.window << ", " << to_string(op)
                          << (random ? ", random" : ", integers"));
            for (size_t r = 0; r < n; ++r) CHECK(same_bits(got[r], expected[r]));
          }
        }
      }
    }
  }
}

TEST_CASE("ranks_share_a_gpu: more ranks on a node than visible GPUs", "[staged]") {
  for (int ranks : {1, 2, 3}) {
    for (int gpus : {0, 1, 2, 8}) {
      std::vector<int> answers(static_cast<size_t>(ranks), -1);
      run_ranks(ranks, [&](Comm& comm) {
        answers[static_cast<size_t>(comm.rank())] = ranks_share_a_gpu(comm, gpus) ? 1 : 0;
      });
      for (int answer : answers) CHECK(answer == (ranks > gpus ? 1 : 0));
    }
  }
}

TEST_CASE("the host-staged allreduce with thread ranks sharing GPU 0 gives the CPU ring's bits",
          "[staged][gpu]") {
  const std::vector<RingOptions> options = {{.segment_elements = 5, .window = 2}, {}};
  for (int ranks : {1, 2, 3, 4}) {
    const auto n = static_cast<size_t>(ranks);
    for (size_t count : {size_t{0}, size_t{1}, n + 1, size_t{1009}, (size_t{1} << 18) + 3}) {
      for (const RingOptions& option : options) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          const bool random = count % 2 == 1;
          // Twice in a row: the second call reuses the staging buffer and the scratch.
          const auto expected = cpu_ring(ranks, count, op, random, option, /*times=*/2);
          std::vector<std::vector<float>> got(n);
          // A failing rank throws out of run_ranks, which releases the others and rethrows.
          run_ranks(ranks, [&](Comm& comm) {
            std::vector<float> data(count);
            for (size_t i = 0; i < count; ++i)
              data[i] = random ? random_input(comm.rank(), i) : integer_input(comm.rank(), i);
            DeviceBuffer device(count);
            RINGTRAIN_CHECK_CUDA(cudaMemcpyAsync(device.data, data.data(), count * sizeof(float),
                                                 cudaMemcpyHostToDevice, device.stream));
            RingScratch scratch;
            HostStaging staging;
            for (int t = 0; t < 2; ++t)
              staged_ring_allreduce(comm, device.data, count, op, scratch, staging, device.stream,
                                    option);
            RINGTRAIN_CHECK_CUDA(cudaMemcpyAsync(data.data(), device.data, count * sizeof(float),
                                                 cudaMemcpyDeviceToHost, device.stream));
            RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(device.stream));
            got[static_cast<size_t>(comm.rank())] = std::move(data);
          });
          INFO("ranks " << ranks << ", count " << count << ", segment " << option.segment_elements
                        << ", " << to_string(op));
          for (size_t r = 0; r < n; ++r) CHECK(same_bits(got[r], expected[r]));
        }
      }
    }
  }
}
