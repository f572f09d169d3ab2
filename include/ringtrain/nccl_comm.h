// NCCL for device memory (GPU build only): NcclComm implements Comm over ncclSend/ncclRecv and
// NCCL's collectives on one communication stream, and ring_allreduce_device runs the ring of
// ring.h (same chunks, segments and window) over it with the add as a kernel on that stream.
//
// For the rest of the GPU path (training, model): what this header promises.
//  - Everything is stream-ordered on comm.stream(); nothing here synchronises the host except
//    synchronize(), barrier() and the first use of a new size (scratch growth). A training step
//    enqueues its allreduces and calls synchronize() (or makes its compute stream wait with
//    stream_waits_for_comm) where it needs the result, e.g. before the optimizer on another
//    stream: "no host synchronisation inside the step".
//  - Gradients produced on another stream must be ordered before the allreduce:
//    comm.comm_waits_for_stream(compute_stream) records an event there and makes the comm
//    stream wait on it (no host sync). The reverse, compute waits for comm:
//    comm.stream_waits_for_comm(compute_stream).
//  - The comm stream is created cudaStreamNonBlocking, so it does NOT synchronise with the
//    legacy default stream: a plain cudaMemcpy (default stream) after an allreduce must come
//    after synchronize() or stream_waits_for_comm(the stream it runs on).
//  - Host-side control messages (the configuration check, checkpoints, metrics, the NCCL
//    unique id itself) stay on the MpiComm the NcclComm was built from: broadcast, allgather
//    and barrier here take DEVICE buffers.
//  - One thread issues an NcclComm's calls (the pending batch is not locked); the constructor
//    makes the device current on the calling thread, and any other thread that launches work
//    on these buffers must cudaSetDevice(comm.device()) itself.
//  - Ranks that share one GPU cannot build an NcclComm (NCCL 2.28 refuses two ranks on one
//    device); they use the host-staged ring (staged_ring.h), chosen by ranks_share_a_gpu.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringtrain/comm.h"
#include "ringtrain/ring.h"

namespace ringtrain {

// The grouping rule of NcclComm's point-to-point calls, without NCCL, so that the tests can
// replay it (tests/gpu/test_nccl_staged.cpp checks that the ring's groups match between
// neighbours and cannot deadlock).
//
// ncclSend/ncclRecv are stream-ordered and a send holds its stream until the peer's receive
// runs, so a ring where every rank posts recv(left) + send(right) must issue both inside one
// ncclGroupStart/End: then NCCL runs them in one kernel and they progress together. isend and
// irecv therefore only append to a pending batch; wait() on a request that is still pending
// launches the whole batch as one group, and wait() on one already launched is a no-op
// (completion is stream order: all later work on the comm stream runs after it). Request ids
// are issued in order, so "pending" is simply id >= first_pending().
class P2pBatcher {
 public:
  struct Op {
    bool send = false;
    float* data = nullptr;  // the receive target, or the send source (cast from const)
    size_t count = 0;       // floats
    int peer = -1;
  };
  int64_t add(const Op& op) {
    pending_.push_back(op);
    return next_id_++;
  }
  bool is_pending(int64_t id) const { return id >= first_pending_ && id < next_id_; }
  bool has_pending() const { return !pending_.empty(); }
  const std::vector<Op>& pending() const { return pending_; }
  // After the pending batch was launched (or recorded): clears it, keeping the capacity.
  void launched() {
    pending_.clear();
    first_pending_ = next_id_;
  }

 private:
  std::vector<Op> pending_;
  int64_t next_id_ = 0;
  int64_t first_pending_ = 0;
};

struct NcclOptions {
  // The communication stream; nullptr: NcclComm creates its own (cudaStreamNonBlocking, highest
  // priority, so ring kernels are not queued behind a long GEMM) and destroys it.
  cudaStream_t stream = nullptr;
  // The GPU; -1: the local rank's (local_rank among this node's ranks). Must be visible.
  int device = -1;
  // How long synchronize() and barrier() wait without progress before the communicator is
  // aborted and they throw (the MpiComm's timeout is the natural value).
  double timeout_s = 600.0;
  // How long synchronize() polls without pause before it sleeps between polls.
  std::chrono::microseconds spin{1000};
};

class NcclComm final : public Comm {
 public:
  // Collective over `host` (every rank of it): rank 0 calls ncclGetUniqueId and broadcasts it
  // over `host` (with its status, so a failure there is an error on every rank, not a hang),
  // then every rank selects its device and calls ncclCommInitRank. Throws, naming the reason,
  // when the device is not visible; ranks sharing a GPU should not get here (ranks_share_a_gpu).
  // Waits (ncclCommInitRank, group launches, synchronize) are posted on host.board(), where
  // the watchdog looks; `host` must outlive this object.
  explicit NcclComm(Comm& host, const NcclOptions& options = {});
  ~NcclComm() override;  // waits (bounded) for the stream, then destroys; aborts if stuck
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return "nccl"; }

  // Device buffers. Tags are ignored: NCCL matches the sends and receives between one pair of
  // ranks in issue order, which for the ring is segment order on both sides.
  CommRequest isend(const float* data, size_t n, int peer, int tag) override;
  CommRequest irecv(float* data, size_t n, int peer, int tag) override;
  // Launches the pending batch as one NCCL group if `request` is in it; never waits on the host.
  void wait(CommRequest& request) override;
  // Kernels on the comm stream: ringtrain::gpu::add_inplace and ringtrain::gpu::divide (an IEEE
  // division per value, so the average has the host ring's bits).
  void add_inplace(float* dst, const float* src, size_t n) override;
  void divide_inplace(float* data, size_t n, float divisor) override;

  // ncclAllReduce (ncclSum, or ncclAvg for kAvg), on the comm stream: the baseline backend.
  void allreduce_library(float* data, size_t n, ReduceOp op) override;
  // ncclBroadcast / ncclAllGather of DEVICE bytes, on the comm stream (no host sync).
  void broadcast(void* data, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t bytes) override;
  // A one-float ncclAllReduce, then synchronize(): every rank has reached it.
  void barrier() override;

  // Launches anything pending, then waits on the host until the comm stream is idle: polls
  // cudaStreamQuery and ncclCommGetAsyncError with the deadline, posting the wait on the
  // progress board; a deadline passed or an asynchronous NCCL error aborts the communicator
  // (ncclCommAbort) and throws naming it, so a dead peer is an error, not a hang.
  void synchronize();
  // Stream-ordered hand-offs without host sync (an event recorded on one, waited on by the other).
  void comm_waits_for_stream(cudaStream_t producer);
  void stream_waits_for_comm(cudaStream_t consumer);

  // Gives up on the communicator now (ncclCommAbort): for a rank that learned of a failure
  // elsewhere (another rank's error over MPI) and must not wait for its peers. Every later call
  // throws; the destructor then only frees memory.
  void abort() noexcept;

  cudaStream_t stream() const { return stream_; }
  ncclComm_t handle() const { return comm_; }
  int device() const { return device_; }
  bool aborted() const { return aborted_; }
  void set_timeout(double seconds);
  void set_spin_before_sleep(std::chrono::microseconds spin) override { spin_ = spin; }

 private:
  void launch_pending();  // one ncclGroupStart/End over the pending batch
  void check_usable(const char* call) const;
  [[noreturn]] void abort_and_fail(const std::string& why);

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int device_ = 0;
  // Waits are posted on the host Comm's board, the one the watchdog reads (it must outlive
  // this object); this Comm's own board() stays unused.
  ProgressBoard* posts_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  cudaEvent_t handoff_ = nullptr;  // reused by the two hand-off calls
  float* barrier_word_ = nullptr;  // one device float for barrier()
  P2pBatcher batcher_;
  bool aborted_ = false;
  double timeout_s_ = 600.0;
  std::chrono::microseconds spin_{1000};
};

// Receive slots and request handles of the device ring; the slots are device memory
// (cudaMalloc), or host memory when built with host_memory = true (for host transports in the
// tests). Growing frees and allocates (cudaFree synchronises the device): call reserve() once
// at set-up with the largest count, so that no step ever grows it.
class DeviceRingScratch final : public RingSlots {
 public:
  explicit DeviceRingScratch(bool host_memory = false) : host_memory_(host_memory) {}
  ~DeviceRingScratch();
  DeviceRingScratch(const DeviceRingScratch&) = delete;
  DeviceRingScratch& operator=(const DeviceRingScratch&) = delete;

  void reserve(size_t count, int ranks, const RingOptions& options = {});
  float* slots(size_t elements) override;
  std::vector<CommRequest>& sends(size_t n) override;
  std::vector<CommRequest>& recvs(size_t n) override;
  size_t capacity() const { return capacity_; }

 private:
  bool host_memory_;
  float* slots_ = nullptr;
  size_t capacity_ = 0;
  std::vector<float> host_slots_;
  std::vector<CommRequest> sends_, recvs_;
};

// The ring allreduce of ring.h over a Comm whose buffers may live on a device: ring_allreduce
// itself, with the receive slots from DeviceRingScratch, reserved up front. Over NcclComm it
// enqueues everything on the comm stream and returns without waiting; over a host transport
// (ThreadComm, MpiComm, with a host-memory scratch) it computes exactly ring_allreduce's bits.
void ring_allreduce_device(Comm& comm, float* data, size_t count, ReduceOp op,
                           DeviceRingScratch& scratch, const RingOptions& options = {});

}  // namespace ringtrain
