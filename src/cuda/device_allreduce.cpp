// The device kinds of Allreduce (allreduce.h): the ring over NCCL send/recv, ncclAllReduce and
// the host-staged ring, built by detail::make_device_allreduce for make_allreduce.
//
// Which one: ranks_share_a_gpu first, collectively, so that every rank of the job makes the
// same choice (a rank that built an NcclComm while another did not would hang in
// ncclCommInitRank). Shared GPUs get the staged ring whatever the algorithm says, since NCCL
// 2.28 refuses two ranks on one device; otherwise --allreduce picks the ring or the library's
// collective over one NcclComm of the kind's own. Every kind queues its work on ctx.comm_stream
// (the staged ring waits on the host once per call, for the copy down: staged_ring.h).
//
// One rank: the sum and the average of one buffer are the buffer itself, so run() does
// nothing, and no NcclComm is made (nothing to bootstrap, no stream work, nothing to abort).
#include <algorithm>
#include <memory>

#include "ringtrain/allreduce.h"
#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/gpu.h"
#include "ringtrain/nccl_comm.h"
#include "ringtrain/staged_ring.h"

namespace ringtrain {

namespace {

// One rank: the identity, for either op (ring_allreduce divides only for n > 1, too).
class OneRankAllreduce final : public Allreduce {
 public:
  void run(float* data, size_t count, ReduceOp op) override {
    (void)data;
    (void)count;
    (void)op;
  }
  AllreduceKind kind() const override { return AllreduceKind::kDeviceRing; }
  int size() const override { return 1; }
};

// The ring over NCCL send/recv (ring_allreduce_device), or ncclAllReduce: one communicator
// per object, on the context's communication stream.
class NcclAllreduce final : public Allreduce {
 public:
  NcclAllreduce(Comm& host, const AllreduceConfig& config, const Context& ctx, bool library)
      : nccl_(host, NcclOptions{.stream = static_cast<cudaStream_t>(ctx.comm_stream),
                                .device = ctx.gpu,
                                .timeout_s = config.timeout_s}),
        board_(host.board()),
        phase_(config.phase),
        ring_(config.ring),
        library_(library) {}

  void run(float* data, size_t count, ReduceOp op) override {
    if (phase_ != nullptr) board_.set_phase(phase_);
    if (library_) {
      nccl_.allreduce_library(data, count, op);
    } else {
      ring_allreduce_device(nccl_, data, count, op, scratch_, ring_);
    }
  }
  AllreduceKind kind() const override {
    return library_ ? AllreduceKind::kDeviceLibrary : AllreduceKind::kDeviceRing;
  }
  // ncclAllReduce keeps its own buffers; the ring's receive slots are ours (cudaMalloc, which
  // waits for the device: never inside a step).
  void reserve(size_t count) override {
    if (!library_) scratch_.reserve(count, nccl_.size(), ring_);
  }
  void abort() noexcept override { nccl_.abort(); }
  int size() const override { return nccl_.size(); }

 private:
  NcclComm nccl_;
  ProgressBoard& board_;  // the host communicator's, which the watchdog reads
  const char* phase_;
  RingOptions ring_;
  bool library_;
  DeviceRingScratch scratch_;
};

// Copy down to pinned host memory, the ring over the host Comm, copy back
// (staged_ring_allreduce): ring_allreduce's bits, for ranks that cannot use NCCL.
class StagedAllreduce final : public Allreduce {
 public:
  StagedAllreduce(Comm& host, const AllreduceConfig& config, const Context& ctx)
      : host_(host),
        stream_(static_cast<cudaStream_t>(ctx.comm_stream)),
        phase_(config.phase),
        ring_(config.ring),
        options_{.timeout_s = config.timeout_s} {}

  void run(float* data, size_t count, ReduceOp op) override {
    if (phase_ != nullptr) host_.board().set_phase(phase_);
    staged_ring_allreduce(host_, data, count, op, scratch_, staging_, stream_, ring_, options_);
  }
  AllreduceKind kind() const override { return AllreduceKind::kStagedRing; }
  // The pinned buffer (cudaMallocHost), and the host ring's slots and handles (reserve_ring).
  void reserve(size_t count) override {
    staging_.reserve(count);
    reserve_ring(scratch_, count, host_.size(), ring_);
  }
  int size() const override { return host_.size(); }

 private:
  Comm& host_;
  cudaStream_t stream_;
  const char* phase_;
  RingOptions ring_;
  StagedOptions options_;
  RingScratch scratch_;
  HostStaging staging_;
};

}  // namespace

namespace detail {

std::unique_ptr<Allreduce> make_device_allreduce(Comm& host, const AllreduceConfig& config,
                                                 const Context& ctx) {
  RINGTRAIN_CHECK(
      config.device == Device::kCuda && ctx.device == Device::kCuda && ctx.comm_stream != nullptr,
      "a device allreduce needs a CUDA context with a communication stream");
  check_ring_options(config.ring);
  if (host.size() == 1) return std::make_unique<OneRankAllreduce>();
  // Collective, before anything that only some ranks would do.
  const bool shared = ranks_share_a_gpu(host, visible_gpus());
  if (shared || config.host_staged) return std::make_unique<StagedAllreduce>(host, config, ctx);
  return std::make_unique<NcclAllreduce>(host, config, ctx,
                                         config.algorithm == AllreduceAlgorithm::kLibrary);
}

}  // namespace detail

}  // namespace ringtrain
