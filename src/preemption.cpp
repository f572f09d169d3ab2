// Preemption signals and the per-step stop agreement (see preemption.h).
#include "ringtrain/preemption.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace ringtrain {

namespace {

// Lock-free, so the handler may touch it (async-signal-safe).
std::atomic<int> requested_by{0};
static_assert(std::atomic<int>::is_always_lock_free);

// A repeated signal changes nothing: a launcher often signals both the ranks and itself, which
// passes the signal on again while the chief writes; the batch system's SIGKILL comes anyway.
extern "C" void on_preemption_signal(int signal) {
  int none = 0;
  requested_by.compare_exchange_strong(none, signal, std::memory_order_relaxed);
}

constexpr auto kPoll = std::chrono::microseconds(50);

}  // namespace

void install_preemption_handlers() {
  struct sigaction action = {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a write or a wait interrupted by it simply goes on
  for (const int signal : {SIGTERM, SIGUSR1, SIGUSR2})
    RINGTRAIN_CHECK(::sigaction(signal, &action, nullptr) == 0,
                    "cannot install the handler for signal {}", signal);
}

int preemption_signal() {
  return requested_by.load(std::memory_order_relaxed);
}

void request_preemption(int signal) {
  int none = 0;
  requested_by.compare_exchange_strong(none, signal, std::memory_order_relaxed);
}

StopAgreement::StopAgreement(MpiComm& comm)
    : board_(comm.board()),
      timeout_s_(comm.timeout()),
      all_(static_cast<size_t>(comm.size())),
      figures_(static_cast<size_t>(comm.size())) {
  if (comm.size() > 1) comm_ = comm.duplicate("the stop agreement's communicator");
}

StopAgreement::~StopAgreement() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (comm_ == MPI_COMM_NULL) return;
  // Left started only by an error that every rank raised in the same step (so every rank
  // started it and it completes); a moment's grace, then it is left to MPI.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  int done = request_ == MPI_REQUEST_NULL ? 1 : 0;
  while (!done && std::chrono::steady_clock::now() < give_up) {
    if (MPI_Test(&request_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    if (!done) std::this_thread::sleep_for(kPoll);
  }
  if (done) MPI_Comm_free(&comm_);
}

void StopAgreement::start(int signal, double figure) {
  RINGTRAIN_CHECK(!started_, "StopAgreement::start twice without finish");
  mine_ = {.signal = signal, .figure = figure};
  started_ = true;
  if (comm_ == MPI_COMM_NULL) {
    all_.front() = mine_;
    return;
  }
  // Bytes: the contribution is a plain struct, the same layout on every rank of one build.
  RINGTRAIN_CHECK_MPI(MPI_Iallgather(&mine_, sizeof(Contribution), MPI_BYTE, all_.data(),
                                     sizeof(Contribution), MPI_BYTE, comm_, &request_));
}

int StopAgreement::finish() {
  RINGTRAIN_CHECK(started_, "StopAgreement::finish without start");
  started_ = false;
  if (comm_ != MPI_COMM_NULL) wait();
  int any = 0;
  for (size_t r = 0; r < all_.size(); ++r) {
    any = std::max(any, static_cast<int>(all_[r].signal));
    figures_[r] = all_[r].figure;
  }
  return any;
}

void StopAgreement::wait() {
  int done = 0;
  RINGTRAIN_CHECK_MPI(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
  if (!done) {
    const PhaseScope phase(board_, "stop agreement");
    const WaitScope post(board_, "the stop agreement", -1);
    StallDeadline deadline(board_, timeout_s_);  // the backstop behind the watchdog
    while (!done) {
      std::this_thread::sleep_for(kPoll);
      RINGTRAIN_CHECK_MPI(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
      RINGTRAIN_CHECK(done || !deadline.passed(),
                      "no progress for {:g} s in the stop agreement: did every rank reach this "
                      "step?",
                      timeout_s_);
    }
  }
}

}  // namespace ringtrain
