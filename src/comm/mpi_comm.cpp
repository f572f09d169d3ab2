// MPI for host memory: the session and the Comm over a private duplicate of MPI_COMM_WORLD.
//
// Requests live in a slot table (requests_, free slots reused), so the ring's steady state
// allocates nothing. wait() never blocks inside MPI: it polls MPI_Test, spinning for the first
// spin_ (1 ms by default: a neighbour's message is usually that close) and then sleeping 50 us
// between polls, so that a dead peer turns into an error naming it after
// RINGTRAIN_COMM_TIMEOUT_S seconds without progress (StallDeadline: this rank's or, as the
// watchdog confirms, the job's; a stopped process's gap does not count) instead of a silent
// hang. Broadcasts and MPI_Allreduce move in pieces of 4 MiB, each completing being progress,
// so that one long collective that is still moving is never taken for a stalled one. Even
// the set-up collectives are bounded: the duplicates use MPI_Comm_idup, and MPI_Comm_split /
// MPI_Comm_split_type (no non-blocking form) follow a barrier polled under the deadline.
//
// The overlap engine's communication thread shares the cores with computation and sets a 50 us
// spin (set_spin_before_sleep): spinning for 1 ms there halved the wide MLP's bandwidth over
// the emulated network, while for a bare allreduce the short spin halved the ring's busbw at
// 2-16 MiB.
#include "ringtrain/mpi_comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

namespace ringtrain {

namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultTimeoutS = 600.0;
// About 11.6 days: above --collective-timeout's week + 30 s, far below where a deadline in
// int64 steady_clock nanoseconds overflows (about 292 years).
constexpr double kMaxTimeoutS = 1e6;
constexpr auto kBackoff = std::chrono::microseconds(50);
// How long a timed-out wait() waits for its cancelled request to let go of the buffer.
constexpr auto kCancelGrace = std::chrono::milliseconds(200);
// Broadcasts and MPI_Allreduce move big buffers in pieces no larger than this: well under a
// second even on a slow link (4 ms at 1 GB/s, 34 ms at 1 Gbit/s), so each piece completing
// tells the watchdog the collective is moving; and not slower at 64 MiB than one call
// (docs/failures.md has the measurements).
constexpr size_t kPieceBytes = size_t{4} << 20;
constexpr size_t kPieceFloats = kPieceBytes / sizeof(float);

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

bool mpi_initialized() {
  int flag = 0;
  return MPI_Initialized(&flag) == MPI_SUCCESS && flag != 0;
}

bool mpi_finalized() {
  int flag = 0;
  return MPI_Finalized(&flag) == MPI_SUCCESS && flag != 0;
}

double timeout_from_env() {
  const char* text = std::getenv("RINGTRAIN_COMM_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return kDefaultTimeoutS;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(seconds) || seconds <= 0 ||
      seconds > kMaxTimeoutS)
    throw Error(
        fmt::format("RINGTRAIN_COMM_TIMEOUT_S='{}' must be a number of seconds in (0, {:g}]", text,
                    kMaxTimeoutS),
        ExitCode::kUsage, /*on_every_rank=*/true);
  return seconds;
}

// The progress board's time base (steady_clock nanoseconds) of a time already read.
int64_t board_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

const char* direction(bool send) {
  return send ? "a send to" : "a receive from";
}

}  // namespace

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(length));
}

// ---- session ----

MpiSession::MpiSession(int* argc, char*** argv, int required) {
  RINGTRAIN_CHECK(!mpi_finalized(),
                  "MPI was already finalized in this process; it cannot start again");
  if (mpi_initialized()) {
    // Someone else (a test harness, a host program) owns MPI: use it, never finalize it.
    RINGTRAIN_CHECK_MPI(MPI_Query_thread(&provided_));
  } else {
    RINGTRAIN_CHECK_MPI(MPI_Init_thread(argc, argv, required, &provided_));
    finalize_ = true;
  }
  if (provided_ < required) {
    if (finalize_) MPI_Finalize();
    finalize_ = false;
    RINGTRAIN_FAIL(
        "MPI provides thread level {} but ringtrain needs {} (the communication thread calls MPI "
        "while the main thread may too); use an MPI built with thread support",
        thread_level_name(provided_), thread_level_name(required));
  }
}

MpiSession::~MpiSession() {
  // Nothing here may throw; a failing MPI_Finalize has nobody left to tell.
  if (finalize_ && !mpi_finalized()) MPI_Finalize();
}

void MpiSession::abort_job(int exit_code) {
  // _Exit and MPI_Abort skip stdio's flush; keep the last log lines that explain the abort.
  std::cout.flush();
  std::fflush(nullptr);
  if (mpi_initialized() && !mpi_finalized()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

// ---- communicator ----

MpiComm::MpiComm() : MpiComm(timeout_from_env()) {}

MpiComm::MpiComm(double timeout_s) {
  RINGTRAIN_CHECK(mpi_initialized() && !mpi_finalized(),
                  "MpiComm needs MPI running: create an MpiSession first");
  set_timeout(timeout_s);
  RINGTRAIN_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  RINGTRAIN_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  MPI_Request request;
  RINGTRAIN_CHECK_MPI(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request));
  try {
    complete_collective(request, "MPI_Comm_idup of the world");
  } catch (...) {
    comm_ = MPI_COMM_NULL;  // never completed: nothing to free
    throw;
  }
  init_from_comm(/*world=*/true);
}

MpiComm::MpiComm(MpiComm& parent, int color, int key)
    : timeout_s_(parent.timeout_s_), piece_delay_(parent.piece_delay_) {
  post_on_board_of(parent);  // the watchdog reads the parent's board
  MPI_Request request;
  RINGTRAIN_CHECK_MPI(MPI_Ibarrier(parent.comm_, &request));
  parent.complete_collective(request, "the barrier before MPI_Comm_split");
  {
    const WaitScope post(board(), "MPI_Comm_split", -1);
    RINGTRAIN_CHECK_MPI(MPI_Comm_split(parent.comm_, color, key, &comm_));
  }
  init_from_comm(/*world=*/false);
}

namespace {
// The launcher's word for the world's node-local rank and size (Open MPI), if it gives one.
bool local_from_launcher(int& local_rank, int& local_size) {
  const char* rank_text = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* size_text = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (rank_text == nullptr || size_text == nullptr) return false;
  char *rank_end = nullptr, *size_end = nullptr;
  const long r = std::strtol(rank_text, &rank_end, 10);
  const long n = std::strtol(size_text, &size_end, 10);
  if (rank_end == rank_text || *rank_end != '\0' || size_end == size_text || *size_end != '\0' ||
      n < 1 || r < 0 || r >= n || n > INT_MAX)
    return false;
  local_rank = static_cast<int>(r);
  local_size = static_cast<int>(n);
  return true;
}
}  // namespace

void MpiComm::init_from_comm(bool world) {
  try {
    RINGTRAIN_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    RINGTRAIN_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    RINGTRAIN_CHECK_MPI(MPI_Comm_size(comm_, &size_));
    // The launcher's numbers describe MPI_COMM_WORLD only, and only when it spans the job.
    if (world && local_from_launcher(local_rank_, local_size_) && local_size_ <= size_) return;
    barrier();  // every rank has arrived: the blocking split below cannot wait on a straggler
    MPI_Comm node = MPI_COMM_NULL;
    {
      const WaitScope post(board(), "MPI_Comm_split_type", -1);
      RINGTRAIN_CHECK_MPI(
          MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    }
    const int rank_code = MPI_Comm_rank(node, &local_rank_);
    const int size_code = MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    RINGTRAIN_CHECK_MPI(rank_code);
    RINGTRAIN_CHECK_MPI(size_code);
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

MPI_Comm MpiComm::duplicate(const char* what) {
  MPI_Comm copy = MPI_COMM_NULL;
  MPI_Request request;
  RINGTRAIN_CHECK_MPI(MPI_Comm_idup(comm_, &copy, &request));
  complete_collective(request, what);  // on a throw the copy never completed: nothing to free
  const int code = MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN);
  if (code != MPI_SUCCESS) {
    MPI_Comm_free(&copy);
    RINGTRAIN_CHECK_MPI(code);
  }
  return copy;
}

MpiComm::~MpiComm() {
  // Requests abandoned by a timed-out wait() may still hold the communicator; MPI frees it once
  // they are gone, so freeing here is safe.
  if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
}

int64_t MpiComm::acquire_slot(const Transfer& transfer) {
  int64_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<int64_t>(requests_.size());
    requests_.push_back(MPI_REQUEST_NULL);
    transfers_.push_back(transfer);
    // Reserve now so that releasing a slot later never allocates.
    free_slots_.reserve(requests_.capacity());
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
    transfers_[slot] = transfer;
  }
  return slot;
}

void MpiComm::release_slot(int64_t slot) {
  requests_[slot] = MPI_REQUEST_NULL;
  free_slots_.push_back(slot);
}

void MpiComm::fail_transfer(const Transfer& transfer, const char* call, int code) const {
  RINGTRAIN_FAIL("rank {}: {} for {} rank {} (tag {}, {} floats) failed: {}", rank_, call,
                 direction(transfer.send), transfer.peer, transfer.tag, transfer.count,
                 mpi_error_string(code));
}

CommRequest MpiComm::isend(const float* data, size_t n, int peer, int tag) {
  RINGTRAIN_CHECK(n <= static_cast<size_t>(INT_MAX),
                  "rank {}: a send of {} floats to rank {} (tag {}) is over MPI's int count; "
                  "send it in pieces",
                  rank_, n, peer, tag);
  const Transfer transfer{.send = true, .peer = peer, .tag = tag, .count = n};
  std::lock_guard lock(mutex_);
  const int64_t slot = acquire_slot(transfer);
  const int code =
      MPI_Isend(data, static_cast<int>(n), MPI_FLOAT, peer, tag, comm_, &requests_[slot]);
  if (code != MPI_SUCCESS) {
    release_slot(slot);
    fail_transfer(transfer, "MPI_Isend", code);
  }
  return CommRequest{slot};
}

CommRequest MpiComm::irecv(float* data, size_t n, int peer, int tag) {
  RINGTRAIN_CHECK(n <= static_cast<size_t>(INT_MAX),
                  "rank {}: a receive of {} floats from rank {} (tag {}) is over MPI's int "
                  "count; receive it in pieces",
                  rank_, n, peer, tag);
  const Transfer transfer{.send = false, .peer = peer, .tag = tag, .count = n};
  std::lock_guard lock(mutex_);
  const int64_t slot = acquire_slot(transfer);
  const int code =
      MPI_Irecv(data, static_cast<int>(n), MPI_FLOAT, peer, tag, comm_, &requests_[slot]);
  if (code != MPI_SUCCESS) {
    release_slot(slot);
    fail_transfer(transfer, "MPI_Irecv", code);
  }
  return CommRequest{slot};
}

void MpiComm::wait(CommRequest& request) {
  if (!request.active()) return;
  const int64_t slot = request.id;
  Transfer transfer;
  {
    std::lock_guard lock(mutex_);
    RINGTRAIN_CHECK(
        slot < static_cast<int64_t>(requests_.size()) && requests_[slot] != MPI_REQUEST_NULL,
        "rank {}: wait() on request {}, which is not in flight", rank_, slot);
    transfer = transfers_[slot];
  }
  // Whatever happens below, the caller's handle is spent.
  request.id = -1;
  const WaitScope post(board(), direction(transfer.send), transfer.peer);

  const auto start = Clock::now();
  StallDeadline deadline(board(), timeout_s_);
  MPI_Status status;
  for (;;) {
    int done = 0;
    {
      std::lock_guard lock(mutex_);
      const int code = MPI_Test(&requests_[slot], &done, &status);
      if (code != MPI_SUCCESS) {
        // A request that failed is gone; one that did not stays abandoned in its slot.
        if (requests_[slot] == MPI_REQUEST_NULL) free_slots_.push_back(slot);
        fail_transfer(transfer, "MPI_Test", code);
      }
      if (done) {
        release_slot(slot);
        break;
      }
    }
    const auto now = Clock::now();
    if (deadline.passed(board_ns(now))) {
      // Cancel, so that MPI_Finalize need not wait for the message and the buffer is released;
      // Open MPI cannot cancel a send, which then stays abandoned in its slot (never reused).
      std::unique_lock lock(mutex_);
      MPI_Cancel(&requests_[slot]);
      const auto give_up = Clock::now() + kCancelGrace;
      while (Clock::now() < give_up) {
        done = 0;
        if (MPI_Test(&requests_[slot], &done, &status) != MPI_SUCCESS || done) {
          if (requests_[slot] == MPI_REQUEST_NULL) free_slots_.push_back(slot);
          break;
        }
        lock.unlock();
        std::this_thread::sleep_for(kBackoff);
        lock.lock();
      }
      RINGTRAIN_FAIL(
          "rank {}: no progress for {:g} s on {} rank {} (tag {}); is that rank alive? set "
          "RINGTRAIN_COMM_TIMEOUT_S (mnist_train: --collective-timeout) to wait longer",
          rank_, timeout_s_, direction(transfer.send), transfer.peer, transfer.tag);
    }
    if (now - start >= spin_) std::this_thread::sleep_for(kBackoff);
  }

  if (!transfer.send) {
    // MPI accepts a shorter message than the receive posted; the ring never sends one, so a
    // short message is a bug on the sending side and must not pass as zeros.
    int received = 0;
    RINGTRAIN_CHECK_MPI(MPI_Get_count(&status, MPI_FLOAT, &received));
    RINGTRAIN_CHECK(static_cast<size_t>(received) == transfer.count,
                    "rank {}: received {} floats from rank {} (tag {}) but the receive expects {}",
                    rank_, received, transfer.peer, transfer.tag, transfer.count);
  }
}

void MpiComm::set_timeout(double seconds) {
  RINGTRAIN_CHECK(std::isfinite(seconds) && seconds > 0 && seconds <= kMaxTimeoutS,
                  "the communication timeout must be in (0, {:g}] seconds, got {}", kMaxTimeoutS,
                  seconds);
  timeout_s_ = seconds;
}

void MpiComm::complete_collective(MPI_Request& request, const char* what) {
  const WaitScope post(board(), what, -1);
  const auto start = Clock::now();
  StallDeadline deadline(board(), timeout_s_);
  for (;;) {
    int done = 0;
    RINGTRAIN_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    // A collective cannot be cancelled: the request is abandoned and the job must end, which
    // is what main() does with any error.
    const auto now = Clock::now();
    RINGTRAIN_CHECK(!deadline.passed(board_ns(now)),
                    "rank {}: no progress for {:g} s in {} ({}); did every rank reach it (a rank "
                    "that died, stalled or called another collective)? set "
                    "RINGTRAIN_COMM_TIMEOUT_S (mnist_train: --collective-timeout) to wait longer",
                    rank_, timeout_s_, what, board().snapshot().phase);
    if (now - start >= spin_) std::this_thread::sleep_for(kBackoff);
  }
}

void MpiComm::set_piece_delay_for_tests(double ms) {
  RINGTRAIN_CHECK(std::isfinite(ms) && ms >= 0, "a piece delay of {} ms", ms);
  piece_delay_ = std::chrono::microseconds(static_cast<int64_t>(ms * 1000.0));
}

void MpiComm::delay_piece_for_tests() const {
  if (piece_delay_.count() > 0) std::this_thread::sleep_for(piece_delay_);
}

// The blocking MPI_Allreduce on purpose: it is the library's own algorithm, the baseline the
// ring is measured against (MPI_Iallreduce runs a different implementation in Open MPI), so it
// has no deadline of ours; the ring's own waits do. It runs in pieces, posted on the board as
// a wait, each completing being progress: the watchdog sees a long allreduce move and ends a
// stuck one.
void MpiComm::allreduce_library(float* data, size_t n, ReduceOp op) {
  const WaitScope post(board(), "MPI_Allreduce", -1);
  for (size_t offset = 0; offset < n; offset += kPieceFloats) {
    const auto piece = static_cast<int>(std::min(kPieceFloats, n - offset));
    delay_piece_for_tests();
    RINGTRAIN_CHECK_MPI(
        MPI_Allreduce(MPI_IN_PLACE, data + offset, piece, MPI_FLOAT, MPI_SUM, comm_));
    board().progress();
  }
  if (op == ReduceOp::kAvg) {
    const auto ranks = static_cast<float>(size_);
    for (size_t i = 0; i < n; ++i) data[i] /= ranks;
  }
}

void MpiComm::broadcast(void* data, size_t bytes, int root) {
  RINGTRAIN_CHECK(root >= 0 && root < size_, "broadcast from rank {} in a world of {} ranks", root,
                  size_);
  auto* base = static_cast<char*>(data);
  for (size_t offset = 0; offset < bytes; offset += kPieceBytes) {
    const auto piece = static_cast<int>(std::min(kPieceBytes, bytes - offset));
    // A slow root, as a slow link would make it: the others wait for each piece.
    if (rank_ == root) delay_piece_for_tests();
    MPI_Request request;
    RINGTRAIN_CHECK_MPI(MPI_Ibcast(base + offset, piece, MPI_BYTE, root, comm_, &request));
    complete_collective(request, "a broadcast");  // each piece's completion is progress
  }
}

void MpiComm::allgather(const void* send, void* recv, size_t bytes) {
  RINGTRAIN_CHECK(bytes <= static_cast<size_t>(INT_MAX),
                  "allgather of {} bytes per rank is over MPI's int count", bytes);
  if (bytes == 0) return;
  const auto count = static_cast<int>(bytes);
  MPI_Request request;
  RINGTRAIN_CHECK_MPI(
      MPI_Iallgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_, &request));
  complete_collective(request, "an allgather");
}

void MpiComm::barrier() {
  MPI_Request request;
  RINGTRAIN_CHECK_MPI(MPI_Ibarrier(comm_, &request));
  complete_collective(request, "a barrier");
}

}  // namespace ringtrain
