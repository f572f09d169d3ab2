// The training step and evaluation on the GPU (train.h). Host memory is touched only for the
// batch (uploaded) and the loss statistics (read back once per step, into pinned memory).
#include <algorithm>

#include <spdlog/spdlog.h>

#include "gather.h"
#include "kernels.h"
#include "ringtrain/check.h"
#include "ringtrain/comm.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/device_bucketer.h"
#include "ringtrain/gpu_context.h"
#include "ringtrain/graph_policy.h"
#include "ringtrain/train.h"

namespace ringtrain {

// The training set on the GPU (--data-on-gpu): bytes as loaded, copied once.
struct DeviceDataset {
  uint8_t* images = nullptr;  // device [count, rows, cols]
  uint8_t* labels = nullptr;  // device [count]
  int64_t count = 0, rows = 0, cols = 0;

  DeviceDataset() = default;
  DeviceDataset(const DeviceDataset&) = delete;
  DeviceDataset& operator=(const DeviceDataset&) = delete;
  ~DeviceDataset() {
    (void)cudaFree(images);
    (void)cudaFree(labels);
  }
};

// Everything a captured step graph baked in: it may be replayed only while all of it is
// unchanged. `allocations` (device_allocations()) stands for every device pointer inside the
// model (activations, gradients) and its layers' caches, which change only by allocating.
struct StepGraphKey {
  const Model* model = nullptr;
  const void* stream = nullptr;
  const void* blas = nullptr;
  const void* dnn = nullptr;
  ConvImpl conv_impl = ConvImpl::kDirect;
  Shape image_shape;
  const float* images = nullptr;
  const int32_t* labels = nullptr;
  const float* host_images = nullptr;
  const int32_t* host_rows = nullptr;
  const int32_t* indices = nullptr;
  const DeviceDataset* dataset = nullptr;  // null: a host batch
  const float* dlogits = nullptr;
  uint64_t allocations = 0;

  bool operator==(const StepGraphKey& other) const {
    return model == other.model && stream == other.stream && blas == other.blas &&
           dnn == other.dnn && conv_impl == other.conv_impl && image_shape == other.image_shape &&
           images == other.images && labels == other.labels && host_images == other.host_images &&
           host_rows == other.host_rows && indices == other.indices && dataset == other.dataset &&
           dlogits == other.dlogits && allocations == other.allocations;
  }
};

// The step's device buffers, allocated on first use and grown only when a batch is larger.
struct DeviceStepState {
  Tensor images{Device::kCuda};
  int32_t* labels = nullptr;   // device [row_capacity]
  int32_t* indices = nullptr;  // device [row_capacity]: a gathered batch's sample indices
  int64_t row_capacity = 0;
  gpu::XentStats* stats = nullptr;               // device
  unsigned long long* nonfinite = nullptr;       // device, --check-finite
  gpu::XentStats* host_stats = nullptr;          // pinned host
  unsigned long long* host_nonfinite = nullptr;  // pinned host
  // Pinned staging of the batch: an upload from pageable memory may synchronise the stream,
  // from pinned memory it is a plain DMA queued on it. The previous step's upload has always
  // finished when the next one refills it (each step ends with a stream synchronisation).
  float* host_images = nullptr;
  int32_t* host_rows = nullptr;  // a host batch's labels, or a gathered batch's indices
  // Where the staged batch comes from: the pinned host buffers, or `dataset` on the GPU.
  const DeviceDataset* dataset = nullptr;
  int64_t image_capacity = 0;
  cudaEvent_t step_start = nullptr, step_end = nullptr;  // the step on the compute stream
  // StepWorkspace::cuda_graph: the captured upload + forward + loss + backward, what it was
  // captured with, and what the last eager step ran with (a capture follows an eager step with
  // the same key, so that the capture itself never allocates).
  cudaGraphExec_t graph = nullptr;
  GraphCapturePolicy<StepGraphKey> graph_policy;
  int64_t captures = 0;  // graphs captured so far (tests, logs)

  DeviceStepState() {
    try {
      RINGTRAIN_CHECK_CUDA(cudaMalloc(&stats, sizeof(gpu::XentStats)));
      RINGTRAIN_CHECK_CUDA(cudaMalloc(&nonfinite, sizeof(unsigned long long)));
      RINGTRAIN_CHECK_CUDA(cudaMallocHost(&host_stats, sizeof(gpu::XentStats)));
      RINGTRAIN_CHECK_CUDA(cudaMallocHost(&host_nonfinite, sizeof(unsigned long long)));
      RINGTRAIN_CHECK_CUDA(cudaEventCreate(&step_start));
      RINGTRAIN_CHECK_CUDA(cudaEventCreate(&step_end));
    } catch (...) {
      release();
      throw;
    }
  }
  ~DeviceStepState() { release(); }
  DeviceStepState(const DeviceStepState&) = delete;
  DeviceStepState& operator=(const DeviceStepState&) = delete;

  void release() {
    if (graph != nullptr) (void)cudaGraphExecDestroy(graph);
    graph = nullptr;
    (void)cudaFree(labels);
    (void)cudaFree(indices);
    indices = nullptr;
    (void)cudaFree(stats);
    (void)cudaFree(nonfinite);
    (void)cudaFreeHost(host_stats);
    (void)cudaFreeHost(host_nonfinite);
    (void)cudaFreeHost(host_images);
    (void)cudaFreeHost(host_rows);
    host_images = nullptr;
    host_rows = nullptr;
    if (step_start != nullptr) (void)cudaEventDestroy(step_start);
    if (step_end != nullptr) (void)cudaEventDestroy(step_end);
    step_start = step_end = nullptr;
    labels = nullptr;
    stats = nullptr;
    nonfinite = nullptr;
    host_stats = nullptr;
    host_nonfinite = nullptr;
  }

  // Room for `rows` per-row values (labels, indices) on both sides. Growth only: it waits for
  // the stream (work queued earlier may still read the old buffers), never in steady state.
  void reserve_rows(int64_t rows, cudaStream_t stream) {
    if (rows <= row_capacity) return;
    RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    RINGTRAIN_CHECK_CUDA(cudaFree(labels));
    RINGTRAIN_CHECK_CUDA(cudaFree(indices));
    RINGTRAIN_CHECK_CUDA(cudaFreeHost(host_rows));
    labels = indices = host_rows = nullptr;
    const size_t bytes = static_cast<size_t>(rows) * sizeof(int32_t);
    RINGTRAIN_CHECK_CUDA(cudaMalloc(&labels, bytes));
    RINGTRAIN_CHECK_CUDA(cudaMalloc(&indices, bytes));
    RINGTRAIN_CHECK_CUDA(cudaMallocHost(&host_rows, bytes));
    row_capacity = rows;
  }

  // Checks the batch, grows the buffers when it is larger than any before, copies it into the
  // pinned staging buffers and shapes `images`; nothing is queued. (The labels' range is checked
  // by check_labels before.)
  void stage(const Batch& batch, cudaStream_t stream) {
    const int64_t rows = batch.images.dim(0);
    RINGTRAIN_CHECK(
        batch.images.device() == Device::kCpu && static_cast<int64_t>(batch.labels.size()) == rows,
        "a device step takes a host batch with one label per image ({} images, {} "
        "labels)",
        rows, batch.labels.size());
    const int64_t values = batch.images.numel();
    reserve_rows(rows, stream);
    if (values > image_capacity) {
      RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
      RINGTRAIN_CHECK_CUDA(cudaFreeHost(host_images));
      host_images = nullptr;
      RINGTRAIN_CHECK_CUDA(
          cudaMallocHost(&host_images, static_cast<size_t>(values) * sizeof(float)));
      image_capacity = values;
    }
    std::copy_n(batch.images.data(), values, host_images);
    std::copy_n(batch.labels.data(), rows, host_rows);
    images.resize(batch.images.shape());
    dataset = nullptr;
  }

  // The same for a batch gathered on the GPU: only the sample indices are staged (the caller
  // has checked them against the data set).
  void stage(const DeviceDataset& data, std::span<const int64_t> sample_indices,
             cudaStream_t stream) {
    const auto rows = static_cast<int64_t>(sample_indices.size());
    reserve_rows(rows, stream);
    for (int64_t r = 0; r < rows; ++r)
      host_rows[r] = static_cast<int32_t>(sample_indices[static_cast<size_t>(r)]);
    images.resize(Shape{rows, data.rows, data.cols, 1});  // make_batch's shape
    dataset = &data;
  }

  // Queues the staged batch's upload on `stream` (a captured graph replays these copies: they
  // read the pinned buffers when the graph runs, so stage() refills them before each launch).
  // A gathered batch uploads its indices and gathers images and labels on the GPU.
  void enqueue_upload(cudaStream_t stream) {
    const int64_t rows = images.dim(0);
    const size_t row_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
    if (dataset == nullptr) {
      copy_floats_async(images.data(), Device::kCuda, host_images, Device::kCpu, images.numel(),
                        stream);
      RINGTRAIN_CHECK_CUDA(
          cudaMemcpyAsync(labels, host_rows, row_bytes, cudaMemcpyHostToDevice, stream));
      return;
    }
    RINGTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(indices, host_rows, row_bytes, cudaMemcpyHostToDevice, stream));
    gpu::gather_batch(dataset->images, dataset->labels, indices, rows,
                      dataset->rows * dataset->cols, kPixelScale, images.data(), labels, stream);
  }

  void upload(const Batch& batch, cudaStream_t stream) {
    stage(batch, stream);
    enqueue_upload(stream);
  }

  // Queues the copy of the loss statistics (and the non-finite count) to pinned memory and
  // waits for the stream: the step's one host synchronisation.
  void read_back(cudaStream_t stream, bool with_nonfinite, ProgressBoard* board) {
    RINGTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(host_stats, stats, sizeof(gpu::XentStats), cudaMemcpyDeviceToHost, stream));
    if (with_nonfinite) {
      RINGTRAIN_CHECK_CUDA(cudaMemcpyAsync(host_nonfinite, nonfinite, sizeof(unsigned long long),
                                           cudaMemcpyDeviceToHost, stream));
    }
    wait_for_stream(stream, board, "the GPU streams");
  }
};

namespace {

DeviceStepState& state_of(StepWorkspace& workspace) {
  if (!workspace.device) workspace.device = std::make_shared<DeviceStepState>();
  return *workspace.device;
}

void check_labels(const std::vector<int32_t>& labels, int64_t classes) {
  for (size_t r = 0; r < labels.size(); ++r) {
    RINGTRAIN_CHECK(labels[r] >= 0 && labels[r] < classes, "label {} of row {} is outside [0, {})",
                    labels[r], r, classes);
  }
}

void fill_loss(StepStats& stats, const gpu::XentStats& host, int64_t rows) {
  RINGTRAIN_CHECK(host.bad_labels == 0, "{} label(s) outside the class range reached the GPU",
                  host.bad_labels);
  stats.loss = host.loss_sum / static_cast<double>(rows);
  stats.correct = static_cast<int64_t>(host.correct);
}

// Queues the step's graph-capturable part on `stream`: the upload, forward, the loss and
// backward (with a bucketer, also its events and the communication stream's rings).
void enqueue_forward_backward(Model& model, DeviceStepState& state, StepWorkspace& workspace,
                              Context& ctx, DeviceGradBucketer* bucketer) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  state.enqueue_upload(stream);
  const Tensor& logits = model.forward(state.images, ctx);
  RINGTRAIN_CHECK(logits.shape() == workspace.dlogits.shape(), "logits {} but dlogits {}",
                  logits.shape().str(), workspace.dlogits.shape().str());
  gpu::softmax_xent(logits.data(), state.labels, workspace.dlogits.data(), logits.dim(0),
                    logits.dim(1), state.stats, stream);
  if (bucketer != nullptr) {
    bucketer->begin_backward();
    model.backward(workspace.dlogits, ctx,
                   [bucketer](const GradRange& range) { bucketer->mark_ready(range); });
    bucketer->finish();  // the compute stream now waits for the averaged gradients
  } else {
    model.backward(workspace.dlogits, ctx);
  }
}

StepGraphKey graph_key_of(const Model& model, const DeviceStepState& state,
                          const StepWorkspace& workspace, const Context& ctx) {
  return StepGraphKey{.model = &model,
                      .stream = ctx.stream,
                      .blas = ctx.blas,
                      .dnn = ctx.dnn,
                      .conv_impl = ctx.conv_impl,
                      .image_shape = state.images.shape(),
                      .images = state.images.data(),
                      .labels = state.labels,
                      .host_images = state.host_images,
                      .host_rows = state.host_rows,
                      .indices = state.indices,
                      .dataset = state.dataset,
                      .dlogits = workspace.dlogits.data(),
                      .allocations = device_allocations()};
}

// Captures enqueue_forward_backward into state.graph (replacing any older graph). Capture
// queues nothing: the caller launches the graph. ThreadLocal mode: a call on this thread that
// could synchronise implicitly (a cudaMalloc, say) fails the capture instead of silently
// running outside the graph; other threads (the watchdog's) are not affected.
void capture_step(Model& model, DeviceStepState& state, StepWorkspace& workspace, Context& ctx) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const uint64_t allocations_before = device_allocations();
  RINGTRAIN_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_forward_backward(model, state, workspace, ctx, nullptr);
  } catch (...) {
    // End the capture so the stream is usable again; the partial graph is discarded.
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream, &partial);
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  RINGTRAIN_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph is independent of it
  RINGTRAIN_CHECK_CUDA(instantiated);
  if (device_allocations() != allocations_before) {
    // Something allocated device memory while capturing: the graph may point at buffers that
    // the eager steps do not use. Never replay it.
    (void)cudaGraphExecDestroy(exec);
    RINGTRAIN_FAIL(
        "a device allocation happened while capturing the training step's CUDA graph (an "
        "internal error: the eager step before it should have made every buffer); run "
        "without --cuda-graphs");
  }
  if (state.graph != nullptr) RINGTRAIN_CHECK_CUDA(cudaGraphExecDestroy(state.graph));
  state.graph = exec;
  ++state.captures;
}

// --cuda-graphs: queues the upload, forward, loss and backward as GraphCapturePolicy says:
// replaying the step graph, capturing it first, or eagerly. Records state.step_start before
// the work (after a capture, which queues nothing). Returns whether a graph ran.
bool enqueue_through_graph(Model& model, DeviceStepState& state, StepWorkspace& workspace,
                           Context& ctx) {
  using Action = GraphCapturePolicy<StepGraphKey>::Action;
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const StepGraphKey key = graph_key_of(model, state, workspace, ctx);
  Action action = state.graph_policy.decide(key);
  if (action == Action::kCapture) {
    try {
      capture_step(model, state, workspace, ctx);
      state.graph_policy.captured(key);
      action = Action::kReplay;
    } catch (const std::exception& e) {
      // Something in the step cannot be captured (a library call that synchronises, say):
      // the step is still correct eagerly, so say why once and stop trying. A failed
      // Begin/EndCapture or Instantiate leaves its error as the thread's last error, which
      // the eager step's first launch check would report: clear it.
      (void)cudaGetLastError();
      spdlog::warn(
          "cannot capture the training step in a CUDA graph ({}); --cuda-graphs is off for the "
          "rest of the run",
          e.what());
      workspace.cuda_graph = false;
      state.graph_policy.forget_eager();
      action = Action::kEager;
    }
  }
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(state.step_start, stream));
  if (action == Action::kReplay) {
    RINGTRAIN_CHECK_CUDA(cudaGraphLaunch(state.graph, stream));
    return true;
  }
  enqueue_forward_backward(model, state, workspace, ctx, nullptr);
  // Whatever this step allocated (the first step's activations) is now part of the key, so
  // the next step of this shape captures.
  state.graph_policy.ran_eagerly(graph_key_of(model, state, workspace, ctx));
  return false;
}

void check_device_step(const Model& model, const Optimizer& optimizer, const Context& ctx,
                       const StepWorkspace& workspace, const DeviceGradBucketer* bucketer) {
  RINGTRAIN_CHECK(ctx.device == Device::kCuda && model.device() == Device::kCuda &&
                      optimizer.device() == Device::kCuda,
                  "a device step needs a CUDA context, a device model and a device optimizer");
  RINGTRAIN_CHECK(!(workspace.cuda_graph && bucketer != nullptr),
                  "CUDA graphs capture the one-rank step only (the multi-rank step's gradient "
                  "averaging is not captured): run without --cuda-graphs");
}

// The step once its batch is staged (state.stage): upload or gather, forward, loss, backward
// (eager or from a graph), averaging, the guard, the optimizer, the read-back.
StepStats run_staged_step(Model& model, Optimizer& optimizer, float lr, StepWorkspace& workspace,
                          Context& ctx, DeviceGradBucketer* bucketer,
                          const BeforeUpdateFn& before_update) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  DeviceStepState& state = *workspace.device;
  const int64_t classes = model.output_shape().numel();
  const int64_t rows = state.images.dim(0);
  if (workspace.dlogits.device() != Device::kCuda) workspace.dlogits = Tensor(Device::kCuda);
  workspace.dlogits.resize(Shape{rows, classes});
  StepStats stats;
  stats.samples = rows;
  if (workspace.cuda_graph) {
    stats.graph_replayed = enqueue_through_graph(model, state, workspace, ctx);
  } else {
    RINGTRAIN_CHECK_CUDA(cudaEventRecord(state.step_start, stream));
    enqueue_forward_backward(model, state, workspace, ctx, bucketer);
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
    state.read_back(stream, /*with_nonfinite=*/true, ctx.board);
    have_loss = true;
    fill_loss(stats, *state.host_stats, rows);
    stats.grads_finite = *state.host_nonfinite == 0;
    if (bucketer != nullptr) stats.comm = bucketer->stats();
    if (!before_update(stats, {})) {
      stats.updated = false;
      return stats;
    }
  }
  optimizer.step({params.data(), static_cast<size_t>(params.numel())},
                 {grads.data(), static_cast<size_t>(grads.numel())}, lr);
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(state.step_end, stream));
  if (!have_loss) {
    host_work();
    state.read_back(stream, /*with_nonfinite=*/false, ctx.board);
    fill_loss(stats, *state.host_stats, rows);
    if (bucketer != nullptr) stats.comm = bucketer->stats();
  } else {
    // The update is queued; wait for it so the step's time covers it, as on the CPU.
    wait_for_stream(stream, ctx.board, "the GPU streams");
  }
  float device_ms = 0.0f;
  RINGTRAIN_CHECK_CUDA(cudaEventElapsedTime(&device_ms, state.step_start, state.step_end));
  stats.device_ms = static_cast<double>(device_ms);
  return stats;
}

}  // namespace

int64_t step_graph_captures(const StepWorkspace& workspace) {
  return workspace.device ? workspace.device->captures : 0;
}

StepStats train_step_device(Model& model, Optimizer& optimizer, const Batch& batch, float lr,
                            StepWorkspace& workspace, Context& ctx, DeviceGradBucketer* bucketer,
                            const BeforeUpdateFn& before_update) {
  check_device_step(model, optimizer, ctx, workspace, bucketer);
  check_labels(batch.labels, model.output_shape().numel());
  state_of(workspace).stage(batch, static_cast<cudaStream_t>(ctx.stream));
  return run_staged_step(model, optimizer, lr, workspace, ctx, bucketer, before_update);
}

StepStats train_step_device(Model& model, Optimizer& optimizer, const DeviceDataset& data,
                            std::span<const int64_t> indices, float lr, StepWorkspace& workspace,
                            Context& ctx, DeviceGradBucketer* bucketer,
                            const BeforeUpdateFn& before_update) {
  check_device_step(model, optimizer, ctx, workspace, bucketer);
  RINGTRAIN_CHECK((Shape{data.rows, data.cols, 1} == model.input_shape()),
                  "the data set's {}x{} images do not fit the model's input {}", data.rows,
                  data.cols, model.input_shape().str());
  for (const int64_t i : indices) {
    RINGTRAIN_CHECK(i >= 0 && i < data.count,
                    "sample index {} is outside the data set on the GPU [0, {})", i, data.count);
  }
  state_of(workspace).stage(data, indices, static_cast<cudaStream_t>(ctx.stream));
  return run_staged_step(model, optimizer, lr, workspace, ctx, bucketer, before_update);
}

std::shared_ptr<const DeviceDataset> upload_dataset(const Dataset& data, int64_t classes) {
  RINGTRAIN_CHECK(static_cast<int64_t>(data.images.size()) == data.count * data.image_size() &&
                      static_cast<int64_t>(data.labels.size()) == data.count,
                  "upload_dataset: {} images of {}x{} need {} bytes and {} labels; got {} and {}",
                  data.count, data.rows, data.cols, data.count * data.image_size(), data.count,
                  data.images.size(), data.labels.size());
  RINGTRAIN_CHECK(data.count < (int64_t{1} << 31),
                  "a data set on the GPU holds under 2^31 samples ({} here)", data.count);
  // Checked once here, as check_labels checks every host batch.
  for (size_t i = 0; i < data.labels.size(); ++i) {
    RINGTRAIN_CHECK(data.labels[i] < classes, "label {} of sample {} is outside [0, {})",
                    data.labels[i], i, classes);
  }
  auto device = std::make_shared<DeviceDataset>();
  device->count = data.count;
  device->rows = data.rows;
  device->cols = data.cols;
  note_device_allocation();
  RINGTRAIN_CHECK_CUDA(cudaMalloc(&device->images, std::max<size_t>(data.images.size(), 1)));
  RINGTRAIN_CHECK_CUDA(cudaMalloc(&device->labels, std::max<size_t>(data.labels.size(), 1)));
  // Set-up, not the step: a plain synchronous copy (ordered after everything queued before by
  // the device synchronisation).
  RINGTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
  RINGTRAIN_CHECK_CUDA(
      cudaMemcpy(device->images, data.images.data(), data.images.size(), cudaMemcpyHostToDevice));
  RINGTRAIN_CHECK_CUDA(
      cudaMemcpy(device->labels, data.labels.data(), data.labels.size(), cudaMemcpyHostToDevice));
  return device;
}

int64_t device_dataset_bytes(const DeviceDataset& data) {
  return data.count * (data.rows * data.cols + 1);
}

EvalResult evaluate_batch_device(Model& model, const Batch& batch, Context& ctx) {
  RINGTRAIN_CHECK(ctx.device == Device::kCuda && model.device() == Device::kCuda,
                  "device evaluation needs a CUDA context and a device model");
  thread_local StepWorkspace workspace;  // evaluation's own upload buffers, reused
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  DeviceStepState& state = state_of(workspace);
  check_labels(batch.labels, model.output_shape().numel());
  state.upload(batch, stream);
  const Tensor& logits = model.forward(state.images, ctx);
  gpu::softmax_xent(logits.data(), state.labels, nullptr, logits.dim(0), logits.dim(1), state.stats,
                    stream);
  state.read_back(stream, false, ctx.board);
  StepStats stats;
  fill_loss(stats, *state.host_stats, logits.dim(0));
  EvalResult result;
  result.correct = stats.correct;
  result.samples = logits.dim(0);
  result.loss_sum = stats.loss * static_cast<double>(logits.dim(0));
  return result;
}

}  // namespace ringtrain
