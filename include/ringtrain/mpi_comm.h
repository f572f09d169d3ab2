// MPI for host memory: the session (init/finalize with a checked threading level) and the
// transport (Comm over a private duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so every
// error comes back as a code that RINGTRAIN_CHECK_MPI turns into a ringtrain::Error).
#pragma once

#include <mpi.h>

#include <mutex>
#include <vector>

#include "ringtrain/check.h"
#include "ringtrain/comm.h"

// RINGTRAIN_CHECK_MPI(MPI_Send(...)): throw with the call, [file:line] and MPI's message.
#define RINGTRAIN_CHECK_MPI(call)                                               \
  do {                                                                          \
    const int ringtrain_mpi_status_ = (call);                                   \
    if (ringtrain_mpi_status_ != MPI_SUCCESS) [[unlikely]]                      \
      ::ringtrain::detail::throw_error(                                         \
          __FILE__, __LINE__,                                                   \
          ::fmt::format("{} failed: {}", #call,                                 \
                        ::ringtrain::mpi_error_string(ringtrain_mpi_status_))); \
  } while (0)

namespace ringtrain {

std::string mpi_error_string(int code);

// RAII for MPI_Init_thread / MPI_Finalize. Asks for `required` (MPI_THREAD_MULTIPLE by
// default, because the communication thread of the overlap engine calls MPI while the main
// thread may too) and throws if the library provides less.
class MpiSession {
 public:
  explicit MpiSession(int* argc, char*** argv, int required = MPI_THREAD_MULTIPLE);
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession();
  int provided() const { return provided_; }
  // Ends every rank of the job now (after a fatal error on this one), so none is left waiting.
  [[noreturn]] static void abort_job(int exit_code);

 private:
  int provided_ = 0;
  bool finalize_ = false;
};

class MpiComm final : public Comm {
 public:
  // Duplicates MPI_COMM_WORLD (MPI_Comm_idup polled under the deadline); needs an MpiSession
  // alive. The deadline is RINGTRAIN_COMM_TIMEOUT_S (else 600 s), or timeout_s.
  MpiComm();
  explicit MpiComm(double timeout_s);
  // Collective over `parent`: the ranks passing the same color form a new communicator,
  // ordered by key (MPI_Comm_split). The parameter-server strategy uses it for the workers'
  // own communicator and for a job communicator with the chief first. Inherits the timeout
  // and posts on the parent's board. MPI_Comm_split and MPI_Comm_split_type have no
  // non-blocking form: each is preceded by a barrier polled under the deadline (so every rank
  // is known to have arrived) and posted on the board while it runs.
  MpiComm(MpiComm& parent, int color, int key);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return "mpi"; }
  CommRequest isend(const float* data, size_t n, int peer, int tag) override;
  CommRequest irecv(float* data, size_t n, int peer, int tag) override;
  void wait(CommRequest& request) override;
  void set_spin_before_sleep(std::chrono::microseconds spin) override { spin_ = spin; }
  // How long wait() and the collectives wait without progress before they throw
  // (RINGTRAIN_COMM_TIMEOUT_S, else 600 s, until set here). Progress is the board's (this
  // rank's, or the job's as the watchdog last confirmed), not one wait's wall time, and a
  // stopped process's gap does not count (StallDeadline, comm.h).
  void set_timeout(double seconds);
  double timeout() const { return timeout_s_; }
  // Testing only (--test-slow-transport-ms): hold every piece of a broadcast and of
  // allreduce_library this long before it moves, as a slow link would. Split communicators
  // inherit it.
  void set_piece_delay_for_tests(double ms);
  void allreduce_library(float* data, size_t n, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t bytes) override;
  void barrier() override;
  MPI_Comm handle() const { return comm_; }
  // Collective: a private duplicate of this communicator with MPI_ERRORS_RETURN, made with
  // MPI_Comm_idup polled under the deadline and posted on the board as `what` (a literal). The
  // caller frees it.
  MPI_Comm duplicate(const char* what);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0, local_size_ = 1;
  // What a request slot carries, so that a stuck or failed wait() can name the message.
  struct Transfer {
    bool send = false;
    int peer = -1;
    int tag = -1;
    size_t count = 0;  // floats
  };
  // Error handler, rank, size and the node's ranks of comm_; for the world's duplicate the
  // launcher's OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE when set, else MPI_Comm_split_type.
  void init_from_comm(bool world);
  int64_t acquire_slot(const Transfer& transfer);  // caller holds mutex_
  void release_slot(int64_t slot);                 // caller holds mutex_
  [[noreturn]] void fail_transfer(const Transfer& transfer, const char* call, int code) const;
  // Polls a non-blocking collective to completion under the same deadline as wait(), so that
  // a rank that never joins (stalled, or in another collective) is an error, not a hang.
  // `what` names it in messages and on the progress board: a string literal.
  void complete_collective(MPI_Request& request, const char* what);
  void delay_piece_for_tests() const;

  std::vector<MPI_Request> requests_;  // slots indexed by CommRequest::id
  std::vector<Transfer> transfers_;    // parallel to requests_
  std::vector<int64_t> free_slots_;
  double timeout_s_ = 600.0;  // wait() gives up after this long (RINGTRAIN_COMM_TIMEOUT_S)
  std::chrono::microseconds spin_{1000};      // wait() polls without pause this long
  std::chrono::microseconds piece_delay_{0};  // --test-slow-transport-ms
  // Guards the slot table, so that point-to-point calls may come from several threads.
  std::mutex mutex_;
};

}  // namespace ringtrain
