// The device kinds of make_allreduce, with ranks as threads of this process on GPU 0 (a
// single-GPU machine suffices; the binary's main() skips everything when no GPU is visible):
//  - one rank: the identity, of kind ring over NCCL, with no NCCL communicator to make;
//  - the host-staged ring (forced with AllreduceConfig::host_staged, or chosen because the
//    thread ranks share GPU 0) gives the CPU ring's bits exactly, twice in a row on reused
//    buffers, after reserve();
//  - a host-memory configuration is refused by the device factory.
// The NCCL kinds need one process per GPU: nccl_ring_test runs them under mpirun.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/allreduce.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/gpu.h"
#include "ringtrain/ring.h"
#include "support/thread_comm.h"

using namespace ringtrain;

namespace {

// A device buffer and a non-blocking stream on GPU 0 for one thread rank, as a Context's
// communication stream.
struct RankDevice {
  explicit RankDevice(size_t count) {
    RINGTRAIN_CHECK_CUDA(cudaSetDevice(0));
    RINGTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const cudaError_t status = cudaMalloc(&data, std::max<size_t>(count, 1) * sizeof(float));
    if (status != cudaSuccess) cudaStreamDestroy(stream);
    RINGTRAIN_CHECK_CUDA(status);
    ctx.device = Device::kCuda;
    ctx.gpu = 0;
    ctx.stream = stream;  // no compute work here: one stream for both
    ctx.comm_stream = stream;
  }
  ~RankDevice() {
    cudaStreamSynchronize(stream);
    cudaFree(data);
    cudaStreamDestroy(stream);
  }
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  void upload(const std::vector<float>& values) {
    RINGTRAIN_CHECK_CUDA(cudaMemcpyAsync(data, values.data(), values.size() * sizeof(float),
                                         cudaMemcpyHostToDevice, stream));
  }
  std::vector<float> download(size_t count) {
    std::vector<float> values(count);
    RINGTRAIN_CHECK_CUDA(cudaMemcpyAsync(values.data(), data, count * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream));
    RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    return values;
  }

  float* data = nullptr;
  cudaStream_t stream = nullptr;
  Context ctx;
};

std::vector<float> rank_input(int rank, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i)
    values[i] = static_cast<float>(rank + 1) * 0.37f + static_cast<float>(i % 101) * 0.011f;
  return values;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("a one-rank device allreduce is the identity", "[gpu][allreduce]") {
  const size_t count = 1000;
  std::vector<float> got;
  AllreduceKind kind = AllreduceKind::kHostRing;
  int size = 0;
  run_ranks(1, [&](Comm& comm) {
    RankDevice device(count);
    device.upload(rank_input(0, count));
    const auto allreduce = make_allreduce(
        comm, {.algorithm = AllreduceAlgorithm::kLibrary, .device = Device::kCuda}, device.ctx);
    kind = allreduce->kind();
    size = allreduce->size();
    allreduce->reserve(count);
    allreduce->run(device.data, count, ReduceOp::kAvg);
    allreduce->run(device.data, count, ReduceOp::kSum);
    allreduce->abort();  // nothing to abort: a no-op
    got = device.download(count);
  });
  CHECK(kind == AllreduceKind::kDeviceRing);
  CHECK(size == 1);
  CHECK(same_bits(got, rank_input(0, count)));
}

TEST_CASE("the host-staged device allreduce gives the CPU ring's bits", "[gpu][allreduce]") {
  const RingOptions ring{.segment_elements = 7, .window = 2};
  for (int ranks : {2, 3}) {
    for (bool forced : {true, false}) {
      const auto n = static_cast<size_t>(ranks);
      const size_t count = 4099;
      // The CPU ring, twice, on the same inputs.
      std::vector<std::vector<float>> expected(n);
      run_ranks(ranks, [&](Comm& comm) {
        std::vector<float> data = rank_input(comm.rank(), count);
        RingScratch scratch;
        ring_allreduce(comm, data.data(), count, ReduceOp::kAvg, scratch, ring);
        ring_allreduce(comm, data.data(), count, ReduceOp::kSum, scratch, ring);
        expected[static_cast<size_t>(comm.rank())] = std::move(data);
      });
      std::vector<std::vector<float>> got(n);
      std::vector<AllreduceKind> kinds(n, AllreduceKind::kHostRing);
      run_ranks(ranks, [&](Comm& comm) {
        RankDevice device(count);
        device.upload(rank_input(comm.rank(), count));
        // Without the flag, the staged ring is chosen only where the thread ranks outnumber
        // the GPUs; a machine with more GPUs than ranks would build NCCL over threads, which
        // this test does not attempt.
        const bool staged = forced || ranks > visible_gpus();
        if (!staged) return;
        const auto allreduce = make_allreduce(
            comm, {.device = Device::kCuda, .ring = ring, .timeout_s = 60.0, .host_staged = forced},
            device.ctx);
        kinds[static_cast<size_t>(comm.rank())] = allreduce->kind();
        allreduce->reserve(count);
        allreduce->run(device.data, count, ReduceOp::kAvg);
        allreduce->run(device.data, count, ReduceOp::kSum);
        got[static_cast<size_t>(comm.rank())] = device.download(count);
      });
      if (!forced && ranks <= visible_gpus()) continue;
      INFO("ranks " << ranks << (forced ? ", forced" : ", sharing GPU 0"));
      for (size_t r = 0; r < n; ++r) {
        CHECK(kinds[r] == AllreduceKind::kStagedRing);
        CHECK(same_bits(got[r], expected[r]));
      }
    }
  }
}

TEST_CASE("the device factory refuses host memory", "[gpu][allreduce]") {
  bool refused = false;
  run_ranks(1, [&](Comm& comm) {
    RankDevice device(1);
    try {
      (void)detail::make_device_allreduce(comm, {.device = Device::kCpu}, device.ctx);
    } catch (const Error&) {
      refused = true;
    }
  });
  CHECK(refused);
}
