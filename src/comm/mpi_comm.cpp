// MPI for host memory: the session and the Comm over a private duplicate of MPI_COMM_WORLD.
//
// Requests live in a slot table (requests_, free slots reused), so the ring's steady state
// allocates nothing. wait() never blocks inside MPI: it polls MPI_Test, spinning for the first
// spin_ (1 ms by default: a neighbour's message is usually that close) and then sleeping 50 us
// between polls, so that a dead peer turns into an error naming it after
// RINGTRAIN_COMM_TIMEOUT_S seconds instead of a silent hang. The overlap engine's
// communication thread shares the cores with computation and sets a 50 us spin
// (set_spin_before_sleep): spinning for 1 ms there halved the wide MLP's bandwidth over the
// emulated network, while for a bare allreduce the short spin halved the ring's busbw at 2-16 MiB.
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
constexpr auto kBackoff = std::chrono::microseconds(50);
// How long a timed-out wait() waits for its cancelled request to let go of the buffer.
constexpr auto kCancelGrace = std::chrono::milliseconds(200);
// MPI counts are int; collectives move big buffers in pieces no larger than this.
constexpr size_t kMaxPieceBytes = size_t{1} << 30;
constexpr size_t kMaxPieceFloats = kMaxPieceBytes / sizeof(float);

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
  RINGTRAIN_CHECK(end != text && *end == '\0' && std::isfinite(seconds) && seconds > 0,
                  "RINGTRAIN_COMM_TIMEOUT_S='{}' is not a positive number of seconds", text);
  return seconds;
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

MpiComm::MpiComm() : timeout_s_(timeout_from_env()) {
  RINGTRAIN_CHECK(mpi_initialized() && !mpi_finalized(),
                  "MpiComm needs MPI running: create an MpiSession first");
  RINGTRAIN_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  init_from_comm();
}

MpiComm::MpiComm(const MpiComm& parent, int color, int key) : timeout_s_(parent.timeout_s_) {
  RINGTRAIN_CHECK_MPI(MPI_Comm_split(parent.comm_, color, key, &comm_));
  init_from_comm();
}

void MpiComm::init_from_comm() {
  try {
    RINGTRAIN_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    RINGTRAIN_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    RINGTRAIN_CHECK_MPI(MPI_Comm_size(comm_, &size_));
    MPI_Comm node = MPI_COMM_NULL;
    RINGTRAIN_CHECK_MPI(
        MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
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
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(timeout_s_));
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
    if (now >= deadline) {
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
  RINGTRAIN_CHECK(std::isfinite(seconds) && seconds > 0,
                  "the communication timeout must be a positive number of seconds, got {}",
                  seconds);
  timeout_s_ = seconds;
}

void MpiComm::complete_collective(MPI_Request& request, const char* what) {
  const WaitScope post(board(), what, -1);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(timeout_s_));
  for (;;) {
    int done = 0;
    RINGTRAIN_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const auto now = Clock::now();
    // A collective cannot be cancelled: the request is abandoned and the job must end, which
    // is what main() does with any error.
    RINGTRAIN_CHECK(now < deadline,
                    "rank {}: no progress for {:g} s in {} ({}); did every rank reach it (a rank "
                    "that died, stalled or called another collective)? set "
                    "RINGTRAIN_COMM_TIMEOUT_S (mnist_train: --collective-timeout) to wait longer",
                    rank_, timeout_s_, what, board().snapshot().phase);
    if (now - start >= spin_) std::this_thread::sleep_for(kBackoff);
  }
}

// The blocking MPI_Allreduce on purpose: it is the library's own algorithm, the baseline the
// ring is measured against (MPI_Iallreduce runs a different implementation in Open MPI), so it
// has no deadline of ours; the ring's own waits do.
void MpiComm::allreduce_library(float* data, size_t n, ReduceOp op) {
  // Blocking: no deadline of ours, but the watchdog sees the post and ends a stuck job.
  const WaitScope post(board(), "MPI_Allreduce", -1);
  for (size_t offset = 0; offset < n; offset += kMaxPieceFloats) {
    const auto piece = static_cast<int>(std::min(kMaxPieceFloats, n - offset));
    RINGTRAIN_CHECK_MPI(
        MPI_Allreduce(MPI_IN_PLACE, data + offset, piece, MPI_FLOAT, MPI_SUM, comm_));
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
  for (size_t offset = 0; offset < bytes; offset += kMaxPieceBytes) {
    const auto piece = static_cast<int>(std::min(kMaxPieceBytes, bytes - offset));
    MPI_Request request;
    RINGTRAIN_CHECK_MPI(MPI_Ibcast(base + offset, piece, MPI_BYTE, root, comm_, &request));
    complete_collective(request, "a broadcast");
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
