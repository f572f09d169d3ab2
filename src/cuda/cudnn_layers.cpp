// Conv2D 3x3 and MaxPool2D 2x2 through cuDNN's legacy API (cudnn_layers.h): the alternative to
// the direct kernels (kernels/conv.h) behind --conv-impl cudnn, so that the two can be timed
// against each other on a GPU. What cuDNN is asked to do, and why:
//
// - Activations are NHWC: CUDNN_TENSOR_NHWC tensor descriptors over our buffers, no copies.
// - cuDNN's filter layout for NHWC is KRSC [Cout,3,3,Cin]; ours is HWIO [3,3,Cin,Cout]. The
//   forward and backward-data passes read a KRSC copy of w made on every call
//   (gpu::transpose_hwio_to_krsc into a scratch buffer; w changes every step, and the copy is
//   9 * Cin * Cout floats); the filter gradient is computed into a KRSC scratch buffer and
//   transposed into dw (gpu::transpose_krsc_to_hwio). See kernels/layout.h.
// - CUDNN_CROSS_CORRELATION: our "convolution" is y[p] = sum over taps of x[p + tap - 1] w[tap]
//   (kernels/conv.h), which is cuDNN's cross-correlation, not its (flipped) convolution. Pad 1,
//   stride 1, dilation 1, compute type float.
// - CUDNN_FMA_MATH: float FMA kernels only. CUDNN_DEFAULT_MATH lets cuDNN run float
//   convolutions as TF32 tensor ops on Ampere and later (about 1e-3 relative error), which
//   would break the agreement with the CPU to float rounding that the tests check (cuBLAS runs
//   in full float32 for the same reason, gpu_context.h).
// - Algorithms are fixed, never benchmarked: cudnnFind* times the candidates, so its choice can
//   change from run to run and with it the result's bits. Preferred: forward
//   IMPLICIT_PRECOMP_GEMM (then IMPLICIT_GEMM), backward data ALGO_1, backward filter ALGO_1
//   (ALGO_0 of both backward passes and filter ALGO_3 use atomics: not deterministic). When a
//   plan is built, each choice is checked against cuDNN's heuristic list for the shape
//   (cudnnGetConvolution*Algorithm_v7: a lookup, not a timing; it says per algorithm whether
//   the configuration is supported, whether it is deterministic and in which math type);
//   if no preferred algorithm is listed as supported, deterministic and FMA/default math, the
//   first listed one that is gets used, with a warning naming it. None: the plan throws.
// - The bias: gpu::bias_add on y as [B*H*W, Cout] after the convolution, and gpu::bias_grad
//   over dy, as the direct path and Dense do. bias_add equals y + b bit for bit; cudnnAddTensor
//   would compute the same sums through one more library call and one more descriptor.
//   bias_grad sums in a fixed order (deterministic), which cudnnConvolutionBackwardBias does
//   not document.
// - Max pooling: CUDNN_POOLING_MAX_DETERMINISTIC, 2x2 window, stride 2, no padding. Tied
//   maxima: cuDNN does not document which of them receives the gradient, whereas the CPU (and
//   the direct kernel) gives it to the first in row-major window order. So on data with ties
//   (ReLU outputs of 0 in a window are common) the cuDNN backward may differ from the CPU's,
//   still a valid subgradient; on tie-free data they agree bit for bit (values are only
//   moved). NaN: the CPU keeps a NaN only when it is the window's first value (`x > m` is
//   false for NaN); cuDNN cannot mimic that, and CUDNN_PROPAGATE_NAN makes any NaN in a window
//   reach the output, so a NaN is never hidden from --check-finite.
//
// Plans (descriptors, the chosen algorithms, scratch buffers) are cached per (cuDNN handle,
// stream, device, shape) and built once: a step in steady state allocates nothing (steps
// captured in CUDA graphs may not allocate; the device step runs a shape eagerly before it
// captures it, which builds the plans, and note_device_allocation() tells it when a plan was
// built since: step_graph.h). See PlanCache.
#include "cudnn_layers.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <compare>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kernels.h"
#include "layout.h"
#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/tensor.h"

// cuDNN 9 marks its whole legacy API (descriptors, cudnnConvolution*, cudnnPooling*) as
// CUDNN_DEPRECATED in favour of the graph API; the attribute is active when
// CUDNN_WARN_DEPRECATED is defined, and the project builds with warnings as errors. This file
// uses that API on purpose (it is still shipped and supported in 9.x, and it is what a
// descriptor-level comparison with the direct kernels needs), so the warning is off here, in
// this one translation unit, and stays on everywhere else.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace ringtrain::cudnn_layers {

namespace {

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;
constexpr int64_t kTaps = 9;  // 3x3 filter positions

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// The context's cuDNN handle, bound to its compute stream. GpuContext binds it when it makes
// it; binding again when a context carries another stream is a host-side setting.
cudnnHandle_t handle_of(const Context& ctx) {
  RINGTRAIN_CHECK(ctx.device == Device::kCuda && ctx.dnn != nullptr,
                  "cuDNN math on a context without a cuDNN handle (make it with GpuContext)");
  const auto handle = static_cast<cudnnHandle_t>(ctx.dnn);
  cudaStream_t bound = nullptr;
  RINGTRAIN_CHECK_CUDNN(cudnnGetStream(handle, &bound));
  if (bound != stream_of(ctx)) RINGTRAIN_CHECK_CUDNN(cudnnSetStream(handle, stream_of(ctx)));
  return handle;
}

// cuDNN's legacy descriptors take int dimensions and strides; check_conv_shape and
// check_pool_shape keep every tensor below 2^31 values, so every dimension fits.
int as_int(int64_t value) {
  return static_cast<int>(value);
}

void check_conv_shape(int64_t batch, int64_t height, int64_t width, int64_t cin, int64_t cout) {
  RINGTRAIN_CHECK(batch > 0 && height > 0 && width > 0 && cin > 0 && cout > 0 &&
                      height <= 0x7fffffff / width && batch <= 0x7fffffff / (height * width) &&
                      batch * height * width <= 0x7fffffff / std::max(cin, cout) &&
                      cin <= 0x7fffffff / kTaps / cout,
                  "cuDNN conv2d: bad shape (or over 2^31 values in a tensor): batch {}, {}x{}, "
                  "channels {}->{}",
                  batch, height, width, cin, cout);
}

void check_pool_shape(int64_t batch, int64_t height, int64_t width, int64_t channels) {
  RINGTRAIN_CHECK(batch > 0 && height > 0 && width > 0 && height % 2 == 0 && width % 2 == 0 &&
                      channels > 0 && height <= 0x7fffffff / width &&
                      batch <= 0x7fffffff / (height * width) &&
                      batch * height * width <= 0x7fffffff / channels,
                  "cuDNN maxpool2d: bad shape (or over 2^31 values): batch {}, {}x{}x{}", batch,
                  height, width, channels);
}

// A cuDNN descriptor, created and destroyed with its owner.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Descriptor {
 public:
  Descriptor() { RINGTRAIN_CHECK_CUDNN(Create(&descriptor_)); }
  ~Descriptor() { (void)Destroy(descriptor_); }  // only frees host memory; must not throw
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const { return descriptor_; }

 private:
  T descriptor_ = nullptr;
};
using TensorDescriptor =
    Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor =
    Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
               cudnnDestroyConvolutionDescriptor>;
using PoolingDescriptor = Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                                     cudnnDestroyPoolingDescriptor>;

// [n, h, w, c] floats, NHWC (cuDNN takes the dimensions in n, c, h, w order).
void set_nhwc(const TensorDescriptor& descriptor, int64_t n, int64_t h, int64_t w, int64_t c) {
  RINGTRAIN_CHECK_CUDNN(cudnnSetTensor4dDescriptor(descriptor.get(), CUDNN_TENSOR_NHWC,
                                                   CUDNN_DATA_FLOAT, as_int(n), as_int(c),
                                                   as_int(h), as_int(w)));
}

// Device memory held by a plan, allocated once when the plan is built.
class Scratch {
 public:
  Scratch() = default;
  ~Scratch() {
    if (data_ != nullptr) (void)cudaFree(data_);  // a destructor must not throw
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void allocate(size_t bytes) {
    RINGTRAIN_CHECK(data_ == nullptr, "cuDNN plan scratch allocated twice");
    // Counted: a captured step graph holding older pointers must not be replayed blindly.
    if (bytes > 0) note_device_allocation();
    if (bytes > 0) RINGTRAIN_CHECK_CUDA(cudaMalloc(&data_, bytes));
    bytes_ = bytes;
  }
  void* get() const { return data_; }
  float* floats() const { return static_cast<float*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// What a plan is for: one handle on one stream and device, one shape. The pooling plans use
// cin for the channels and cout = 0.
struct PlanKey {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  int gpu = -1;
  int64_t batch = 0, height = 0, width = 0, cin = 0, cout = 0;
  auto operator<=>(const PlanKey&) const = default;
};

std::string describe(const PlanKey& key) {
  return fmt::format("batch {}, {}x{}, channels {}->{}", key.batch, key.height, key.width, key.cin,
                     key.cout);
}

// From cuDNN's heuristic list for the shape (its order), the algorithm to use: the first of
// `preferred` that is listed as supported, deterministic and in FMA or default math (the
// descriptor's CUDNN_FMA_MATH then rules out tensor ops), else the first listed algorithm that
// is. `Perf` is one of cuDNN's cudnnConvolution*AlgoPerf_t.
template <typename Perf, typename Algo>
Algo pick_algorithm(const std::vector<Perf>& listed, std::initializer_list<Algo> preferred,
                    const char* pass, const PlanKey& key) {
  const auto usable = [](const Perf& perf) {
    return perf.status == CUDNN_STATUS_SUCCESS && perf.determinism == CUDNN_DETERMINISTIC &&
           (perf.mathType == CUDNN_FMA_MATH || perf.mathType == CUDNN_DEFAULT_MATH);
  };
  for (const Algo algo : preferred) {
    for (const Perf& perf : listed) {
      if (perf.algo == algo && usable(perf)) return algo;
    }
  }
  std::string offered;
  for (const Perf& perf : listed) {
    offered += fmt::format(
        " [algo {} {} {} math {}]", static_cast<int>(perf.algo), cudnnGetErrorString(perf.status),
        perf.determinism == CUDNN_DETERMINISTIC ? "deterministic" : "non-deterministic",
        static_cast<int>(perf.mathType));
    if (usable(perf)) {
      spdlog::warn(
          "cuDNN conv2d {} ({}): no preferred algorithm is supported here; using algorithm {}, "
          "the first deterministic one cuDNN lists",
          pass, describe(key), static_cast<int>(perf.algo));
      return perf.algo;
    }
  }
  RINGTRAIN_FAIL(
      "cuDNN conv2d {} ({}): cuDNN lists no supported deterministic float algorithm; it "
      "offered:{}",
      pass, describe(key), offered);
}

// The descriptors, algorithms and scratch buffers of one convolution shape.
struct ConvPlan {
  TensorDescriptor x, y;  // x [B,H,W,Cin], y (and dy) [B,H,W,Cout], NHWC
  FilterDescriptor w;     // [Cout,3,3,Cin] KRSC (cuDNN's NHWC filter)
  ConvolutionDescriptor conv;
  cudnnConvolutionFwdAlgo_t forward_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  cudnnConvolutionBwdDataAlgo_t backward_data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  cudnnConvolutionBwdFilterAlgo_t backward_filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  Scratch w_krsc;     // w transposed, for the forward and backward-data passes
  Scratch dw_krsc;    // the filter gradient as cuDNN writes it, before the transpose to dw
  Scratch workspace;  // the largest of the three passes' workspaces

  // Needs the GPU (the algorithm lists and workspace sizes are the device's).
  ConvPlan(cudnnHandle_t handle, const PlanKey& key) {
    set_nhwc(x, key.batch, key.height, key.width, key.cin);
    set_nhwc(y, key.batch, key.height, key.width, key.cout);
    RINGTRAIN_CHECK_CUDNN(cudnnSetFilter4dDescriptor(w.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC,
                                                     as_int(key.cout), as_int(key.cin), 3, 3));
    RINGTRAIN_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(conv.get(), /*pad_h=*/1, /*pad_w=*/1,
                                                          /*u=*/1, /*v=*/1, /*dilation_h=*/1,
                                                          /*dilation_w=*/1, CUDNN_CROSS_CORRELATION,
                                                          CUDNN_DATA_FLOAT));
    RINGTRAIN_CHECK_CUDNN(cudnnSetConvolutionMathType(conv.get(), CUDNN_FMA_MATH));
    choose_algorithms(handle, key);
    const size_t filter_bytes = static_cast<size_t>(kTaps * key.cin * key.cout) * sizeof(float);
    w_krsc.allocate(filter_bytes);
    dw_krsc.allocate(filter_bytes);
    size_t forward_bytes = 0, data_bytes = 0, filter_workspace_bytes = 0;
    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(
        handle, x.get(), w.get(), conv.get(), y.get(), forward_algo, &forward_bytes));
    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(
        handle, w.get(), y.get(), conv.get(), x.get(), backward_data_algo, &data_bytes));
    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        handle, x.get(), y.get(), conv.get(), w.get(), backward_filter_algo,
        &filter_workspace_bytes));
    workspace.allocate(std::max({forward_bytes, data_bytes, filter_workspace_bytes}));
    spdlog::debug(
        "cuDNN conv2d plan ({}): forward algorithm {}, backward data {}, backward filter {}, "
        "workspace {} bytes",
        describe(key), static_cast<int>(forward_algo), static_cast<int>(backward_data_algo),
        static_cast<int>(backward_filter_algo), workspace.bytes());
  }

  void choose_algorithms(cudnnHandle_t handle, const PlanKey& key) {
    int count = 0, returned = 0;
    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> forward(static_cast<size_t>(count));
    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(
        handle, x.get(), w.get(), conv.get(), y.get(), count, &returned, forward.data()));
    forward.resize(static_cast<size_t>(returned));
    forward_algo = pick_algorithm(forward,
                                  {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                   CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM},
                                  "forward", key);

    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> data(static_cast<size_t>(count));
    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, w.get(), y.get(), conv.get(), x.get(), count, &returned, data.data()));
    data.resize(static_cast<size_t>(returned));
    backward_data_algo =
        pick_algorithm(data, {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1}, "backward data", key);

    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> filter(static_cast<size_t>(count));
    RINGTRAIN_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, x.get(), y.get(), conv.get(), w.get(), count, &returned, filter.data()));
    filter.resize(static_cast<size_t>(returned));
    backward_filter_algo =
        pick_algorithm(filter, {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1}, "backward filter", key);
  }
};

// The descriptors of one pooling shape (cuDNN's max pooling needs no workspace).
struct PoolPlan {
  TensorDescriptor x, y;  // x (and dx) [B,H,W,C], y (and dy) [B,H/2,W/2,C], NHWC
  PoolingDescriptor pool;

  explicit PoolPlan(const PlanKey& key) {
    set_nhwc(x, key.batch, key.height, key.width, key.cin);
    set_nhwc(y, key.batch, key.height / 2, key.width / 2, key.cin);
    RINGTRAIN_CHECK_CUDNN(cudnnSetPooling2dDescriptor(
        pool.get(), CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_PROPAGATE_NAN, /*windowHeight=*/2,
        /*windowWidth=*/2, /*verticalPadding=*/0, /*horizontalPadding=*/0,
        /*verticalStride=*/2, /*horizontalStride=*/2));
  }
};

// Every plan made so far, by key. A plan is built on first use of its key and then reused, so
// a shape's first call allocates (cudaMalloc, which may synchronise the device) and queries
// cuDNN, and every later call allocates nothing. Another shape, batch size (e.g. the last,
// short batch of an evaluation) or handle gets a plan of its own beside the others; nothing
// is ever reallocated in place, so no queued work can see a buffer freed under it. The
// number of plans is the number of distinct (layer shape, batch size) pairs a run uses: a
// few. Each plan has buffers of its own, used only on the stream in its key, in stream order
// (so two layers of the same shape can share a plan: their calls never overlap).
//
// Keyed by the handle pointer rather than owned by GpuContext, so that Context needs nothing
// beyond conv_impl. A handle destroyed without release_plans leaves its plans here; a new
// handle at the same address on the same device and stream could only reuse them as they are
// (descriptors do not refer to a handle; buffers and algorithms belong to the device).
class PlanCache {
 public:
  ConvPlan& conv(cudnnHandle_t handle, const PlanKey& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<ConvPlan>& plan = conv_plans_[key];
    if (plan == nullptr) {
      try {
        plan = std::make_unique<ConvPlan>(handle, key);
      } catch (...) {
        conv_plans_.erase(key);
        throw;
      }
    }
    return *plan;
  }
  PoolPlan& pool(const PlanKey& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<PoolPlan>& plan = pool_plans_[key];
    if (plan == nullptr) {
      try {
        plan = std::make_unique<PoolPlan>(key);
      } catch (...) {
        pool_plans_.erase(key);
        throw;
      }
    }
    return *plan;
  }
  void release(cudnnHandle_t handle) {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(conv_plans_,
                  [handle](const auto& entry) { return entry.first.handle == handle; });
    std::erase_if(pool_plans_,
                  [handle](const auto& entry) { return entry.first.handle == handle; });
  }

 private:
  std::mutex mutex_;
  // std::map: a plan's address never changes while others are added.
  std::map<PlanKey, std::unique_ptr<ConvPlan>> conv_plans_;
  std::map<PlanKey, std::unique_ptr<PoolPlan>> pool_plans_;
};

// Never destroyed: its destructor would cudaFree at exit, and cudaFree waits for the whole
// device, which after a failed NCCL transfer could block the exit (docs/gpu-path.md); the
// driver reclaims the memory when the process ends. release_plans frees plans explicitly.
PlanCache& plan_cache() {
  static PlanCache* const cache = new PlanCache;
  return *cache;
}

PlanKey key_of(const Context& ctx, cudnnHandle_t handle, int64_t batch, int64_t height,
               int64_t width, int64_t cin, int64_t cout) {
  return PlanKey{.handle = handle,
                 .stream = stream_of(ctx),
                 .gpu = ctx.gpu,
                 .batch = batch,
                 .height = height,
                 .width = width,
                 .cin = cin,
                 .cout = cout};
}

}  // namespace

void conv2d_forward(const Context& ctx, const float* x, const float* w, const float* b, float* y,
                    int64_t batch, int64_t height, int64_t width, int64_t cin, int64_t cout) {
  check_conv_shape(batch, height, width, cin, cout);
  const cudnnHandle_t handle = handle_of(ctx);
  const cudaStream_t stream = stream_of(ctx);
  ConvPlan& plan = plan_cache().conv(handle, key_of(ctx, handle, batch, height, width, cin, cout));
  gpu::transpose_hwio_to_krsc(w, plan.w_krsc.floats(), kTaps, cin, cout, stream);
  RINGTRAIN_CHECK_CUDNN(cudnnConvolutionForward(
      handle, &kOne, plan.x.get(), x, plan.w.get(), plan.w_krsc.get(), plan.conv.get(),
      plan.forward_algo, plan.workspace.get(), plan.workspace.bytes(), &kZero, plan.y.get(), y));
  gpu::bias_add(y, b, batch * height * width, cout, stream);
}

void conv2d_backward(const Context& ctx, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, int64_t batch, int64_t height, int64_t width,
                     int64_t cin, int64_t cout, float* workspace, int64_t workspace_floats) {
  check_conv_shape(batch, height, width, cin, cout);
  const cudnnHandle_t handle = handle_of(ctx);
  const cudaStream_t stream = stream_of(ctx);
  ConvPlan& plan = plan_cache().conv(handle, key_of(ctx, handle, batch, height, width, cin, cout));
  if (dw != nullptr) {
    RINGTRAIN_CHECK_CUDNN(cudnnConvolutionBackwardFilter(
        handle, &kOne, plan.x.get(), x, plan.y.get(), dy, plan.conv.get(),
        plan.backward_filter_algo, plan.workspace.get(), plan.workspace.bytes(), &kZero,
        plan.w.get(), plan.dw_krsc.get()));
    gpu::transpose_krsc_to_hwio(plan.dw_krsc.floats(), dw, kTaps, cin, cout, stream);
    gpu::bias_grad(dy, db, batch * height * width, cout, workspace, workspace_floats, stream);
  }
  if (dx != nullptr) {
    // w changed since the forward (the optimizer ran) or not: transpose it again either way,
    // it is 9 * Cin * Cout floats, and no "still valid" bookkeeping can go stale.
    gpu::transpose_hwio_to_krsc(w, plan.w_krsc.floats(), kTaps, cin, cout, stream);
    RINGTRAIN_CHECK_CUDNN(cudnnConvolutionBackwardData(
        handle, &kOne, plan.w.get(), plan.w_krsc.get(), plan.y.get(), dy, plan.conv.get(),
        plan.backward_data_algo, plan.workspace.get(), plan.workspace.bytes(), &kZero, plan.x.get(),
        dx));
  }
}

void maxpool2d_forward(const Context& ctx, const float* x, float* y, int64_t batch, int64_t height,
                       int64_t width, int64_t channels) {
  check_pool_shape(batch, height, width, channels);
  const cudnnHandle_t handle = handle_of(ctx);
  const PoolPlan& plan = plan_cache().pool(key_of(ctx, handle, batch, height, width, channels, 0));
  RINGTRAIN_CHECK_CUDNN(cudnnPoolingForward(handle, plan.pool.get(), &kOne, plan.x.get(), x, &kZero,
                                            plan.y.get(), y));
}

void maxpool2d_backward(const Context& ctx, const float* x, const float* y, const float* dy,
                        float* dx, int64_t batch, int64_t height, int64_t width, int64_t channels) {
  check_pool_shape(batch, height, width, channels);
  const cudnnHandle_t handle = handle_of(ctx);
  const PoolPlan& plan = plan_cache().pool(key_of(ctx, handle, batch, height, width, channels, 0));
  // Which of tied maxima receives dy is cuDNN's (undocumented) choice: see the top of the file.
  RINGTRAIN_CHECK_CUDNN(cudnnPoolingBackward(handle, plan.pool.get(), &kOne, plan.y.get(), y,
                                             plan.y.get(), dy, plan.x.get(), x, &kZero,
                                             plan.x.get(), dx));
}

void release_plans(DnnHandle dnn_handle) {
  plan_cache().release(static_cast<cudnnHandle_t>(dnn_handle));
}

}  // namespace ringtrain::cudnn_layers
