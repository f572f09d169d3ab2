// Evaluation of one host batch on the GPU (evaluate_batch_device, train.h): upload, forward,
// the loss statistics read back (one host sync per batch).
#include "device_step.h"

#include "ringtrain/check.h"

namespace ringtrain {

EvalResult evaluate_batch_device(Model& model, Batch& batch, Context& ctx, ProgressBoard* board) {
  RINGTRAIN_CHECK(ctx.device == Device::kCuda && model.device() == Device::kCuda,
                  "device evaluation needs a CUDA context and a device model");
  // The upload buffers stay with the caller's scratch batch: fresh ones per call would be
  // device allocations, each forcing the next training step to recapture its graph
  // (step_graph.h).
  if (!batch.device) batch.device = std::make_shared<DeviceStepState>();
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  DeviceStepState& state = *batch.device;
  check_labels(batch.labels, model.output_shape().numel());
  state.batch.upload(batch, stream);
  const Tensor& logits = model.forward(state.batch.images(), ctx);
  gpu::softmax_xent(logits.data(), state.batch.labels(), nullptr, logits.dim(0), logits.dim(1),
                    state.stats, stream);
  state.read_back(stream, false, board);
  StepStats stats;
  fill_loss(stats, *state.host_stats, logits.dim(0));
  EvalResult result;
  result.correct = stats.correct;
  result.samples = logits.dim(0);
  result.loss_sum = stats.loss * static_cast<double>(logits.dim(0));
  return result;
}

}  // namespace ringtrain
