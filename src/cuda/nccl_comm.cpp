// NcclComm and the device ring (nccl_comm.h).
//
// How the ring's calls become NCCL groups, and why that cannot deadlock. ring_step (below, the
// same loop as src/ring.cpp) posts the first `window` receives and sends of a step, then for
// k = 0, 1, ...: wait(recv k), add segment k, post recv k+window; wait(send k), post send
// k+window. With the P2pBatcher rule (wait on a pending request launches the whole pending
// batch; wait on a launched one is a no-op), the first wait of a step launches segments
// [0, W) as one group; the posts of iterations 0..W-1 (segments [W, 2W)) stay pending until
// iteration W waits on one of them, and so on: group m of a step holds exactly the receives
// from the left and the sends to the right of segments [mW, (m+1)W). Which segments form a
// group depends only on the segment index, never on the rank, and rank r's send chunk in a
// step is rank r+1's receive chunk (the same ring_chunk), so rank r's sends in group (step, m)
// are exactly rank r+1's receives in group (step, m), same segments, same sizes, same order.
// Every rank issues its groups in increasing (step, m) order; by induction, once all groups
// before (step, m) have completed everywhere, every op of group (step, m) finds its partner in
// the partner's current group, so the group completes: no cycle of waits can form. (A group
// holding only receives, say, would deadlock the ring: every rank's stream would block on a
// receive whose matching send sits behind it on the sender's stream. That is why wait() never
// launches a partial batch.) The add of segment k is enqueued after the group that receives
// it, and the receive that reuses its slot (k + window) is launched only in a later group, so
// stream order also covers the slots. tests/gpu/test_nccl_staged.cpp replays the rule for many
// sizes, segments and windows and simulates NCCL's matching to check exactly this.
//
// Host synchronisation: none in isend/irecv/wait/add/allreduce_library/broadcast/allgather.
// synchronize() and barrier() wait on the host, by polling (cudaStreamQuery,
// ncclCommGetAsyncError) under a deadline with the wait posted on the progress board;
// construction, destruction and DeviceRingScratch growth synchronise too (set-up only).
#include "ringtrain/nccl_comm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "kernels.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/gpu.h"
#include "ringtrain/gpu_context.h"

namespace ringtrain {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kBackoff = std::chrono::microseconds(50);
// How long the destructor waits for the stream before it aborts instead of destroying.
constexpr double kDestroyTimeoutS = 30.0;

// What rank 0 broadcasts: the unique id and whether getting it worked.
struct IdMessage {
  int32_t status = 0;  // ncclResult_t
  char reason[200] = {};
  ncclUniqueId id{};
};

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

std::string nccl_version() {
  // The library loaded at run time, which may differ from the headers built against (a system
  // NCCL 2.28.3 under 2.28.9 headers, say): both are said when they differ.
  const std::string headers = fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess || code <= 0) return headers + " (headers)";
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9
  const std::string library = fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return library == headers ? library : fmt::format("{} (built with {} headers)", library, headers);
}

// ---- NcclComm ----

NcclComm::NcclComm(Comm& host, const NcclOptions& options)
    : rank_(host.rank()),
      size_(host.size()),
      local_rank_(host.local_rank()),
      local_size_(host.local_size()),
      posts_(&host.board()),
      timeout_s_(options.timeout_s),
      spin_(options.spin) {
  set_timeout(options.timeout_s);
  std::string why;
  const int gpus = visible_gpus(&why);
  device_ = options.device >= 0 ? options.device : local_rank_;
  // Checked before the collective part, on every rank, so that every rank's message says why.
  // A rank that throws here leaves the others in the broadcast below, where MpiComm's deadline
  // ends them; the caller should have checked ranks_share_a_gpu collectively first.
  RINGTRAIN_CHECK(device_ < gpus,
                  "rank {}: NCCL needs GPU {} (local rank {} of {}) but {} GPU(s) are visible{}{}; "
                  "ranks that share a GPU use the host-staged ring (staged_ring.h)",
                  rank_, device_, local_rank_, local_size_, gpus, why.empty() ? "" : ": ", why);
  RINGTRAIN_CHECK_CUDA(cudaSetDevice(device_));

  IdMessage message;
  if (rank_ == 0) {
    const ncclResult_t status = ncclGetUniqueId(&message.id);
    message.status = static_cast<int32_t>(status);
    if (status != ncclSuccess) {
      const std::string text =
          fmt::format("{} ({})", ncclGetErrorString(status), ncclGetLastError(nullptr));
      std::strncpy(message.reason, text.c_str(), sizeof(message.reason) - 1);
    }
  }
  host.broadcast(&message, sizeof(message), 0);  // over MPI: the id is host data
  RINGTRAIN_CHECK(message.status == ncclSuccess, "rank {}: ncclGetUniqueId on rank 0 failed: {}",
                  rank_, message.reason);

  if (options.stream != nullptr) {
    stream_ = options.stream;
  } else {
    int least = 0, greatest = 0;
    RINGTRAIN_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    RINGTRAIN_CHECK_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    owns_stream_ = true;
  }
  try {
    RINGTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&handoff_, cudaEventDisableTiming));
    RINGTRAIN_CHECK_CUDA(cudaMalloc(&barrier_word_, sizeof(float)));
    RINGTRAIN_CHECK_CUDA(cudaMemsetAsync(barrier_word_, 0, sizeof(float), stream_));
    {
      // Blocking inside NCCL (it connects to every rank); the watchdog sees the post.
      const WaitScope post(*posts_, "ncclCommInitRank", -1);
      RINGTRAIN_CHECK_NCCL(ncclCommInitRank(&comm_, size_, message.id, rank_));
    }
  } catch (...) {
    if (barrier_word_ != nullptr) cudaFree(barrier_word_);
    if (handoff_ != nullptr) cudaEventDestroy(handoff_);
    if (owns_stream_) cudaStreamDestroy(stream_);
    throw;
  }
  spdlog::debug("NCCL {}.{}: rank {} of {} on GPU {} (local rank {} of {})", NCCL_MAJOR, NCCL_MINOR,
                rank_, size_, device_, local_rank_, local_size_);
}

NcclComm::~NcclComm() {
  // Nothing here may throw. A pending batch is dropped (an unmatched wait() is a caller bug);
  // a stream that does not drain in time means a peer is gone: abort instead of destroying,
  // since ncclCommDestroy would wait for it forever.
  if (comm_ != nullptr && !aborted_) {
    bool drained = false;
    const auto deadline = deadline_after(std::min(timeout_s_, kDestroyTimeoutS));
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) {
        drained = true;
        break;
      }
      ncclResult_t async = ncclSuccess;
      if (state != cudaErrorNotReady || ncclCommGetAsyncError(comm_, &async) != ncclSuccess ||
          (async != ncclSuccess && async != ncclInProgress) || Clock::now() >= deadline)
        break;
      std::this_thread::sleep_for(kBackoff);
    }
    if (drained) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  if (handoff_ != nullptr) cudaEventDestroy(handoff_);
  if (owns_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclComm::set_timeout(double seconds) {
  RINGTRAIN_CHECK(std::isfinite(seconds) && seconds > 0,
                  "the NCCL timeout must be a positive number of seconds, got {}", seconds);
  timeout_s_ = seconds;
}

void NcclComm::check_usable(const char* call) const {
  RINGTRAIN_CHECK(!aborted_,
                  "rank {}: {} on an NCCL communicator that was aborted after an earlier failure",
                  rank_, call);
}

CommRequest NcclComm::isend(const float* data, size_t n, int peer, int tag) {
  (void)tag;  // NCCL matches in issue order per pair of ranks (header)
  check_usable("isend");
  RINGTRAIN_CHECK(peer >= 0 && peer < size_, "rank {}: a send to rank {} of {}", rank_, peer,
                  size_);
  return CommRequest{
      batcher_.add({.send = true, .data = const_cast<float*>(data), .count = n, .peer = peer})};
}

CommRequest NcclComm::irecv(float* data, size_t n, int peer, int tag) {
  (void)tag;
  check_usable("irecv");
  RINGTRAIN_CHECK(peer >= 0 && peer < size_, "rank {}: a receive from rank {} of {}", rank_, peer,
                  size_);
  return CommRequest{batcher_.add({.send = false, .data = data, .count = n, .peer = peer})};
}

void NcclComm::wait(CommRequest& request) {
  if (!request.active()) return;
  const int64_t id = request.id;
  request.id = -1;
  if (batcher_.is_pending(id)) launch_pending();
  // Otherwise it was launched with an earlier group: stream order completes it.
}

void NcclComm::launch_pending() {
  check_usable("wait");
  if (!batcher_.has_pending()) return;
  // ncclGroupEnd may block on the host while NCCL connects to a peer for the first time: post
  // it, so that the watchdog sees where a rank is stuck.
  const WaitScope post(*posts_, "an NCCL group of sends and receives", -1);
  RINGTRAIN_CHECK_NCCL(ncclGroupStart());
  ncclResult_t status = ncclSuccess;
  for (const P2pBatcher::Op& op : batcher_.pending()) {
    // Zero-length transfers are skipped on both sides alike (sizes match pairwise).
    if (op.count == 0) continue;
    status = op.send ? ncclSend(op.data, op.count, ncclFloat, op.peer, comm_, stream_)
                     : ncclRecv(op.data, op.count, ncclFloat, op.peer, comm_, stream_);
    if (status != ncclSuccess) break;
  }
  // The group must be closed whatever happened, or NCCL stays in group mode on this thread.
  const ncclResult_t end = ncclGroupEnd();
  batcher_.launched();
  RINGTRAIN_CHECK(status == ncclSuccess && end == ncclSuccess,
                  "rank {}: an NCCL group of sends and receives failed: {} ({})", rank_,
                  ncclGetErrorString(status != ncclSuccess ? status : end),
                  ncclGetLastError(comm_));
}

void NcclComm::add_inplace(float* dst, const float* src, size_t n) {
  if (n == 0) return;
  gpu::add_inplace(dst, src, static_cast<int64_t>(n), stream_);
}

void NcclComm::divide_inplace(float* data, size_t n, float divisor) {
  if (n == 0) return;
  gpu::divide(data, divisor, static_cast<int64_t>(n), stream_);
}

void NcclComm::allreduce_library(float* data, size_t n, ReduceOp op) {
  check_usable("ncclAllReduce");
  launch_pending();  // keep issue order: anything posted before runs before
  if (n == 0) return;
  RINGTRAIN_CHECK_NCCL(ncclAllReduce(data, data, n, ncclFloat,
                                     op == ReduceOp::kAvg ? ncclAvg : ncclSum, comm_, stream_));
}

void NcclComm::broadcast(void* data, size_t bytes, int root) {
  check_usable("ncclBroadcast");
  RINGTRAIN_CHECK(root >= 0 && root < size_, "broadcast from rank {} in a world of {} ranks", root,
                  size_);
  launch_pending();
  if (bytes == 0) return;
  RINGTRAIN_CHECK_NCCL(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
}

void NcclComm::allgather(const void* send, void* recv, size_t bytes) {
  check_usable("ncclAllGather");
  launch_pending();
  if (bytes == 0) return;
  RINGTRAIN_CHECK_NCCL(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_));
}

void NcclComm::barrier() {
  check_usable("barrier");
  launch_pending();
  RINGTRAIN_CHECK_NCCL(
      ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat, ncclSum, comm_, stream_));
  synchronize();
}

void NcclComm::synchronize() {
  check_usable("synchronize");
  launch_pending();
  const WaitScope post(*posts_, "the NCCL stream", -1);
  const auto start = Clock::now();
  const auto deadline = deadline_after(timeout_s_);
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) {
      (void)cudaGetLastError();
      abort_and_fail(fmt::format("the communication stream failed: {}", cudaGetErrorString(state)));
    }
    ncclResult_t async = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &async);
    if (query != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      abort_and_fail(fmt::format("NCCL reported an asynchronous error: {} ({})",
                                 ncclGetErrorString(query != ncclSuccess ? query : async),
                                 ncclGetLastError(comm_)));
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      abort_and_fail(fmt::format(
          "no progress for {:g} s on the NCCL stream (phase {}); did a peer die or stall? set "
          "RINGTRAIN_COMM_TIMEOUT_S (mnist_train: --collective-timeout) to wait longer",
          timeout_s_, posts_->snapshot().phase));
    }
    if (now - start >= spin_) std::this_thread::sleep_for(kBackoff);
  }
}

void NcclComm::abort() noexcept {
  if (aborted_ || comm_ == nullptr) return;
  aborted_ = true;
  ncclCommAbort(comm_);
}

void NcclComm::abort_and_fail(const std::string& why) {
  // After an abort the communicator is unusable; every later call throws (check_usable).
  abort();
  RINGTRAIN_FAIL("rank {}: {}; the NCCL communicator was aborted", rank_, why);
}

void NcclComm::comm_waits_for_stream(cudaStream_t producer) {
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(handoff_, producer));
  RINGTRAIN_CHECK_CUDA(cudaStreamWaitEvent(stream_, handoff_, 0));
}

void NcclComm::stream_waits_for_comm(cudaStream_t consumer) {
  launch_pending();
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(handoff_, stream_));
  RINGTRAIN_CHECK_CUDA(cudaStreamWaitEvent(consumer, handoff_, 0));
}

// ---- DeviceRingScratch ----

DeviceRingScratch::~DeviceRingScratch() {
  if (slots_ != nullptr && !host_memory_) cudaFree(slots_);
}

void DeviceRingScratch::reserve(size_t count, int ranks, const RingOptions& options) {
  reserve_ring(*this, count, ranks, options);
}

float* DeviceRingScratch::slots(size_t elements) {
  if (elements <= capacity_ && slots_ != nullptr) return slots_;
  if (elements == 0) elements = 1;  // a valid pointer even for empty chunks
  if (host_memory_) {
    host_slots_.resize(elements);
    slots_ = host_slots_.data();
  } else {
    // cudaFree waits for the device, so work still reading the old slots is done first.
    if (slots_ != nullptr) RINGTRAIN_CHECK_CUDA(cudaFree(slots_));
    slots_ = nullptr;
    capacity_ = 0;
    RINGTRAIN_CHECK_CUDA(cudaMalloc(&slots_, elements * sizeof(float)));
  }
  capacity_ = elements;
  return slots_;
}

std::vector<CommRequest>& DeviceRingScratch::sends(size_t n) {
  if (sends_.size() < n) sends_.resize(n);
  return sends_;
}

std::vector<CommRequest>& DeviceRingScratch::recvs(size_t n) {
  if (recvs_.size() < n) recvs_.resize(n);
  return recvs_;
}

// ---- the device ring: ring.h's schedule with slots in device memory ----

void ring_allreduce_device(Comm& comm, float* data, size_t count, ReduceOp op,
                           DeviceRingScratch& scratch, const RingOptions& options) {
  check_ring_options(options);
  // Slots for the largest chunk now, so that no step grows them (cudaFree mid-ring would
  // synchronise the device).
  scratch.reserve(count, comm.size(), options);
  ring_allreduce(comm, data, count, op, scratch, options);
}

}  // namespace ringtrain
