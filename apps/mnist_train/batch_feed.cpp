// This rank's input, step by step (see batch_feed.h).
#include "batch_feed.h"

#include <algorithm>
#include <cmath>

#include "ringtrain/distributed.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

BatchFeed::BatchFeed(const Options& o, const RunPlan& plan, const Dataset& train,
                     const Model& model, int rank, int ranks)
    : o_(o),
      plan_(plan),
      train_(train),
      rank_(rank),
      ranks_(ranks),
      on_gpu_(model.device() == Device::kCuda),
      sampler_(train.count, o.seed),
      pass_batches_(static_cast<size_t>(plan.accumulate_steps)) {
  inputs_.reserve(pass_batches_.size());
  for (const Batch& batch : pass_batches_) inputs_.emplace_back(batch);
  if (o.data_on_gpu) {
    device_train_ = upload_dataset(train, model.output_shape().numel());
    spdlog::info("data: the training set is on the GPU ({:.1f} MB); batches are gathered there",
                 static_cast<double>(device_dataset_bytes(*device_train_)) / 1e6);
  }
}

std::span<const int64_t> BatchFeed::indices_of(int64_t step, int64_t pass) {
  // Pass p of step s is the slice (s K + p) of the order at the per-pass global batch.
  const int64_t slice = (step % plan_.steps_per_epoch) * plan_.accumulate_steps + pass;
  return rank_batch(sampler_.order(step / plan_.steps_per_epoch), slice, plan_.batch_size, rank_,
                    ranks_);
}

void BatchFeed::attach(StepWorkspace& workspace) {
  if (!on_gpu_ || device_train_) return;
  // The same batch the next input() would make: the order is a function of the epoch.
  workspace.while_device_runs = [this] {
    const int64_t next = current_step_ + 1;
    if (next >= plan_.total_steps) return;
    const TraceScope data_span(timeline_, TraceKind::kData);
    make_batch(train_, indices_of(next), next_batch_.images, next_batch_.labels);
    next_batch_step_ = next;
  };
}

std::span<const StepInput> BatchFeed::inputs(int64_t step) {
  current_step_ = step;
  const TraceScope data_span(timeline_, TraceKind::kData);
  if (device_train_) {  // gathered on the GPU (one pass: flag_rules.cpp)
    inputs_.front() = StepInput(*device_train_, indices_of(step));
    return inputs_;
  }
  for (size_t pass = 0; pass < pass_batches_.size(); ++pass) {
    Batch& batch = pass_batches_[pass];
    if (pass == 0 && next_batch_step_ == step) {  // made while the GPU ran the previous step
      std::swap(batch, next_batch_);
    } else {
      make_batch(train_, indices_of(step, static_cast<int64_t>(pass)), batch.images, batch.labels);
    }
  }
  if (rank_ == o_.test_nan_rank && std::find(o_.test_nan_steps.begin(), o_.test_nan_steps.end(),
                                             step) != o_.test_nan_steps.end())
    pass_batches_.front().images.data()[0] = std::nanf("");
  return inputs_;
}

}  // namespace ringtrain::app
