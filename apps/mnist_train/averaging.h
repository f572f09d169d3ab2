// How this run averages: one Allreduce, chosen once from --allreduce and the device (the same
// on every rank), and over it either a GradSync (the ring strategy: the gradients in buckets
// while backward runs) or local SGD's parameter averages.
#pragma once

#include <memory>

#include "options.h"
#include "ringtrain/allreduce.h"
#include "ringtrain/exact_sum.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "ringtrain/mpi_comm.h"
#include "run_plan.h"

namespace ringtrain::app {

struct Averaging {
  // --reproducible: the exact sum of the micro-shards, which `allreduce` runs (declared first:
  // the Allreduce keeps a reference to it).
  std::unique_ptr<ExactGradSum> exact_sum;
  std::unique_ptr<Allreduce> allreduce;  // null when nothing is averaged (one rank)
  std::unique_ptr<GradSync> grad_sync;   // null unless plan.average_gradients
  // With a GradSync over several ranks: the milliseconds the Allreduce takes for one step's
  // buckets alone, timed before training (lost_scaling.h; 0 where it cannot be timed alone).
  double reference_ms = 0.0;
};

// Collective (a device Allreduce decides with the other ranks whether they share a GPU, and
// may bootstrap NCCL). Logs one line saying what averages what, and how.
Averaging make_averaging(const Options& o, const RunPlan& plan, MpiComm& comm, Model& model,
                         const Context& ctx);

}  // namespace ringtrain::app
