// The CPU-only build's definitions of the GPU entry points (gpu_ops.h, the device optimizer,
// the device step): each throws, saying that this build has no GPU path. They are reachable
// only with a CUDA Context, which this build cannot make (choose_device never picks cuda
// here), so they exist to keep the layers and the step free of #ifdef.
#ifndef RINGTRAIN_HAVE_GPU

#include "ringtrain/check.h"
#include "ringtrain/gpu_ops.h"
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
std::unique_ptr<Optimizer> make_device_optimizer(const OptimizerConfig&, int64_t, void*) {
  no_gpu("an optimizer on the GPU");
}
}  // namespace detail

StepStats train_step_device(Model&, Optimizer&, const Batch&, float, StepWorkspace&, Context&,
                            DeviceGradBucketer*, const BeforeUpdateFn&) {
  no_gpu("a training step on the GPU");
}

EvalResult evaluate_batch_device(Model&, const Batch&, Context&) {
  no_gpu("evaluation on the GPU");
}

}  // namespace ringtrain

#endif  // RINGTRAIN_HAVE_GPU
