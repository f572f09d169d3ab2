// Elementwise kernels: the dense layer's bias add, ReLU forward and backward, and the ring's
// arithmetic (add, scale, divide). Each is a grid-stride loop over int64 indices in 256-thread
// blocks (launch.cuh). The ring's in-place kernels also have a float4 path: it is taken only
// when the pointers are, or can be brought to, 16-byte alignment together (checked at run
// time: the ring works on chunks of a flat buffer that start at any float offset), with the
// few unaligned values at either end done one at a time. Every operation is one correctly
// rounded IEEE operation written as an intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn), so nvcc
// cannot contract or reassociate it and the result equals the CPU twin's bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.h"
#include "launch.cuh"

namespace ringtrain::gpu {

namespace {

using detail::grid_threads;
using detail::kThreads;
using detail::thread_index;

// ---- the ring's in-place maps: dst = op(dst, src) and x = op(x) ----

struct AddOp {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
struct ScaleOp {
  float factor;
  __device__ float operator()(float a) const { return __fmul_rn(a, factor); }
};
struct DivideOp {
  float divisor;
  __device__ float operator()(float a) const { return __fdiv_rn(a, divisor); }
};

// dst[i] = op(dst[i], src[i]) for i < n: float4 over [head, head + 4 * n4), scalars elsewhere.
// n4 = 0 and head = n when the pointers cannot be aligned together (all scalar).
template <class Op>
__global__ void __launch_bounds__(kThreads)
    binary_inplace_kernel(float* dst, const float* src, int64_t n, int64_t head, int64_t n4,
                          Op op) {
  const int64_t first = thread_index();
  const int64_t stride = grid_threads();
  float4* dst4 = reinterpret_cast<float4*>(dst + head);
  const float4* src4 = reinterpret_cast<const float4*>(src + head);
  for (int64_t j = first; j < n4; j += stride) {
    float4 a = dst4[j];
    const float4 b = src4[j];
    a.x = op(a.x, b.x);
    a.y = op(a.y, b.y);
    a.z = op(a.z, b.z);
    a.w = op(a.w, b.w);
    dst4[j] = a;
  }
  for (int64_t i = first; i < head; i += stride) dst[i] = op(dst[i], src[i]);
  for (int64_t i = head + 4 * n4 + first; i < n; i += stride) dst[i] = op(dst[i], src[i]);
}

// x[i] = op(x[i]) for i < n, with the same split as binary_inplace_kernel.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    unary_inplace_kernel(float* x, int64_t n, int64_t head, int64_t n4, Op op) {
  const int64_t first = thread_index();
  const int64_t stride = grid_threads();
  float4* x4 = reinterpret_cast<float4*>(x + head);
  for (int64_t j = first; j < n4; j += stride) {
    float4 a = x4[j];
    a.x = op(a.x);
    a.y = op(a.y);
    a.z = op(a.z);
    a.w = op(a.w);
    x4[j] = a;
  }
  for (int64_t i = first; i < head; i += stride) x[i] = op(x[i]);
  for (int64_t i = head + 4 * n4 + first; i < n; i += stride) x[i] = op(x[i]);
}

// The float4 split of n values starting at p (and at q, which must share p's alignment):
// head scalars, then n4 float4s; head = n, n4 = 0 when there is no common alignment.
struct Split {
  int64_t head;
  int64_t n4;
};
Split split_for_float4(const float* p, const float* q, int64_t n) {
  const int64_t head = detail::head_to_aligned16(p);
  if (n - head < 4) return Split{n, 0};                                  // no whole float4 inside
  if (q != nullptr && !detail::aligned16(q + head)) return Split{n, 0};  // no common alignment
  return Split{head, (n - head) / 4};
}

template <class Op>
void launch_unary_inplace(float* x, int64_t n, Op op, cudaStream_t stream) {
  const Split split = split_for_float4(x, nullptr, n);
  // float4s plus at most 6 scalars (the head and the tail); the scalars need no blocks of
  // their own: the first threads of the grid do them.
  const int64_t items = split.n4 > 0 ? split.n4 : n;
  unary_inplace_kernel<<<detail::blocks_for(items), kThreads, 0, stream>>>(x, n, split.head,
                                                                           split.n4, op);
  RINGTRAIN_CHECK_LAUNCH();
}

// ---- ReLU ----

// y = x where x > 0 or x is NaN, else +0 (relu.cpp: NaN passes through).
__global__ void __launch_bounds__(kThreads)
    relu_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    const float v = x[i];
    y[i] = (v > 0.0f || isnan(v)) ? v : 0.0f;
  }
}

// dx = dy where the saved output y > 0, else +0.
__global__ void __launch_bounds__(kThreads)
    relu_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

// ---- the bias add: y[r, c] += bias[c] over the flat index i = r * cols + c ----
// Index is uint32_t when rows * cols < 2^32 (the column is i % cols: a 32-bit remainder is
// several times cheaper than a 64-bit one on the GPU), else int64_t.
template <typename Index>
__global__ void __launch_bounds__(kThreads)
    bias_add_kernel(float* y, const float* bias, Index n, Index cols) {
  const Index stride = static_cast<Index>(grid_threads());
  for (Index i = static_cast<Index>(thread_index()); i < n; i += stride) {
    y[i] = __fadd_rn(y[i], bias[i % cols]);
  }
}

}  // namespace

void bias_add(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  detail::check_size(rows, "bias_add rows");
  detail::check_size(cols, "bias_add cols");
  if (rows == 0 || cols == 0) return;
  RINGTRAIN_CHECK(rows <= INT64_MAX / cols, "gpu::bias_add: {} x {} values overflow int64", rows,
                  cols);
  const int64_t n = rows * cols;
  // The uint32 kernel's i += stride must not wrap: n + stride stays below 2^32.
  const int64_t max_stride = detail::kMaxBlocks * kThreads;
  if (n < (int64_t{1} << 32) - max_stride) {
    bias_add_kernel<uint32_t><<<detail::blocks_for(n), kThreads, 0, stream>>>(
        y, bias, static_cast<uint32_t>(n), static_cast<uint32_t>(cols));
  } else {
    bias_add_kernel<int64_t><<<detail::blocks_for(n), kThreads, 0, stream>>>(y, bias, n, cols);
  }
  RINGTRAIN_CHECK_LAUNCH();
}

void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  detail::check_size(n, "relu_forward");
  if (n == 0) return;
  relu_forward_kernel<<<detail::blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  RINGTRAIN_CHECK_LAUNCH();
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream) {
  detail::check_size(n, "relu_backward");
  if (n == 0) return;
  relu_backward_kernel<<<detail::blocks_for(n), kThreads, 0, stream>>>(y, dy, dx, n);
  RINGTRAIN_CHECK_LAUNCH();
}

void add_inplace(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  detail::check_size(n, "add_inplace");
  if (n == 0) return;
  const Split split = split_for_float4(dst, src, n);
  const int64_t items = split.n4 > 0 ? split.n4 : n;
  binary_inplace_kernel<<<detail::blocks_for(items), kThreads, 0, stream>>>(dst, src, n, split.head,
                                                                            split.n4, AddOp{});
  RINGTRAIN_CHECK_LAUNCH();
}

void scale(float* x, float factor, int64_t n, cudaStream_t stream) {
  detail::check_size(n, "scale");
  if (n == 0) return;
  launch_unary_inplace(x, n, ScaleOp{factor}, stream);
}

void divide(float* x, float divisor, int64_t n, cudaStream_t stream) {
  detail::check_size(n, "divide");
  if (n == 0) return;
  launch_unary_inplace(x, n, DivideOp{divisor}, stream);
}

}  // namespace ringtrain::gpu
