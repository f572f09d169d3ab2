// Preemption: a batch system's "stop soon" becomes a checkpoint at a step boundary that every
// rank agrees on, and an exit code that says "resume me".
//
// The signals (SIGTERM, SIGUSR1, SIGUSR2) only record themselves: a handler may do nothing
// else safely. Each step, every rank contributes the signal it saw (0: none) to a one-integer
// max-allreduce started when the step starts and completed when it ends (StopAgreement), so the
// result is known on every rank at the same step and all stop after that same step, whichever
// rank saw the signal and whenever. The chief then writes a checkpoint and every rank exits with
// kPreempted (75, EX_TEMPFAIL); the same command line resumes from it. docs/failures.md says what
// Open MPI's mpirun does with each signal.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "ringtrain/mpi_comm.h"

namespace ringtrain {

// Installs the handlers (idempotent). From then on SIGTERM, SIGUSR1 and SIGUSR2 request a stop
// instead of ending the process; repeating one changes nothing (the batch system's SIGKILL
// ends a job that does not stop in time).
void install_preemption_handlers();
// The signal that requested a stop, or 0.
int preemption_signal();
// Testing only: behaves as if `signal` had arrived.
void request_preemption(int signal);

// One agreement per step over a private duplicate of a communicator (so it never interleaves
// with the collectives of the step's other threads). Collective: every rank constructs it, and
// calls start() and finish() once per step in the same order.
class StopAgreement {
 public:
  // One rank needs no communication. The wait in finish() is posted on comm's board.
  explicit StopAgreement(MpiComm& comm);
  ~StopAgreement();
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;

  // Contributes the signal that asked this rank to stop (0: none) for the current step.
  void start(int signal);
  // The same on every rank: the largest signal any rank contributed at this step's start(),
  // or 0 when none asked to stop.
  int finish();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  ProgressBoard& board_;
  double timeout_s_;
  int32_t mine_ = 0, any_ = 0;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool started_ = false;
};

}  // namespace ringtrain
