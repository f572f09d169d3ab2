// The collective watchdog (see watchdog.h).
//
// The decision, on one rank, every 20 ms:
//   suspect  = waiting in the transport for longer than the timeout, and no progress known
//              (this rank's own, or another rank's that an answer brought) for the timeout
//   on suspect: ask every rank (one question each; one answer in flight per rank at most);
//     an answer with progress younger than the timeout -> moving: note it on the board (the
//       newest known progress is now that one), ask again when it is a timeout old (and no
//       sooner than a tenth of the timeout, 0.1 to 1 s, from now);
//     this rank made progress meanwhile -> moving;
//     every rank answered, or the grace passed, and none moved -> report and end the job.
// A true stall that begins at time P is therefore ended by about P + timeout (+ that tenth
// when a last answer came just before) + the grace when some rank does not answer.
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

constexpr int kQueryTag = 1;
constexpr int kReplyTag = 2;
constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr auto kAnswerPoll = std::chrono::milliseconds(5);

// A board snapshot as it travels between watchdogs: fixed size, labels copied in.
struct WireState {
  int64_t step = -1;
  int32_t waiting = 0;
  int32_t peer = -1;
  double waiting_s = 0.0;
  double step_s = 0.0;
  double idle_s = 0.0;  // since the answering rank's own last progress
  char phase[64] = {};
  char waiting_on[48] = {};
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
  w.idle_s = s.idle_s;
  copy_label(w.phase, sizeof(w.phase), s.phase);
  copy_label(w.waiting_on, sizeof(w.waiting_on), s.waiting_on);
  return w;
}

std::string describe_wait(const WireState& w) {
  return w.peer >= 0 ? fmt::format("{} rank {}", w.waiting_on, w.peer) : std::string(w.waiting_on);
}

// "step 5", or "set-up" before the first step.
std::string where(int64_t step) {
  return step >= 0 ? fmt::format("step {}", step) : std::string("set-up");
}

// A phase as the report names it: "the gradient allreduce", or "set-up" before any phase.
std::string phase_text(const char* phase) {
  return std::strcmp(phase, kStartingPhase) == 0 ? std::string("set-up")
                                                 : fmt::format("the {}", phase);
}

// What a rank was last in: "the gradient allreduce at step 5", "the configuration check during
// set-up", "set-up".
std::string what_and_when(const char* phase, int64_t step) {
  if (step >= 0) return fmt::format("{} at step {}", phase_text(phase), step);
  if (std::strcmp(phase, kStartingPhase) == 0) return "set-up";
  return fmt::format("the {} during set-up", phase);
}

int64_t to_ns(double seconds) {
  return static_cast<int64_t>(seconds * 1e9);
}

// An answer in flight keeps its buffer until MPI is done with it.
struct PendingReply {
  WireState state;
  MPI_Request request = MPI_REQUEST_NULL;
};

}  // namespace

struct CollectiveWatchdog::State {
  std::list<PendingReply> replies;     // this rank's answers in flight
  std::vector<WireState> answers;      // per rank: the latest answer
  std::vector<MPI_Request> receiving;  // per rank: the receive of its answer, if in flight
  std::vector<MPI_Request> questions;  // per rank: the question's send, if in flight
  std::vector<uint8_t> answered;       // per rank: answered in the current round
  int asker = -1;                      // the question's payload: this rank
  int64_t next_ask_ns = 0;
};

CollectiveWatchdog::CollectiveWatchdog(MpiComm& comm, double timeout_s)
    : comm_(comm),
      timeout_s_(timeout_s),
      // Long enough for a live watchdog (it polls every 20 ms), short enough to end the job soon.
      grace_s_(std::clamp(timeout_s / 2.0, 1.0, 5.0)),
      state_(std::make_unique<State>()) {
  RINGTRAIN_CHECK(timeout_s > 0, "--collective-timeout must be positive, got {}", timeout_s);
  const auto ranks = static_cast<size_t>(comm.size());
  state_->answers.resize(ranks);
  state_->receiving.assign(ranks, MPI_REQUEST_NULL);
  state_->questions.assign(ranks, MPI_REQUEST_NULL);
  state_->answered.assign(ranks, 0);
  state_->asker = comm.rank();
  watch_ = comm.duplicate("the watchdog's MPI_Comm_idup");
  RINGTRAIN_CHECK_MPI(
      MPI_Irecv(&query_from_, 1, MPI_INT, MPI_ANY_SOURCE, kQueryTag, watch_, &query_));
  thread_ = std::thread([this] { loop(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  const auto cancel = [](MPI_Request& request) {
    if (request == MPI_REQUEST_NULL) return;
    MPI_Cancel(&request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  };
  cancel(query_);
  for (MPI_Request& request : state_->receiving) cancel(request);
  // Questions and answers are a few bytes, sent eagerly: they complete locally; give them a
  // moment, then leave any that do not (their peer is gone) to MPI.
  auto& replies = state_->replies;
  auto& questions = state_->questions;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  const auto unfinished = [&] {
    return !replies.empty() || std::any_of(questions.begin(), questions.end(),
                                           [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  };
  while (unfinished() && std::chrono::steady_clock::now() < give_up) {
    for (auto it = replies.begin(); it != replies.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? replies.erase(it) : std::next(it);
    }
    for (MPI_Request& request : questions) {
      int done = 0;
      if (request != MPI_REQUEST_NULL) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    }
  }
  MPI_Comm_free(&watch_);
}

void CollectiveWatchdog::serve_queries() {
  auto& replies = state_->replies;
  for (auto it = replies.begin(); it != replies.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? replies.erase(it) : std::next(it);
  }
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (query_ == MPI_REQUEST_NULL || MPI_Test(&query_, &arrived, &status) != MPI_SUCCESS ||
        !arrived)
      return;
    PendingReply& reply = replies.emplace_back();
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

bool CollectiveWatchdog::collect_replies() {
  State& s = *state_;
  bool moving = false;
  const int me = comm_.rank();
  for (int p = 0; p < comm_.size(); ++p) {
    const auto i = static_cast<size_t>(p);
    if (p == me || s.receiving[i] == MPI_REQUEST_NULL) continue;
    int done = 0;
    if (MPI_Test(&s.receiving[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      s.receiving[i] = MPI_REQUEST_NULL;  // a failed receive: that rank counts as silent
      continue;
    }
    if (!done) continue;
    s.answered[i] = 1;
    if (s.answers[i].idle_s < timeout_s_) {
      // The answer is a few bytes and a few ms old: its rank's progress, on this rank's clock.
      comm_.board().note_job_progress(ProgressBoard::now_ns() - to_ns(s.answers[i].idle_s));
      moving = true;
    }
  }
  return moving;
}

bool CollectiveWatchdog::job_is_moving() {
  State& s = *state_;
  const int me = comm_.rank(), ranks = comm_.size();
  std::fill(s.answered.begin(), s.answered.end(), 0);
  s.answered[static_cast<size_t>(me)] = 1;
  for (int p = 0; p < ranks; ++p) {
    const auto i = static_cast<size_t>(p);
    if (p == me) continue;
    if (s.questions[i] != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&s.questions[i], &done, MPI_STATUS_IGNORE);
    }
    // One question and one answer in flight per rank: a rank that has not answered the last
    // one is not asked again (its answer, if it comes, still counts).
    if (s.receiving[i] != MPI_REQUEST_NULL || s.questions[i] != MPI_REQUEST_NULL) continue;
    if (MPI_Irecv(&s.answers[i], sizeof(WireState), MPI_BYTE, p, kReplyTag, watch_,
                  &s.receiving[i]) != MPI_SUCCESS) {
      s.receiving[i] = MPI_REQUEST_NULL;
      continue;
    }
    if (MPI_Isend(&s.asker, 1, MPI_INT, p, kQueryTag, watch_, &s.questions[i]) != MPI_SUCCESS)
      s.questions[i] = MPI_REQUEST_NULL;
  }
  const int64_t give_up = ProgressBoard::now_ns() + to_ns(grace_s_);
  const int64_t timeout_ns = to_ns(timeout_s_);
  for (;;) {
    serve_queries();  // other ranks may be asking at the same time
    if (collect_replies()) return true;
    const ProgressBoard& board = comm_.board();
    const int64_t now = ProgressBoard::now_ns();
    // This rank moved on meanwhile (its wait completed, or it made other progress).
    if (!board.snapshot().waiting || now - board.known_progress_ns() <= timeout_ns) return true;
    const bool all = std::all_of(s.answered.begin(), s.answered.end(),
                                 [](uint8_t answered) { return answered != 0; });
    if (all || now >= give_up) return false;
    std::this_thread::sleep_for(kAnswerPoll);
  }
}

void CollectiveWatchdog::loop() {
  // Ask again no sooner than this after the job was found moving.
  const int64_t min_reask_ns = to_ns(std::clamp(timeout_s_ / 10.0, 0.1, 1.0));
  const int64_t timeout_ns = to_ns(timeout_s_);
  ProgressBoard& board = comm_.board();
  int64_t last_poll = ProgressBoard::now_ns();
  while (!stop_.load()) {
    const int64_t now = ProgressBoard::now_ns();
    // Polls 20 ms apart came a second or more apart: the process was stopped and has resumed
    // (or was starved of a core that long). Resuming is progress, not a stall.
    if (now - last_poll > kStoppedGapNs) board.progress();
    last_poll = now;
    serve_queries();
    collect_replies();  // late answers count too
    const ProgressBoard::Snapshot mine = board.snapshot();
    if (mine.waiting && mine.waiting_s > timeout_s_ &&
        now - board.known_progress_ns() > timeout_ns && now >= state_->next_ask_ns) {
      if (!job_is_moving()) report_and_abort(mine);
      state_->next_ask_ns = ProgressBoard::now_ns() + min_reask_ns;
      last_poll = ProgressBoard::now_ns();  // asking took a while: that was no suspension
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

void CollectiveWatchdog::report_and_abort(const ProgressBoard::Snapshot& mine) {
  const State& st = *state_;
  const int me = comm_.rank(), ranks = comm_.size();
  std::vector<WireState> states = st.answers;
  states[static_cast<size_t>(me)] = to_wire(comm_.board().snapshot());
  const WireState& own = states[static_cast<size_t>(me)];
  const double idle_s =
      static_cast<double>(ProgressBoard::now_ns() - comm_.board().known_progress_ns()) * 1e-9;

  std::string waiting_ranks, not_reached, silent, lines;
  const auto append = [](std::string& list, int rank) {
    list += fmt::format("{}{}", list.empty() ? "" : ", ", rank);
  };
  for (int p = 0; p < ranks; ++p) {
    const auto i = static_cast<size_t>(p);
    const WireState& s = states[i];
    std::string line;
    if (!st.answered[i]) {
      append(silent, p);
      line = fmt::format("no answer within {:.0f} s: the process died or is hung", grace_s_);
    } else if (s.waiting && s.step == mine.step && std::strcmp(s.phase, mine.phase) == 0) {
      append(waiting_ranks, p);
      line = fmt::format(
          "{}, waiting {:.1f} s in {} on {}, no progress for {:.1f} s: not "
          "completed",
          where(s.step), s.waiting_s, phase_text(s.phase), describe_wait(s), s.idle_s);
    } else if (s.waiting) {
      append(not_reached, p);
      line = fmt::format(
          "{}, waiting {:.1f} s in another collective, {} on {}, no progress for {:.1f} s: "
          "the ranks disagree on the order of collectives",
          where(s.step), s.waiting_s, phase_text(s.phase), describe_wait(s), s.idle_s);
    } else {
      append(not_reached, p);
      const bool set_up = std::strcmp(s.phase, kStartingPhase) == 0;
      line = fmt::format("{}, not in a collective{}, no progress for {:.1f} s: has not reached it",
                         where(s.step),
                         s.step >= 0 ? fmt::format(" (busy {:.1f} s into the step, last in {})",
                                                   s.step_s, phase_text(s.phase))
                         : set_up    ? std::string()
                                     : fmt::format(" (last in the {})", s.phase),
                         s.idle_s);
    }
    lines += fmt::format("\n  rank {}: {}", p, line);
  }
  spdlog::error(
      "watchdog: {} made no progress for {:.1f} s (--collective-timeout {:g}; no rank that "
      "answered made any either): rank {} waits on {}.{}\n  not completed on rank(s) "
      "{}{}{}; ending the job (exit code {})",
      what_and_when(mine.phase, mine.step), idle_s, timeout_s_, me, describe_wait(own), lines,
      waiting_ranks.empty() ? "none" : waiting_ranks,
      not_reached.empty() ? "" : "; not reached by rank(s) " + not_reached + " (stalled)",
      silent.empty() ? "" : "; no answer from rank(s) " + silent,
      static_cast<int>(ExitCode::kCommFailure));
  spdlog::default_logger()->flush();
  MpiSession::abort_job(static_cast<int>(ExitCode::kCommFailure));
}

}  // namespace ringtrain
