// Preemption: a batch system's "stop soon" becomes a checkpoint at a step boundary that every
// rank agrees on, and an exit code that says "resume me".
//
// The signals (SIGTERM, SIGUSR1, SIGUSR2) only record themselves: a handler may do nothing
// else safely. Each step, every rank contributes the signal it saw (0: none) to a tiny
// allgather started when the step starts and completed when it ends (StopAgreement), so the
// result, the largest signal, is known on every rank at the same step and all stop after that
// same step, whichever rank saw the signal and whenever. The same allgather carries one figure
// per rank (mnist_train: the previous step's compute time, for the lost-scaling account), so
// that the account adds no collective to a training step. The chief then writes a checkpoint and
// every rank exits with kPreempted (75, EX_TEMPFAIL); the same command line resumes from it.
// docs/failures.md says what Open MPI's mpirun does with each signal.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

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

  // Contributes the signal that asked this rank to stop (0: none) for the current step, and
  // `figure`, which every rank reads in figures() after finish().
  void start(int signal, double figure = 0.0);
  // The same on every rank: the largest signal any rank contributed at this step's start(),
  // or 0 when none asked to stop.
  int finish();
  // After finish(): every rank's figure from this step's start(), in rank order.
  std::span<const double> figures() const { return figures_; }

 private:
  void wait();  // for the allgather, posted on the board, within the transport's deadline
  struct Contribution {
    int32_t signal = 0;
    int32_t unused = 0;
    double figure = 0.0;
  };
  MPI_Comm comm_ = MPI_COMM_NULL;
  ProgressBoard& board_;
  double timeout_s_;
  Contribution mine_;
  std::vector<Contribution> all_;  // one per rank
  std::vector<double> figures_;    // one per rank
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool started_ = false;
};

}  // namespace ringtrain
