// The training step on the GPU (detail::train_step_device, train.h's train_step for a CUDA
// context). Host memory is touched only for the batch (staged and uploaded, device_batch.h)
// and the loss statistics (read back once per step, into pinned memory).
#include "device_step.h"

#include "device_timeline.h"
#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/gpu_context.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/timeline.h"

namespace ringtrain {

DeviceStepState::DeviceStepState() {
  try {
    RINGTRAIN_CHECK_CUDA(cudaMalloc(&stats, sizeof(gpu::XentStats)));
    RINGTRAIN_CHECK_CUDA(cudaMalloc(&nonfinite, sizeof(unsigned long long)));
    RINGTRAIN_CHECK_CUDA(cudaMallocHost(&host_stats, sizeof(gpu::XentStats)));
    RINGTRAIN_CHECK_CUDA(cudaMallocHost(&host_nonfinite, sizeof(unsigned long long)));
    RINGTRAIN_CHECK_CUDA(cudaEventCreate(&step_start));
    RINGTRAIN_CHECK_CUDA(cudaEventCreate(&step_end));
    for (cudaEvent_t& event : phase) RINGTRAIN_CHECK_CUDA(cudaEventCreate(&event));
    RINGTRAIN_CHECK_CUDA(cudaEventCreate(&anchor));
  } catch (...) {
    release();
    throw;
  }
}

DeviceStepState::~DeviceStepState() {
  release();
}

void DeviceStepState::release() {
  (void)cudaFree(stats);
  (void)cudaFree(nonfinite);
  (void)cudaFreeHost(host_stats);
  (void)cudaFreeHost(host_nonfinite);
  if (step_start != nullptr) (void)cudaEventDestroy(step_start);
  if (step_end != nullptr) (void)cudaEventDestroy(step_end);
  for (cudaEvent_t& event : phase) {
    if (event != nullptr) (void)cudaEventDestroy(event);
    event = nullptr;
  }
  if (anchor != nullptr) (void)cudaEventDestroy(anchor);
  anchor = nullptr;
  stats = nullptr;
  nonfinite = nullptr;
  host_stats = nullptr;
  host_nonfinite = nullptr;
  step_start = step_end = nullptr;
}

void DeviceStepState::read_back(cudaStream_t stream, bool with_nonfinite, ProgressBoard* board) {
  RINGTRAIN_CHECK_CUDA(
      cudaMemcpyAsync(host_stats, stats, sizeof(gpu::XentStats), cudaMemcpyDeviceToHost, stream));
  if (with_nonfinite) {
    RINGTRAIN_CHECK_CUDA(cudaMemcpyAsync(host_nonfinite, nonfinite, sizeof(unsigned long long),
                                         cudaMemcpyDeviceToHost, stream));
  }
  if (record_anchor) RINGTRAIN_CHECK_CUDA(cudaEventRecord(anchor, stream));
  wait_for_stream(stream, board, "the GPU streams");
  if (record_anchor) anchor_ns = Timeline::now_ns();
}

DeviceStepState& state_of(StepWorkspace& workspace) {
  if (!workspace.device) workspace.device = std::make_shared<DeviceStepState>();
  return *workspace.device;
}

void fill_loss(StepStats& stats, const gpu::XentStats& host, int64_t rows) {
  RINGTRAIN_CHECK(host.bad_labels == 0, "{} label(s) outside the class range reached the GPU",
                  host.bad_labels);
  stats.loss = host.loss_sum / static_cast<double>(rows);
  stats.correct = static_cast<int64_t>(host.correct);
}

int64_t step_graph_captures(const StepWorkspace& workspace) {
  return workspace.device ? workspace.device->graph.captures() : 0;
}

namespace {

// The step's graph-capturable part on the compute stream: the upload, forward, the loss and
// backward (with a GradSync, also its events and the communication stream's averaging, which
// is never captured: check_device_step).
class ForwardBackward final : public CapturableStep {
 public:
  ForwardBackward(Model& model, DeviceStepState& state, StepWorkspace& workspace, Context& ctx,
                  GradSync* sync)
      : model_(model), state_(state), workspace_(workspace), ctx_(ctx), sync_(sync) {}

  StepGraphKey key() const override {
    const DeviceBatch& batch = state_.batch;
    return StepGraphKey{.model = &model_,
                        .stream = ctx_.stream,
                        .blas = ctx_.blas,
                        .dnn = ctx_.dnn,
                        .conv_impl = ctx_.conv_impl,
                        .image_shape = batch.images().shape(),
                        .images = batch.images().data(),
                        .labels = batch.labels(),
                        .host_images = batch.host_images(),
                        .host_rows = batch.host_rows(),
                        .indices = batch.indices(),
                        .dataset = batch.dataset(),
                        .dlogits = workspace_.dlogits.data(),
                        .allocations = device_allocations()};
  }

  void enqueue() override {
    const auto stream = static_cast<cudaStream_t>(ctx_.stream);
    // --timeline marks the phases on the compute stream, in eager steps only (not in a graph).
    const bool mark = workspace_.timeline != nullptr && !workspace_.cuda_graph;
    const auto mark_phase = [&](DeviceStepState::Phase phase) {
      if (mark) RINGTRAIN_CHECK_CUDA(cudaEventRecord(state_.phase[phase], stream));
    };
    state_.batch.enqueue_upload(stream);
    mark_phase(DeviceStepState::kUploaded);
    const Tensor& logits = model_.forward(state_.batch.images(), ctx_);
    RINGTRAIN_CHECK(logits.shape() == workspace_.dlogits.shape(), "logits {} but dlogits {}",
                    logits.shape().str(), workspace_.dlogits.shape().str());
    gpu::softmax_xent(logits.data(), state_.batch.labels(), workspace_.dlogits.data(),
                      logits.dim(0), logits.dim(1), state_.stats, stream);
    mark_phase(DeviceStepState::kForwardDone);
    if (sync_ != nullptr) {
      GradSync* const sync = sync_;
      sync->begin_backward();
      model_.backward(workspace_.dlogits, ctx_,
                      [sync](const GradRange& range) { sync->mark_ready(range); });
      mark_phase(DeviceStepState::kBackwardDone);
      sync->finish();  // the compute stream now waits for the averaged gradients
    } else {
      model_.backward(workspace_.dlogits, ctx_);
      mark_phase(DeviceStepState::kBackwardDone);
    }
    mark_phase(DeviceStepState::kOptimizerBegins);
  }

 private:
  Model& model_;
  DeviceStepState& state_;
  StepWorkspace& workspace_;
  Context& ctx_;
  GradSync* sync_;
};

void check_device_step(const Model& model, const Optimizer& optimizer, const Context& ctx,
                       const StepWorkspace& workspace, const GradSync* sync) {
  RINGTRAIN_CHECK(ctx.device == Device::kCuda && model.device() == Device::kCuda &&
                      optimizer.device() == Device::kCuda,
                  "a device step needs a CUDA context, a device model and a device optimizer");
  RINGTRAIN_CHECK(sync == nullptr || sync->device() == Device::kCuda,
                  "a device step averages device gradients: its GradSync must be the stream "
                  "engine (a device Allreduce), not the host one");
  RINGTRAIN_CHECK(!(workspace.cuda_graph && sync != nullptr),
                  "CUDA graphs capture the one-rank step only (the multi-rank step's gradient "
                  "averaging is not captured): run without --cuda-graphs");
}

// --timeline: the eager step's phases on the compute stream, from its events, once the host
// has waited for them (the anchor is the last wait's). Without the update (skipped by the
// guard) the optimizer span is left out.
void record_device_phases(Timeline& timeline, const DeviceStepState& state, bool updated) {
  using P = DeviceStepState;
  const auto at = [&](cudaEvent_t event) { return host_time_ns(event, timeline); };
  const int64_t uploaded = at(state.phase[P::kUploaded]);
  const int64_t forward_done = at(state.phase[P::kForwardDone]);
  const int64_t backward_done = at(state.phase[P::kBackwardDone]);
  const int64_t optimizer_begins = at(state.phase[P::kOptimizerBegins]);
  timeline.span(TraceKind::kData, TraceLane::kComputeStream, at(state.step_start), uploaded);
  timeline.span(TraceKind::kForward, TraceLane::kComputeStream, uploaded, forward_done);
  timeline.span(TraceKind::kBackward, TraceLane::kComputeStream, forward_done, backward_done);
  // The compute stream idles here until the communication stream's last bucket is done.
  timeline.span(TraceKind::kGradWait, TraceLane::kComputeStream, backward_done, optimizer_begins);
  if (updated)
    timeline.span(TraceKind::kOptimizer, TraceLane::kComputeStream, optimizer_begins,
                  at(state.step_end));
}

// The step once its batch is staged: upload or gather, forward, loss, backward (eager or from
// a graph), averaging, the guard, the optimizer, the read-back.
StepStats run_staged_step(Model& model, Optimizer& optimizer, float lr, StepWorkspace& workspace,
                          Context& ctx, GradSync* sync, const BeforeUpdateFn& before_update) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  DeviceStepState& state = *workspace.device;
  const int64_t classes = model.output_shape().numel();
  const int64_t rows = state.batch.rows();
  if (workspace.dlogits.device() != Device::kCuda) workspace.dlogits = Tensor(Device::kCuda);
  workspace.dlogits.resize(Shape{rows, classes});
  StepStats stats;
  stats.samples = rows;
  Timeline* const timeline = workspace.timeline;
  const bool record_phases = timeline != nullptr && !workspace.cuda_graph;
  state.record_anchor = timeline != nullptr;
  const auto anchor_timeline = [&] {
    if (timeline != nullptr) timeline->set_device_anchor(state.anchor, state.anchor_ns);
  };
  ForwardBackward forward_backward(model, state, workspace, ctx, sync);
  if (workspace.cuda_graph) {
    stats.graph_replayed =
        state.graph.enqueue(forward_backward, stream, state.step_start, workspace.cuda_graph);
  } else {
    RINGTRAIN_CHECK_CUDA(cudaEventRecord(state.step_start, stream));
    forward_backward.enqueue();
  }
  Tensor& params = model.params();
  const Tensor& grads = model.grads();
  bool have_loss = false;
  // Everything of the step up to the first wait is queued: the host's own work goes here.
  const auto host_work = [&workspace] {
    if (workspace.while_device_runs) workspace.while_device_runs();
  };
  if (before_update) {
    RINGTRAIN_CHECK_CUDA(cudaMemsetAsync(state.nonfinite, 0, sizeof(unsigned long long), stream));
    gpu::count_nonfinite(grads.data(), grads.numel(), state.nonfinite, stream);
    host_work();
    state.read_back(stream, /*with_nonfinite=*/true, workspace.board);
    anchor_timeline();
    have_loss = true;
    fill_loss(stats, *state.host_stats, rows);
    stats.grads_finite = *state.host_nonfinite == 0;
    if (sync != nullptr) stats.comm = sync->stats();
    if (!before_update(stats, {})) {
      stats.updated = false;
      if (record_phases) record_device_phases(*timeline, state, /*updated=*/false);
      return stats;
    }
  }
  optimizer.step({params.data(), static_cast<size_t>(params.numel())},
                 {grads.data(), static_cast<size_t>(grads.numel())}, lr);
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(state.step_end, stream));
  if (!have_loss) {
    host_work();
    state.read_back(stream, /*with_nonfinite=*/false, workspace.board);
    anchor_timeline();
    fill_loss(stats, *state.host_stats, rows);
    if (sync != nullptr) stats.comm = sync->stats();
  } else {
    // The update is queued; wait for it so the step's time covers it, as on the CPU.
    wait_for_stream(stream, workspace.board, "the GPU streams");
    // The step's last event is the anchor of the update's span.
    if (timeline != nullptr) timeline->set_device_anchor(state.step_end, Timeline::now_ns());
  }
  if (record_phases) record_device_phases(*timeline, state, /*updated=*/true);
  float device_ms = 0.0f;
  RINGTRAIN_CHECK_CUDA(cudaEventElapsedTime(&device_ms, state.step_start, state.step_end));
  stats.device_ms = static_cast<double>(device_ms);
  return stats;
}

}  // namespace

namespace detail {

StepStats train_step_device(Model& model, Optimizer& optimizer, const StepInput& input, float lr,
                            StepWorkspace& workspace, Context& ctx, GradSync* sync,
                            const BeforeUpdateFn& before_update) {
  check_device_step(model, optimizer, ctx, workspace, sync);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  if (input.batch != nullptr) {
    check_labels(input.batch->labels, model.output_shape().numel());
    state_of(workspace).batch.stage(*input.batch, stream);
  } else {
    RINGTRAIN_CHECK(input.device_data != nullptr,
                    "a step input needs a host batch or a data set on the GPU");
    check_indices(*input.device_data, input.indices, model);
    state_of(workspace).batch.stage(*input.device_data, input.indices, stream);
  }
  return run_staged_step(model, optimizer, lr, workspace, ctx, sync, before_update);
}

}  // namespace detail

}  // namespace ringtrain
