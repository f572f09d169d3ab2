// The collective watchdog: ends a job that has stopped making progress, and says where every
// rank is.
//
// Each rank runs one watchdog thread. It reads this rank's ProgressBoard (comm.h) every 20 ms.
// A rank is suspect when it has waited in the transport for longer than the timeout and made
// no progress (comm.h: a wait or a piece of a collective completing, a step, a phase, a layer)
// for as long; the watchdog then asks every other rank's watchdog for its board over a
// private communicator.
// If any rank that answers has made progress within the timeout, the job is moving: the
// watchdog notes that on the board (so that the transports' backstop deadlines wait too) and
// asks again only when that progress is a timeout old. Otherwise, once every rank has answered
// or a short grace has passed, it logs one report naming the collective, the step and each
// rank's state (waiting in it; not reached it, and busy with what; or no answer: dead or hung)
// and ends the job with ExitCode::kCommFailure. The watchdog threads answer each other's
// questions whatever their main threads are doing, so a rank that is stalled in computation
// still says so. A gap between two of its polls much longer than the poll interval means the
// process was stopped (SIGSTOP, a batch system's suspend): the resumption counts as progress.
// Inspired by Horovod's stall inspector, but it needs no coordinator.
//
// It lives from just after the world communicator exists until the job's final barrier, so
// set-up and the chief's last writes are watched like training.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include <mpi.h>

#include "ringtrain/mpi_comm.h"

namespace ringtrain {

class CollectiveWatchdog {
 public:
  // Collective over comm (it duplicates the communicator under comm's deadline). timeout_s > 0.
  CollectiveWatchdog(MpiComm& comm, double timeout_s);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;
  double timeout() const { return timeout_s_; }
  // How long it waits for the other ranks' answers before it judges without them.
  double grace() const { return grace_s_; }

 private:
  void loop();
  void serve_queries();  // answers every question that has arrived, without blocking
  // Asks the other ranks and waits for answers: true when the job is moving (some rank made
  // progress within the timeout, noted on the board); false when it is stalled.
  bool job_is_moving();
  bool collect_replies();  // tests the replies in flight; true if one showed recent progress
  [[noreturn]] void report_and_abort(const ProgressBoard::Snapshot& mine);

  MpiComm& comm_;
  MPI_Comm watch_ = MPI_COMM_NULL;
  double timeout_s_;
  double grace_s_;
  std::atomic<bool> stop_{false};
  int query_from_ = -1;  // receive buffer of the posted question: the asking rank
  MPI_Request query_ = MPI_REQUEST_NULL;
  struct State;  // questions, answers and replies in flight (watchdog.cpp); the thread's alone
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ringtrain
