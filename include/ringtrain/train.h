// One training step and evaluation, as functions: the loop itself lives in the app's main().
//
// A step is: forward, fused softmax cross-entropy, backward (reporting each finished gradient
// range through on_grad_ready, the hook the gradient averaging attaches to), optimizer step.
// Everything it touches is allocated on the first call and reused after, so a steady-state
// step does not allocate.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ringtrain/bucketer.h"
#include "ringtrain/data.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"

namespace ringtrain {

struct Batch {
  Tensor images;                // [B, rows, cols, 1], scaled to [0, 1]
  std::vector<int32_t> labels;  // [B]
};

struct StepStats {
  double loss = 0.0;    // mean over the batch
  int64_t correct = 0;  // rows whose arg-max matched the label
  int64_t samples = 0;
  CommStats comm;       // zero without a bucketer
  bool updated = true;  // false when before_update skipped the optimizer step
};

struct StepWorkspace {
  Tensor dlogits;  // [B, classes]
};

// With a bucketer, each layer's gradients are handed to it as backward finishes them and the
// optimizer steps only after bucketer->wait(): on averaged gradients, the same on every rank.
// before_update, when given, runs after the gradients are final (averaged) and before the
// optimizer; returning false skips the update (the --check-finite guard).
using BeforeUpdateFn = std::function<bool(const StepStats& stats, std::span<const float> grads)>;
StepStats train_step(Model& model, Optimizer& optimizer, const Batch& batch, float lr,
                     StepWorkspace& workspace, Context& ctx, GradBucketer* bucketer = nullptr,
                     const BeforeUpdateFn& before_update = {});

struct EvalResult {
  int64_t correct = 0;
  int64_t samples = 0;
  double loss_sum = 0.0;  // summed over samples
  double accuracy() const {
    return samples ? static_cast<double>(correct) / static_cast<double>(samples) : 0.0;
  }
  double mean_loss() const { return samples ? loss_sum / static_cast<double>(samples) : 0.0; }
};

// Evaluates samples [begin, end) of `data` in order, in batches of at most batch_size.
EvalResult evaluate(Model& model, const Dataset& data, int64_t begin, int64_t end,
                    int64_t batch_size, Batch& scratch, Context& ctx);

// Writes the flat parameter buffer: the 8 bytes "RTPARAMS", the element count as a
// little-endian uint64, then the float32 values, little-endian. Written to path + ".tmp",
// flushed and renamed, so an existing file is never left half-written.
void save_params(const std::string& path, std::span<const float> params);
// Reads a file written by save_params; throws naming the file if it is not one.
std::vector<float> load_params(const std::string& path);

}  // namespace ringtrain
