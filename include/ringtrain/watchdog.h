// The collective watchdog: ends a job whose collective has stopped making progress, and says
// where every rank is.
//
// Each rank runs one watchdog thread. It reads this rank's ProgressBoard (comm.h) every 20 ms;
// when the rank has waited in one transport wait (a ring message, a broadcast, MPI_Allreduce,
// ...) longer than the timeout, it asks every other rank's watchdog for its board over a
// private communicator, waits a short grace for the answers, logs one report naming the
// collective, the step and each rank's state (waiting in it; not reached it, and busy with
// what; or no answer: dead or hung) and ends the job with ExitCode::kCommFailure. The
// watchdog threads answer each other's questions whatever their main threads are doing, so a
// rank that is stalled in computation still says so. Inspired by Horovod's stall inspector,
// but it needs no coordinator and acts on the first stuck wait.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include <mpi.h>

#include "ringtrain/mpi_comm.h"

namespace ringtrain {

class CollectiveWatchdog {
 public:
  // Collective over comm (it duplicates the communicator). timeout_s > 0.
  CollectiveWatchdog(MpiComm& comm, double timeout_s);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;
  double timeout() const { return timeout_s_; }

 private:
  void loop();
  void serve_queries();  // answers every question that has arrived, without blocking
  [[noreturn]] void report_and_abort(const ProgressBoard::Snapshot& mine);

  MpiComm& comm_;
  MPI_Comm watch_ = MPI_COMM_NULL;
  double timeout_s_;
  std::atomic<bool> stop_{false};
  int query_from_ = -1;  // receive buffer of the posted question: the asking rank
  MPI_Request query_ = MPI_REQUEST_NULL;
  struct PendingReplies;  // answers in flight (watchdog.cpp); the watchdog thread's alone
  std::unique_ptr<PendingReplies> pending_;
  std::thread thread_;
};

}  // namespace ringtrain
