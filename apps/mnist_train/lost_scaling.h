// Where a data-parallel step's time goes beyond computing, step by step (docs/overlap.md,
// "Lost scaling"): waiting for the slowest rank, exposed communication, and how fast the
// communication ran against the same Allreduce alone.
//
// Each rank knows its own step: "compute", the time from the end of its previous train_step
// (a moment the ranks pass together: that step's last allreduce ends everywhere at once) to the
// end of this one, less the time it waited in GradSync::finish; so everything the rank did
// but wait (data, forward, backward, the optimizer, which costs every rank the same, and
// whatever else came between: an evaluation, the chief's checkpoint write, a stall); and that
// wait ("exposed"). What it cannot see alone is how much of the wait was the slowest rank
// still busy: the ring cannot finish before every rank has handed in its last bucket. So every
// rank tells the others its compute time, in the tiny allgather the step already makes for the
// stop agreement (preemption.h), one step late (a step's compute time is known only at its
// end, after that step's exchange started): during training the account adds no collective
// (one more round of the agreement after the last step, and the reference timing before the
// first). Then for a step, on rank r:
//   waiting for the slowest = max_j compute_j - compute_r
//   exposed communication   = exposed_r - waiting (at least 0): the wire's time after the
//                             last rank was ready, which no overlap hid
// and the slowest rank (the last to hand in its gradients) is the j of the largest compute_j. This
// assumes the ranks start a step together, which they do within the allgather's skew: a step ends
// on every rank when the same last allreduce completes.
//
// Bandwidth: the step's communication time (the buckets' allreduces, GradSync's comm_ms) less
// the waiting moves the gradient buffer at some bus bandwidth; before training, the same
// Allreduce times each bucket size alone, as allreduce_bench does (warm-up, back-to-back calls
// between barriers, the slowest rank, the median of repeats), and the account reports the
// achieved bandwidth against that reference.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/allreduce.h"
#include "ringtrain/comm.h"
#include "ringtrain/grad_sync.h"

namespace ringtrain::app {

class LostScaling {
 public:
  // `rank` of `ranks`; `gradient_bytes`: the buffer one step averages.
  LostScaling(int rank, int ranks, int64_t gradient_bytes);
  // One step's figures: every rank's compute time (ms, rank order) and this rank's exposed
  // time and communication time (GradSync's comm_ms) of the same step.
  void add(std::span<const double> compute_ms, double exposed_ms, double comm_ms);
  int64_t steps() const { return steps_; }
  double mean_wait_ms() const { return mean(wait_ms_); }
  double mean_exposed_ms() const { return mean(exposed_ms_); }  // the wait excluded
  double mean_comm_ms() const { return mean(comm_ms_); }        // the wait excluded
  // The rank whose backward finished last most often (the lowest on a tie), and the share of
  // steps it was last in; -1 and 0 before any step.
  int slowest_rank() const;
  double slowest_share() const;
  // Bus bandwidth (GB/s, nccl-tests' definition: 2 (N-1)/N x bytes / time) of the step's
  // communication, the wait excluded; 0 without communication.
  double achieved_busbw_gbps() const;
  // The figures since the last call (for the periodic metrics records), then starts anew.
  struct Window {
    int64_t steps = 0;
    double wait_ms = 0, exposed_ms = 0;
    int slowest_rank = -1;
  };
  Window take_window();

 private:
  double mean(double total) const { return steps_ ? total / static_cast<double>(steps_) : 0.0; }
  int rank_, ranks_;
  int64_t gradient_bytes_;
  int64_t steps_ = 0;
  double wait_ms_ = 0, exposed_ms_ = 0, comm_ms_ = 0;
  std::vector<int64_t> last_counts_;  // per rank: steps it was the last to finish backward
  Window window_;
  std::vector<int64_t> window_last_counts_;
};

// The reference: the milliseconds `allreduce` takes for one step's `buckets` when it runs
// alone (the sum over buckets of each size's median time), timed as allreduce_bench times
// (see above) on a scratch buffer. Collective: every rank calls it with the same buckets.
// Host kinds only (a device kind queues without waiting; the exact ring has no stand-alone
// run): returns 0 for the others.
double time_buckets_alone(Comm& comm, Allreduce& allreduce, const std::vector<Bucket>& buckets);

// The bus bandwidth, GB/s, of averaging `bytes` over `ranks` in `ms` (0 when ms is 0).
double bus_bandwidth_gbps(int64_t bytes, int ranks, double ms);

}  // namespace ringtrain::app
