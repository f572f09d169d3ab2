// The wire under the collectives: a small point-to-point interface for ring neighbours plus the
// library's own collectives (kept as baselines and for small, rare messages). The ring
// algorithm (ring.h) is written once against this interface; MPI implements it for host
// memory, NcclComm (nccl_comm.h) for device memory, and the tests implement it over threads.
//
// Every call is collective over the communicator or paired with a matching call on the peer;
// a failure throws ringtrain::Error naming the call, the peer and the library's message.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ringtrain {

enum class ReduceOp { kSum, kAvg };
const char* to_string(ReduceOp op);
ReduceOp parse_reduce_op(const std::string& text);  // "sum" | "avg"; throws naming --op

// A handle for a non-blocking transfer; a transport keeps what it needs in `id`.
struct CommRequest {
  int64_t id = -1;
  bool active() const { return id >= 0; }
};

// The phase of a board before anything posted one (set-up).
inline constexpr const char* kStartingPhase = "starting";

// What this rank is doing, for the collective watchdog (watchdog.h): the training loop posts
// the step and the phase (which collective), the transport posts when it starts and stops
// waiting and on what, and everything that moves the job on posts progress: a transport wait
// or a piece of a collective completing, a step starting, a phase changing, a layer's forward
// or backward (Model, through Context::board). The watchdog judges a rank by the time of its
// last progress, never by how long one wait lasts. Written by the main and the communication
// thread, read by the watchdog thread; plain atomics and string literals (labels must have
// static storage), so posting costs a few stores and never allocates or locks: progress() is
// one clock read and one relaxed store, cheap enough for every layer.
class ProgressBoard {
 public:
  struct Snapshot {
    int64_t step = -1;
    const char* phase = kStartingPhase;  // the collective the rank is in or was last in
    bool waiting = false;                // inside a blocking wait of the transport
    const char* waiting_on = "";         // "a receive from", "a broadcast", "MPI_Allreduce", ...
    int peer = -1;                       // for point-to-point waits, else -1
    double waiting_s = 0.0;              // how long the current wait has lasted
    double step_s = 0.0;                 // how long since the step began
    double idle_s = 0.0;                 // how long since this rank's last progress
  };
  // steady_clock in nanoseconds: the board's time base.
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void set_step(int64_t step);         // progress
  void set_phase(const char* phase) {  // progress
    phase_.store(phase, std::memory_order_relaxed);
    progress();
  }
  void enter_wait(const char* what, int peer);
  void leave_wait() {  // a completed wait is progress
    wait_start_ns_.store(0, std::memory_order_release);
    progress();
  }
  // One progress event of this rank.
  void progress() { last_progress_ns_.store(now_ns(), std::memory_order_relaxed); }
  // The watchdog's word that the job is moving: another rank made progress at `at_ns` (this
  // rank's clock). The transports' backstop deadlines wait while the job moves.
  void note_job_progress(int64_t at_ns);
  int64_t last_progress_ns() const { return last_progress_ns_.load(std::memory_order_relaxed); }
  // The newest progress this rank knows of: its own or the job's, as the watchdog heard.
  int64_t known_progress_ns() const {
    return std::max(last_progress_ns(), job_progress_ns_.load(std::memory_order_relaxed));
  }
  Snapshot snapshot() const;

 private:
  std::atomic<int64_t> step_{-1};
  std::atomic<int64_t> step_start_ns_{0};
  std::atomic<const char*> phase_{kStartingPhase};
  std::atomic<const char*> waiting_on_{""};
  std::atomic<int> peer_{-1};
  std::atomic<int64_t> wait_start_ns_{0};  // 0: not waiting
  std::atomic<int64_t> last_progress_ns_{now_ns()};
  std::atomic<int64_t> job_progress_ns_{0};
};

// A gap this long between two polls of a loop that polls far more often means the process was
// stopped (SIGSTOP, a batch system's suspend) or starved of a core: the watchdog counts the
// resumption as progress and the deadlines below do not count the gap.
inline constexpr int64_t kStoppedGapNs = 1'000'000'000;

// The transports' backstop behind the watchdog: a deadline that passes when neither this rank
// nor, as the watchdog last heard, the job has made progress for `timeout_s` since the wait
// began, not counting any gap between two polls longer than kStoppedGapNs. Call passed() at
// every poll of the wait; it reads two atomics.
class StallDeadline {
 public:
  StallDeadline(const ProgressBoard& board, double timeout_s,
                int64_t start_ns = ProgressBoard::now_ns())
      : board_(board),
        timeout_ns_(static_cast<int64_t>(timeout_s * 1e9)),
        last_poll_ns_(start_ns),
        since_ns_(start_ns) {}
  bool passed(int64_t now_ns) {
    const int64_t latest = std::max(since_ns_, board_.known_progress_ns());
    // A stop moves the reference on by its length (never past now).
    if (now_ns - last_poll_ns_ > kStoppedGapNs)
      since_ns_ = std::min(now_ns, latest + (now_ns - last_poll_ns_));
    last_poll_ns_ = now_ns;
    return now_ns - std::max(since_ns_, latest) > timeout_ns_;
  }
  bool passed() { return passed(ProgressBoard::now_ns()); }

 private:
  const ProgressBoard& board_;
  int64_t timeout_ns_;
  int64_t last_poll_ns_;
  int64_t since_ns_;  // the wait's start, moved on by stops
};

// Posts a phase for the duration of a scope and restores the previous one after.
class PhaseScope {
 public:
  PhaseScope(ProgressBoard& board, const char* phase)
      : board_(board), previous_(board.snapshot().phase) {
    board_.set_phase(phase);
  }
  ~PhaseScope() { board_.set_phase(previous_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  ProgressBoard& board_;
  const char* previous_;
};

// Posts a wait on a board for as long as a scope lasts, however it ends (the transports' and
// the GPU steps' blocking waits).
class WaitScope {
 public:
  WaitScope(ProgressBoard& board, const char* what, int peer) : board_(board) {
    board_.enter_wait(what, peer);
  }
  ~WaitScope() { board_.leave_wait(); }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  ProgressBoard& board_;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this node and this rank's index among them (GPU selection, logging).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "threads"

  // Non-blocking transfers of n floats to / from a peer; `tag` tells concurrent transfers
  // between the same pair apart (the ring uses the segment index). Buffers must stay valid
  // and untouched until wait() returns.
  virtual CommRequest isend(const float* data, size_t n, int peer, int tag) = 0;
  virtual CommRequest irecv(float* data, size_t n, int peer, int tag) = 0;
  // Completes a request (a no-op on an inactive one) and marks it inactive.
  virtual void wait(CommRequest& request) = 0;
  // How long wait() polls without pause before it sleeps between polls: long (the default,
  // lowest latency) for a thread with nothing else to do, short for the overlap engine's
  // communication thread, which shares the cores with computation. Transports that do not
  // poll ignore it.
  virtual void set_spin_before_sleep(std::chrono::microseconds spin) { (void)spin; }
  // Sends to `dst` while receiving from `src`; returns when both are done.
  void sendrecv(const float* send, size_t send_n, int dst, float* recv, size_t recv_n, int src,
                int tag = 0);

  // dst[i] += src[i]; where the data lives decides how (a host loop here, a kernel on GPUs).
  virtual void add_inplace(float* dst, const float* src, size_t n);
  // data[i] /= divisor: the one division of an average (by the rank that owns a finished
  // chunk). A host loop here, exactly what ring.cpp does; a device transport overrides it with
  // a kernel on its stream. Used by the device ring (nccl_comm.h); ring.cpp divides itself.
  virtual void divide_inplace(float* data, size_t n, float divisor) {
    for (size_t i = 0; i < n; ++i) data[i] /= divisor;
  }
  // The library's own allreduce (MPI_Allreduce / ncclAllReduce): the baseline.
  virtual void allreduce_library(float* data, size_t n, ReduceOp op) = 0;
  // Broadcast of raw bytes from `root` to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank contributes `bytes` bytes; recv gets size() * bytes, rank-ordered.
  virtual void allgather(const void* send, void* recv, size_t bytes) = 0;
  virtual void barrier() = 0;

  // This rank's progress, for the watchdog; transports post their waits here.
  ProgressBoard& board() { return *board_; }
  // Post on `other`'s board from now on: a communicator split from the watched one (the
  // parameter-server strategy's) reports its waits where the watchdog looks.
  void post_on_board_of(Comm& other) { board_ = &other.board(); }

 private:
  ProgressBoard own_board_;
  ProgressBoard* board_ = &own_board_;
};

// A 64-bit hash of a buffer's bytes (FNV-1a's step over 8-byte words, then the tail bytes),
// for checking that ranks hold the same bits: gather one hash per rank instead of the data.
uint64_t hash_bytes(const void* data, size_t bytes);

// Typed helpers over the byte-level collectives.
template <typename T>
void broadcast_values(Comm& comm, std::vector<T>& values, int root) {
  comm.broadcast(values.data(), values.size() * sizeof(T), root);
}
template <typename T>
std::vector<T> allgather_value(Comm& comm, const T& value) {
  std::vector<T> all(static_cast<size_t>(comm.size()));
  comm.allgather(&value, all.data(), sizeof(T));
  return all;
}

}  // namespace ringtrain
