// The host-staged allreduce (staged_ring.h): device -> pinned host -> CPU ring -> device.
//
// Why pinned memory: cudaMemcpyAsync from pageable memory is staged through a driver buffer and
// is not truly asynchronous; pinned (cudaMallocHost) memory is DMA'd directly, at full PCIe or
// C2C bandwidth, and the buffer is reused across calls so it is allocated once.
// Why one host wait: the host ring reads the bytes, so the device-to-host copy must be complete
// on the host. It is polled (cudaStreamQuery) under a deadline with the wait posted on the
// progress board, like every other wait of the transports, instead of a cudaStreamSynchronize
// that the watchdog could not see and that could hang forever on a stuck stream.
#include "ringtrain/staged_ring.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "ringtrain/cuda_check.h"
#include "ringtrain/gpu_context.h"

namespace ringtrain {

HostStaging::~HostStaging() {
  // Nothing may throw here; the last copy back must be done before the memory goes.
  if (copied_back_ != nullptr) {
    if (copy_back_recorded_) cudaEventSynchronize(copied_back_);
    cudaEventDestroy(copied_back_);
  }
  if (data_ != nullptr) cudaFreeHost(data_);
}

cudaEvent_t HostStaging::copied_back() {
  if (copied_back_ == nullptr)
    RINGTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&copied_back_, cudaEventDisableTiming));
  return copied_back_;
}

float* HostStaging::reserve(size_t count) {
  if (count <= capacity_ && data_ != nullptr) return data_;
  if (data_ != nullptr) {
    // The previous copy back may still read the old buffer.
    if (copy_back_recorded_) RINGTRAIN_CHECK_CUDA(cudaEventSynchronize(copied_back_));
    RINGTRAIN_CHECK_CUDA(cudaFreeHost(data_));
    data_ = nullptr;
    capacity_ = 0;
  }
  const size_t elements = std::max<size_t>(count, 1);
  RINGTRAIN_CHECK_CUDA(cudaMallocHost(&data_, elements * sizeof(float)));
  capacity_ = elements;
  return data_;
}

void staged_ring_allreduce(Comm& host_comm, float* device_data, size_t n, ReduceOp op,
                           RingScratch& scratch, HostStaging& staging, cudaStream_t stream,
                           const RingOptions& ring, const StagedOptions& options) {
  RINGTRAIN_CHECK(std::isfinite(options.timeout_s) && options.timeout_s > 0,
                  "staged allreduce: the timeout must be a positive number of seconds, got {}",
                  options.timeout_s);
  float* host = staging.reserve(n);
  // The previous call's copy back reads the staging buffer: the copy down must not overwrite
  // it before that finished, whatever stream the previous call used.
  if (staging.has_copy_back())
    RINGTRAIN_CHECK_CUDA(cudaStreamWaitEvent(stream, staging.copied_back(), 0));
  if (n > 0) {
    RINGTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(host, device_data, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  }
  wait_for_stream(stream, &host_comm.board(), "the copy of the buffer to the host",
                  options.timeout_s);
  // Every rank takes part in the ring, even with n == 0 (the ring handles empty buffers).
  ring_allreduce(host_comm, host, n, op, scratch, ring);
  if (n > 0) {
    RINGTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(device_data, host, n * sizeof(float), cudaMemcpyHostToDevice, stream));
  }
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(staging.copied_back(), stream));
  staging.mark_copy_back();
}

bool ranks_share_a_gpu(Comm& host, int visible_gpus) {
  struct NodeView {
    int32_t local_size = 0;
    int32_t gpus = 0;
  };
  const NodeView mine{host.local_size(), visible_gpus};
  const auto all = allgather_value(host, mine);
  const bool here = mine.local_size > mine.gpus;
  const bool anywhere = std::any_of(
      all.begin(), all.end(), [](const NodeView& view) { return view.local_size > view.gpus; });
  if (anywhere && host.local_rank() == 0) {
    if (mine.gpus == 0) {
      spdlog::info(
          "{} rank(s) on this node and no visible GPU: neither NCCL nor the host-staged "
          "path can run here",
          mine.local_size);
    } else if (here) {
      spdlog::info(
          "{} rank(s) on this node but {} visible GPU(s): ranks share a GPU, which NCCL {}.{} "
          "refuses (one rank per device), so the allreduce runs host-staged (copy to pinned "
          "host memory, the ring over {}, copy back)",
          mine.local_size, mine.gpus, NCCL_MAJOR, NCCL_MINOR, host.name());
    } else {
      spdlog::info(
          "another node runs more ranks than it has GPUs, so every rank's allreduce runs "
          "host-staged (copy to pinned host memory, the ring over {}, copy back)",
          host.name());
    }
  }
  return anywhere;
}

}  // namespace ringtrain
