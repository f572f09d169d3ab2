// One training step and evaluation, as functions: the loop itself lives in the app's main().
//
// A step is: forward, fused softmax cross-entropy, backward (reporting each finished gradient
// range through on_grad_ready, the hook the gradient averaging attaches to), optimizer step.
// Everything it touches is allocated on the first call and reused after, so a steady-state
// step does not allocate.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "ringtrain/data.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"

namespace ringtrain {

struct DeviceStepState;  // the device step's buffers (src/cuda/device_step.h)
class ExactGradSum;      // exact_sum.h
class ProgressBoard;     // progress_board.h
class Timeline;          // timeline.h

struct Batch {
  Tensor images;                // [B, rows, cols, 1], scaled to [0, 1]
  std::vector<int32_t> labels;  // [B]
  // Device evaluation: the buffers that upload this batch, kept with it (made on first use),
  // so that evaluating allocates on the device only when a batch grows.
  std::shared_ptr<DeviceStepState> device;
};

struct StepStats {
  double loss = 0.0;    // mean over the batch
  int64_t correct = 0;  // rows whose arg-max matched the label
  int64_t samples = 0;
  CommStats comm;       // zero without a GradSync
  bool updated = true;  // false when before_update skipped the optimizer step
  // Device steps with a before_update only: whether the averaged gradients were all finite,
  // counted on the device (before_update then gets an empty span: the gradients are device
  // memory). Unset on the CPU, where before_update reads the gradients itself.
  std::optional<bool> grads_finite;
  // Device steps: the step's time on the compute stream, from upload to update, measured with
  // CUDA events (it includes waiting for the communication stream). Unset on the CPU.
  std::optional<double> device_ms;
  // Device steps with StepWorkspace::cuda_graph: whether this step replayed a captured graph
  // (false for the eager steps that precede a capture). Unset on the CPU.
  std::optional<bool> graph_replayed;
};

struct StepWorkspace {
  Tensor dlogits;                           // [B, classes], on the model's device
  std::shared_ptr<DeviceStepState> device;  // device steps: images, labels, loss statistics
  // Device steps without a GradSync (one rank): replay the upload, forward, loss and backward
  // as one captured CUDA graph instead of launching each kernel from the host (mnist_train
  // --cuda-graphs). See train_step.
  bool cuda_graph = false;
  // Device steps: host work to do once the step is queued, before the host waits for it
  // (mnist_train makes the next batch here, so the GPU does not wait for it). Run once per
  // step, at the first wait.
  std::function<void()> while_device_runs;
  // Where the step posts progress for the collective watchdog (watchdog.h): on the CPU after
  // forward, as each gradient piece is finished and after backward; on the GPU, where the
  // host only queues work, the waits for the streams, so that a step stuck behind a peer's
  // NCCL transfer is seen. Null: no posting.
  ProgressBoard* board = nullptr;
  // --reproducible (CPU steps): the batch is exact_sum->local_micro_shards() micro-shards of
  // equal rows, each run through forward and backward on its own (the same shapes whichever
  // rank runs it, so the same bits), or, for a model of dense layers (exact_sum->dense_terms()),
  // stacked into one forward and one backward of the input gradients with those bits; the last
  // one with the GradSync, which must average over make_exact_allreduce(*exact_sum). Null:
  // the batch in one pass.
  ExactGradSum* exact_sum = nullptr;
  // The parameter-server workers: no GradSync; the micro-shards are left for
  // exact_sum->local_sums() after the step.
  bool exact_sum_by_caller = false;
  // Gradient accumulation without the exact sum (CPU steps of several passes): the sum of the
  // passes before the last, kept beside the gradient buffer (made on the first such step).
  Tensor accumulated;
  // --timeline: where the step records its phases (forward, backward, optimizer; on the GPU
  // from CUDA events, resolved after the step's synchronisation). Null: nowhere.
  Timeline* timeline = nullptr;
};

// A training set copied to the GPU once (mnist_train --data-on-gpu; GPU build): its bytes and
// labels as loaded, so that a device step gathers its batch there (gpu::gather_batch, the
// twin of make_batch: the same floats, bit for bit) instead of uploading 4 bytes per pixel
// every step. upload_dataset checks every label against `classes` once, as check_labels does
// for each host batch.
struct DeviceDataset;
std::shared_ptr<const DeviceDataset> upload_dataset(const Dataset& data, int64_t classes);
int64_t device_dataset_bytes(const DeviceDataset& data);

// What a step trains on: a host batch (as make_batch writes it), or sample indices into a
// training set on the GPU (device steps only; checked against its count on the host).
struct StepInput {
  // Implicit, so that train_step(model, optimizer, batch, ...) reads as it says; it keeps a
  // pointer: pass a batch that outlives the call.
  StepInput(const Batch& host_batch) : batch(&host_batch) {}  // NOLINT(google-explicit-constructor)
  StepInput(const DeviceDataset& data, std::span<const int64_t> sample_indices)
      : device_data(&data), indices(sample_indices) {}
  const Batch* batch = nullptr;
  const DeviceDataset* device_data = nullptr;
  std::span<const int64_t> indices;
};

// With a GradSync, each piece of the gradients is handed to it as backward finishes it and
// the optimizer steps only after sync->finish(): on averaged gradients, the same on every
// rank. before_update, when given, runs after the gradients are final (averaged) and before
// the optimizer; returning false skips the update (the --check-finite guard).
using BeforeUpdateFn = std::function<bool(const StepStats& stats, std::span<const float> grads)>;

// Forward, the loss and backward on the CPU, without an update: the gradients are left in
// model.grads() (averaged, with a GradSync). train_step below is this plus the optimizer; the
// parameter-server workers push these gradients instead.
//
// Gradient accumulation (mnist_train --accumulate-steps, DDP's no_sync, Horovod's
// backward_passes_per_step): with several passes, each runs forward and backward on its own
// batch and the gradient is the mean of the passes' gradients. The passes before the last
// only add their gradients locally, range by range as backward finishes them (into
// workspace.accumulated, or the exact sum's kept copies); the last pass folds the sum into
// each range as backward finishes it and only then hands it to the GradSync, so that the one
// average of the step overlaps the last backward, as a step without accumulation does. K
// passes of batch b give one pass of K x b's gradient within float rounding (the sum runs in
// another order); with workspace.exact_sum, bit for bit, since the exact sum does not depend
// on the order at all. The loss is the mean of the passes' means.
StepStats compute_gradients(Model& model, std::span<const StepInput> passes,
                            StepWorkspace& workspace, Context& ctx, GradSync* sync = nullptr);
inline StepStats compute_gradients(Model& model, const Batch& batch, StepWorkspace& workspace,
                                   Context& ctx, GradSync* sync = nullptr) {
  const StepInput input(batch);
  return compute_gradients(model, std::span<const StepInput>(&input, 1), workspace, ctx, sync);
}

// One training step, on whichever device ctx names (the model, the optimizer and the
// GradSync must live there too; a mismatch throws).
//
// On the CPU: compute_gradients, before_update, the optimizer.
//
// On the GPU (GPU build; the CPU-only build throws): a host batch is uploaded explicitly on
// the compute stream (labels are range-checked on the host first, as the CPU loss does); a
// device input is gathered there. Forward, the loss, backward, the optimizer and, with a
// GradSync, the averaging (on the communication stream, ordered by events) are all queued
// without the host waiting. The host synchronises once per step, at its end, to read the loss
// and the correct count back (one small copy into pinned memory): that is the step's only host
// sync. With before_update there are two: the read-back moves before the optimizer (the guard
// decides on the loss and on the gradients' non-finite count, computed on the device; it gets
// an empty span), and the end waits for the update.
//
// With workspace.cuda_graph (and no GradSync: the multi-rank step is not captured), the
// upload, forward, loss and backward are captured once into a CUDA graph and replayed: one
// launch instead of one per kernel, for these launch-bound models. The first step of a batch
// shape runs eagerly (it allocates the activations and loads cuBLAS's kernels); the next one
// with the same shape captures and replays; later ones replay. A graph bakes in every pointer
// it was captured with, so it is recaptured whenever any device tensor was allocated since (an
// evaluation with a larger batch, say) or the staging buffers moved. The optimizer, the
// --check-finite count and the read-back stay outside the graph (the learning rate and Adam's
// step change every step). Replaying runs the same kernels with the same arguments, so the
// results are the eager step's, bit for bit.
//
// With several passes (gradient accumulation, CPU only): compute_gradients over all of them,
// then one update.
StepStats train_step(Model& model, Optimizer& optimizer, std::span<const StepInput> passes,
                     float lr, StepWorkspace& workspace, Context& ctx, GradSync* sync = nullptr,
                     const BeforeUpdateFn& before_update = {});
inline StepStats train_step(Model& model, Optimizer& optimizer, const StepInput& input, float lr,
                            StepWorkspace& workspace, Context& ctx, GradSync* sync = nullptr,
                            const BeforeUpdateFn& before_update = {}) {
  return train_step(model, optimizer, std::span<const StepInput>(&input, 1), lr, workspace, ctx,
                    sync, before_update);
}

// How many step graphs this workspace has captured (0 in the CPU-only build; each recapture
// counts).
int64_t step_graph_captures(const StepWorkspace& workspace);

namespace detail {
// train_step's device half (src/cuda/device_step.cpp; the CPU-only build's stub throws).
StepStats train_step_device(Model& model, Optimizer& optimizer, const StepInput& input, float lr,
                            StepWorkspace& workspace, Context& ctx, GradSync* sync,
                            const BeforeUpdateFn& before_update);
}  // namespace detail

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
// On a CUDA ctx each batch is uploaded and its statistics read back (one sync per batch).
// `board`: where each batch posts progress (and a device batch its wait), for the watchdog.
EvalResult evaluate(Model& model, const Dataset& data, int64_t begin, int64_t end,
                    int64_t batch_size, Batch& scratch, Context& ctx,
                    ProgressBoard* board = nullptr);
// One host batch on the device: upload, forward, loss statistics read back (GPU build).
// Its upload buffers are batch.device.
EvalResult evaluate_batch_device(Model& model, Batch& batch, Context& ctx,
                                 ProgressBoard* board = nullptr);

// Writes the flat parameter buffer: the 8 bytes "RTPARAMS", the element count as a
// little-endian uint64, then the float32 values, little-endian. Written as
// write_file_atomically (checkpoint.h) writes: to a fresh temporary next to path (never through
// an existing name), fsync()ed, then renamed over path, so an existing file is never left
// half-written and a symbolic link at path is replaced, not followed.
// `progress`: called as the bytes reach the disk (a watchdog sees a long write move).
void save_params(const std::string& path, std::span<const float> params,
                 const std::function<void()>& progress = {});
// Reads a file written by save_params; throws naming the file if it is not one.
std::vector<float> load_params(const std::string& path);

}  // namespace ringtrain
