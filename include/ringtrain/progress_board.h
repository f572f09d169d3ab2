// The progress board: what this rank is doing and when it last moved the job on, posted by the
// loop, the transports and the training step, read by the collective watchdog (watchdog.h);
// and the transports' backstop deadline that reads it. Kept apart from Comm: a board is about
// progress, whatever moves the bytes.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace ringtrain {

// The phase of a board before anything posted one (set-up).
inline constexpr const char* kStartingPhase = "starting";

// What this rank is doing, for the collective watchdog (watchdog.h): the training loop posts
// the step and the phase (which collective), the transport posts when it starts and stops
// waiting and on what, and everything that moves the job on posts progress: a transport wait
// or a piece of a collective completing, a step starting, a phase changing, a step's forward
// and each finished gradient piece (train_step, through StepWorkspace::board), an evaluation
// batch. The watchdog judges a rank by the time of its last progress, never by how long one
// wait lasts. Written by the main and the communication
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

}  // namespace ringtrain
