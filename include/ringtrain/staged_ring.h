// The host-staged allreduce (GPU build only), for ranks that share one GPU: NCCL 2.28 refuses
// two ranks on the same device (ncclCommInitRank: "Duplicate GPU detected"), so those ranks
// copy the buffer to pinned host memory, run the CPU ring (ring.h) over the host transport
// (MpiComm in production, ThreadComm in the tests), and copy the result back.
//
// The arithmetic is the CPU ring's, so the result has ring_allreduce's bits exactly. Unlike the
// NCCL path it must wait on the host once per call (the host ring needs the bytes): the
// device-to-host copy is waited for by polling under the host transport's deadline, posted on
// the progress board; the host-to-device copy back is left in flight on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "ringtrain/comm.h"
#include "ringtrain/ring.h"

namespace ringtrain {

// A pinned host buffer (cudaMallocHost), grown once and reused, plus the event that says when
// the previous call's copy back has finished reading it.
class HostStaging {
 public:
  HostStaging() = default;
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Grows (waiting for the previous copy back first) to at least `count` floats.
  float* reserve(size_t count);
  size_t capacity() const { return capacity_; }
  // Recorded after each copy back; the next call's stream waits on it before overwriting.
  cudaEvent_t copied_back();
  bool has_copy_back() const { return copy_back_recorded_; }
  void mark_copy_back() { copy_back_recorded_ = true; }

 private:
  float* data_ = nullptr;
  size_t capacity_ = 0;
  cudaEvent_t copied_back_ = nullptr;
  bool copy_back_recorded_ = false;
};

// Options of the staged path beyond the ring's.
struct StagedOptions {
  // How long the wait for the device-to-host copy may last (the host transport's timeout).
  double timeout_s = 600.0;
};

// In place on `device_data` (n floats, device memory), ordered on `stream`: waits for the
// stream's earlier work (the gradients), copies down, runs ring_allreduce over host_comm, and
// enqueues the copy back; returns with the copy back in flight on `stream`.
void staged_ring_allreduce(Comm& host_comm, float* device_data, size_t n, ReduceOp op,
                           RingScratch& scratch, HostStaging& staging, cudaStream_t stream,
                           const RingOptions& ring = {}, const StagedOptions& options = {});

// True when some node runs more ranks than it has visible GPUs (then NCCL cannot be used and
// the staged path must be). Collective over `host` (an allgather), so that every rank of the
// job makes the same choice even when nodes differ: a rank that built an NcclComm while another
// did not would hang. When true, local rank 0 of each node that shares logs one line saying why.
// (The sketch took `const Comm&`; a collective needs a non-const one.) It counts GPUs,
// so it assumes every rank sees all of its node's GPUs: a launcher that gives each rank one GPU
// through its own CUDA_VISIBLE_DEVICES makes it answer true (the staged path: correct, slower),
// and NcclComm's default device (the local rank) would not be visible there either.

bool ranks_share_a_gpu(Comm& host, int visible_gpus);

}  // namespace ringtrain
