// This rank's replica beyond the model's parameters: the optimizer and the weight average
// (--ema-decay), started from the checkpoint being resumed or from the chief's initial
// parameters, and the checkpoint of the whole replica.
#pragma once

#include <memory>
#include <optional>

#include "checkpoint_writer.h"
#include "options.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/comm.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "run_plan.h"

namespace ringtrain::app {

struct Replica {
  std::unique_ptr<Optimizer> optimizer;
  std::optional<WeightEma> ema;
};

// Collective without a checkpoint (the chief initialises, everyone receives its bits). With
// one, every rank loads the same verified bytes: identical replicas without a broadcast.
Replica start_replica(const Options& o, const RunPlan& plan, Comm& comm, Model& model,
                      const Context& ctx, const std::optional<Checkpoint>& resumed);

// The replica at `step` as a checkpoint (explicit copies from either device).
Checkpoint replica_checkpoint(const CheckpointHeader& header, int64_t step, const Model& model,
                              Replica& replica);

}  // namespace ringtrain::app
