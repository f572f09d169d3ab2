// The CPU-only build's definitions of the GPU entry points (gpu_ops.h, the device optimizer,
// the device allreduce and gradient averaging, the device step and data set, the stream wait
// of gpu_context.h): each throws, saying that this build has no GPU path. They are reachable
// only with a CUDA Context, which this build cannot make (choose_device never picks cuda
// here), so they exist to keep the layers, the step and the apps free of #ifdef. The one
// exception is step_graph_captures, which answers 0: callers ask it whatever the device.
#ifndef RINGTRAIN_HAVE_GPU

#include "ringtrain/allreduce.h"
#include "ringtrain/check.h"
#include "ringtrain/gpu_context.h"
#include "ringtrain/gpu_ops.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/optim.h"
#include "ringtrain/train.h"

namespace ringtrain {

namespace {
[[noreturn]] void no_gpu(const char* what) {
  RINGTRAIN_FAIL(
      "{} needs the GPU path, which this build lacks (configured without CUDA, cuDNN "
      "or NCCL): use --device cpu",
      what);
}
}  // namespace

namespace gpu_ops {
void dense_forward(const Context&, const float*, const float*, const float*, float*, int64_t,
                   int64_t, int64_t) {
  no_gpu("dense on the GPU");
}
void dense_backward_weight_rows(const Context&, const float*, const float*, float*, int64_t,
                                int64_t, int64_t, int64_t, int64_t) {
  no_gpu("dense on the GPU");
}
void bias_backward(const Context&, const float*, float*, int64_t, int64_t) {
  no_gpu("a bias gradient on the GPU");
}
void dense_backward_input(const Context&, const float*, const float*, float*, int64_t, int64_t,
                          int64_t) {
  no_gpu("dense on the GPU");
}
void relu_forward(const Context&, const float*, float*, int64_t) {
  no_gpu("relu on the GPU");
}
void relu_backward(const Context&, const float*, const float*, float*, int64_t) {
  no_gpu("relu on the GPU");
}
void conv2d_forward(const Context&, const float*, const float*, const float*, float*, int64_t,
                    int64_t, int64_t, int64_t, int64_t) {
  no_gpu("conv2d on the GPU");
}
void conv2d_backward(const Context&, const float*, const float*, const float*, float*, float*,
                     float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*, int64_t) {
  no_gpu("conv2d on the GPU");
}
int64_t conv2d_backward_workspace_floats(int64_t, int64_t, int64_t, int64_t, int64_t) {
  no_gpu("conv2d on the GPU");
}
void maxpool2d_forward(const Context&, const float*, float*, int64_t, int64_t, int64_t, int64_t) {
  no_gpu("maxpool2d on the GPU");
}
void maxpool2d_backward(const Context&, const float*, const float*, const float*, float*, int64_t,
                        int64_t, int64_t, int64_t) {
  no_gpu("maxpool2d on the GPU");
}
}  // namespace gpu_ops

namespace detail {
std::unique_ptr<Optimizer> make_device_optimizer(const OptimizerConfig&, int64_t, StreamHandle) {
  no_gpu("an optimizer on the GPU");
}

std::unique_ptr<Allreduce> make_device_allreduce(Comm&, const AllreduceConfig&, const Context&) {
  no_gpu("an allreduce of device memory");
}

std::unique_ptr<GradSync> make_stream_grad_sync(float*, std::vector<Bucket>, Allreduce&, bool,
                                                const Context&) {
  no_gpu("averaging gradients on the GPU");
}

StepStats train_step_device(Model&, Optimizer&, const StepInput&, float, StepWorkspace&, Context&,
                            GradSync*, const BeforeUpdateFn&) {
  no_gpu("a training step on the GPU");
}
}  // namespace detail

// The device step's state type stays incomplete here; no workspace of this build holds one.
int64_t step_graph_captures(const StepWorkspace&) {
  return 0;
}

std::shared_ptr<const DeviceDataset> upload_dataset(const Dataset&, int64_t) {
  no_gpu("a data set on the GPU (--data-on-gpu)");
}

int64_t device_dataset_bytes(const DeviceDataset&) {
  no_gpu("a data set on the GPU (--data-on-gpu)");
}

void wait_for_stream(StreamHandle, ProgressBoard*, const char*, double) {
  no_gpu("waiting for a GPU stream");
}

std::string nccl_version() {
  no_gpu("NCCL");
}

EvalResult evaluate_batch_device(Model&, Batch&, Context&, ProgressBoard*) {
  no_gpu("evaluation on the GPU");
}

}  // namespace ringtrain

#endif  // RINGTRAIN_HAVE_GPU
