// This rank's input, step by step: its slice of each global batch (rank_batch over the
// epoch's shuffled order, the same on every rank). With --accumulate-steps K, a step's global
// batch is K passes' batches, the K consecutive slices of the order that one pass of K times
// the batch would take, so that an optimizer step trains on the same samples whatever K and
// the rank count are. On a GPU with host batches the next step's
// batch is made while the device runs the current one; with --data-on-gpu the training set is
// on the GPU and a step gets only the sample indices.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "options.h"
#include "ringtrain/data.h"
#include "ringtrain/model.h"
#include "ringtrain/timeline.h"
#include "ringtrain/train.h"
#include "run_plan.h"

namespace ringtrain::app {

class BatchFeed {
 public:
  BatchFeed(const Options& o, const RunPlan& plan, const Dataset& train, const Model& model,
            int rank, int ranks);
  BatchFeed(const BatchFeed&) = delete;
  BatchFeed& operator=(const BatchFeed&) = delete;
  // A device step with host batches makes the next batch in workspace.while_device_runs (set
  // once: nothing is allocated per step).
  void attach(StepWorkspace& workspace);
  // The inputs of `step`, one per pass (valid until the next call). --test-nan-rank's NaN
  // goes in the first pass's batch.
  std::span<const StepInput> inputs(int64_t step);
  // --timeline: making each step's batches is recorded there as "data" (null: nowhere).
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

 private:
  std::span<const int64_t> indices_of(int64_t step, int64_t pass = 0);

  const Options& o_;
  const RunPlan& plan_;
  const Dataset& train_;
  int rank_, ranks_;
  bool on_gpu_;
  EpochSampler sampler_;
  std::vector<Batch> pass_batches_;  // one per pass; inputs_[k] points at pass_batches_[k]
  std::vector<StepInput> inputs_;
  Batch next_batch_;              // device steps: the next step's batch, made meanwhile
  int64_t next_batch_step_ = -1;  // the step whose batch next_batch_ holds (-1: none)
  int64_t current_step_ = -1;
  std::shared_ptr<const DeviceDataset> device_train_;  // --data-on-gpu
  Timeline* timeline_ = nullptr;
};

}  // namespace ringtrain::app
