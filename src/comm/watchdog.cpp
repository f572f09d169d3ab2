// The collective watchdog (see watchdog.h).
#include "ringtrain/watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>
#include <vector>

#include <spdlog/spdlog.h>

#include "ringtrain/check.h"

namespace ringtrain {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kQueryTag = 1;
constexpr int kReplyTag = 2;
constexpr auto kPollInterval = std::chrono::milliseconds(20);

// A board snapshot as it travels between watchdogs: fixed size, labels copied in.
struct WireState {
  int64_t step = -1;
  int32_t waiting = 0;
  int32_t peer = -1;
  double waiting_s = 0.0;
  double step_s = 0.0;
  char phase[64] = {};
  char waiting_on[32] = {};
};

void copy_label(char* out, size_t capacity, const char* label) {
  std::strncpy(out, label, capacity - 1);
  out[capacity - 1] = '\0';
}

WireState to_wire(const ProgressBoard::Snapshot& s) {
  WireState w;
  w.step = s.step;
  w.waiting = s.waiting ? 1 : 0;
  w.peer = s.peer;
  w.waiting_s = s.waiting_s;
  w.step_s = s.step_s;
  copy_label(w.phase, sizeof(w.phase), s.phase);
  copy_label(w.waiting_on, sizeof(w.waiting_on), s.waiting_on);
  return w;
}

std::string describe_wait(const WireState& w) {
  return w.peer >= 0 ? fmt::format("{} rank {}", w.waiting_on, w.peer) : std::string(w.waiting_on);
}

// An answer in flight keeps its buffer until MPI is done with it.
struct PendingReply {
  WireState state;
  MPI_Request request = MPI_REQUEST_NULL;
};

}  // namespace

struct CollectiveWatchdog::PendingReplies {
  std::list<PendingReply> replies;
};

CollectiveWatchdog::CollectiveWatchdog(MpiComm& comm, double timeout_s)
    : comm_(comm), timeout_s_(timeout_s), pending_(std::make_unique<PendingReplies>()) {
  RINGTRAIN_CHECK(timeout_s > 0, "--collective-timeout must be positive, got {}", timeout_s);
  RINGTRAIN_CHECK_MPI(MPI_Comm_dup(comm.handle(), &watch_));
  RINGTRAIN_CHECK_MPI(MPI_Comm_set_errhandler(watch_, MPI_ERRORS_RETURN));
  RINGTRAIN_CHECK_MPI(
      MPI_Irecv(&query_from_, 1, MPI_INT, MPI_ANY_SOURCE, kQueryTag, watch_, &query_));
  thread_ = std::thread([this] { loop(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (query_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&query_);
    MPI_Wait(&query_, MPI_STATUS_IGNORE);
  }
  // Answers are a few bytes, sent eagerly: they complete locally; give them a moment, then
  // leave any that do not (their peer is gone) to MPI.
  auto& pending_replies = pending_->replies;
  const auto give_up = Clock::now() + std::chrono::milliseconds(200);
  while (!pending_replies.empty() && Clock::now() < give_up) {
    for (auto it = pending_replies.begin(); it != pending_replies.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? pending_replies.erase(it) : std::next(it);
    }
  }
  MPI_Comm_free(&watch_);
}

void CollectiveWatchdog::serve_queries() {
  auto& pending_replies = pending_->replies;
  for (auto it = pending_replies.begin(); it != pending_replies.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? pending_replies.erase(it) : std::next(it);
  }
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Test(&query_, &arrived, &status) != MPI_SUCCESS || !arrived) return;
    PendingReply& reply = pending_replies.emplace_back();
    reply.state = to_wire(comm_.board().snapshot());
    MPI_Isend(&reply.state, sizeof(WireState), MPI_BYTE, status.MPI_SOURCE, kReplyTag, watch_,
              &reply.request);
    if (MPI_Irecv(&query_from_, 1, MPI_INT, MPI_ANY_SOURCE, kQueryTag, watch_, &query_) !=
        MPI_SUCCESS) {
      query_ = MPI_REQUEST_NULL;
      return;
    }
  }
}

void CollectiveWatchdog::loop() {
  while (!stop_.load()) {
    serve_queries();
    const ProgressBoard::Snapshot mine = comm_.board().snapshot();
    if (mine.waiting && mine.waiting_s > timeout_s_) report_and_abort(mine);
    std::this_thread::sleep_for(kPollInterval);
  }
}

void CollectiveWatchdog::report_and_abort(const ProgressBoard::Snapshot& mine) {
  const int me = comm_.rank(), ranks = comm_.size();
  // Long enough for a live watchdog (it polls every 20 ms), short enough to end the job soon.
  const double grace_s = std::clamp(timeout_s_ / 2.0, 1.0, 5.0);
  std::vector<WireState> states(static_cast<size_t>(ranks));
  std::vector<MPI_Request> replies(static_cast<size_t>(ranks), MPI_REQUEST_NULL);
  std::vector<MPI_Request> questions(static_cast<size_t>(ranks), MPI_REQUEST_NULL);
  std::vector<bool> answered(static_cast<size_t>(ranks), false);
  int asker = me;
  for (int p = 0; p < ranks; ++p) {
    if (p == me) continue;
    const auto i = static_cast<size_t>(p);
    MPI_Irecv(&states[i], sizeof(WireState), MPI_BYTE, p, kReplyTag, watch_, &replies[i]);
    MPI_Isend(&asker, 1, MPI_INT, p, kQueryTag, watch_, &questions[i]);
  }
  const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(grace_s));
  int missing = ranks - 1;
  while (missing > 0 && Clock::now() < give_up) {
    serve_queries();  // other ranks may be asking at the same time
    for (int p = 0; p < ranks; ++p) {
      const auto i = static_cast<size_t>(p);
      if (p == me || answered[i]) continue;
      int done = 0;
      if (MPI_Test(&replies[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        answered[i] = true;
        --missing;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  states[static_cast<size_t>(me)] = to_wire(comm_.board().snapshot());
  answered[static_cast<size_t>(me)] = true;

  const WireState& own = states[static_cast<size_t>(me)];
  std::string waiting_ranks, not_reached, silent, lines;
  const auto append = [](std::string& list, int rank) {
    list += fmt::format("{}{}", list.empty() ? "" : ", ", rank);
  };
  for (int p = 0; p < ranks; ++p) {
    const auto i = static_cast<size_t>(p);
    const WireState& s = states[i];
    std::string line;
    if (!answered[i]) {
      append(silent, p);
      line = fmt::format("no answer within {:.0f} s: the process died or is hung", grace_s);
    } else if (s.waiting && s.step == mine.step && std::strcmp(s.phase, mine.phase) == 0) {
      append(waiting_ranks, p);
      line = fmt::format("step {}, waiting {:.1f} s in the {} on {}: not completed", s.step,
                         s.waiting_s, s.phase, describe_wait(s));
    } else if (s.waiting) {
      append(not_reached, p);
      line = fmt::format(
          "step {}, waiting {:.1f} s in another collective, the {} on {}: the "
          "ranks disagree on the order of collectives",
          s.step, s.waiting_s, s.phase, describe_wait(s));
    } else {
      append(not_reached, p);
      line = fmt::format(
          "step {}, not in a collective (busy {:.1f} s into the step, last in "
          "the {}): has not reached it",
          s.step, s.step_s, s.phase);
    }
    lines += fmt::format("\n  rank {}: {}", p, line);
  }
  spdlog::error(
      "watchdog: the {} at step {} made no progress for {:.1f} s (--collective-timeout {:g}): "
      "rank {} waits on {}.{}\n  not completed on rank(s) {}{}{}; ending the job (exit code {})",
      mine.phase, mine.step, mine.waiting_s, timeout_s_, me, describe_wait(own), lines,
      waiting_ranks.empty() ? "none" : waiting_ranks,
      not_reached.empty() ? "" : "; not reached by rank(s) " + not_reached,
      silent.empty() ? "" : "; no answer from rank(s) " + silent,
      static_cast<int>(ExitCode::kCommFailure));
  spdlog::default_logger()->flush();
  MpiSession::abort_job(static_cast<int>(ExitCode::kCommFailure));
}

}  // namespace ringtrain
