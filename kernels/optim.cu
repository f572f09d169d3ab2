// The optimizer and EMA updates over the flat parameter buffer: one thread per element
// (grid-stride, 256-thread blocks), the GPU twins of the loops in src/optim.cpp and
// src/ema.cpp. The CPU loops are compiled by GCC with -march=native, and GCC contracts
// a * b + c into a fused multiply-add wherever the target has one (-ffp-contract=fast is its
// default for C++, -std=c++20 included); the contraction it chooses is spelled out below with
// explicit intrinsics (__fmaf_rn for each fused pair, __fmul_rn / __fadd_rn / __fdiv_rn /
// __fsqrt_rn for each separately rounded operation), so nvcc can neither contract differently
// nor reassociate, and on an FMA-capable x86-64 build host the GPU update has the CPU's bits.
// kernels/README.md has the GIMPLE that shows GCC's choices and what to expect on a build
// without FMA (RINGTRAIN_NATIVE=OFF: an ulp or so per step).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels.h"
#include "launch.cuh"

namespace ringtrain::gpu {

namespace {

using detail::grid_threads;
using detail::kThreads;
using detail::thread_index;

enum class SgdKind { kPlain, kMomentum, kNesterov };

// GCC on optim.cpp (per element, wd = weight_decay, mu = momentum):
//   g = fma(wd, w, grad)
//   plain:    w = fma(-lr, g, w)                           (w -= lr * g)
//   momentum: v = fma(mu, v, g);  w = fma(-lr, v, w)
//   nesterov: v = fma(mu, v, g);  w = fma(-lr, fma(mu, v, g), w)
// (fma(-lr, x, w) is GCC's FNMA(lr, x, w) = w - lr * x rounded once: negation is exact.)
template <SgdKind kKind>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(float* w, const float* grad, float* velocity, int64_t n, float lr,
               float weight_decay, float momentum) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    const float wi = w[i];
    const float g = __fmaf_rn(weight_decay, wi, grad[i]);
    if constexpr (kKind == SgdKind::kPlain) {
      w[i] = __fmaf_rn(-lr, g, wi);
    } else {
      const float vi = __fmaf_rn(momentum, velocity[i], g);
      velocity[i] = vi;
      if constexpr (kKind == SgdKind::kMomentum) {
        w[i] = __fmaf_rn(-lr, vi, wi);
      } else {
        w[i] = __fmaf_rn(-lr, __fmaf_rn(momentum, vi, g), wi);
      }
    }
  }
}

// GCC on optim.cpp's adam_update:
//   g  = fma(wd, w, grad)
//   m  = fma(beta1, m, (1 - beta1) * g)
//   v  = fma(beta2, v, g * ((1 - beta2) * g))
//   w  = w - (step_size * m) / fma(inv_sqrt_bias2, sqrt(v), eps)
__global__ void __launch_bounds__(kThreads)
    adam_kernel(float* w, const float* grad, float* m, float* v, int64_t n, AdamConstants k) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    const float wi = w[i];
    const float g = __fmaf_rn(k.weight_decay, wi, grad[i]);
    const float mi = __fmaf_rn(k.beta1, m[i], __fmul_rn(k.one_minus_beta1, g));
    const float vi = __fmaf_rn(k.beta2, v[i], __fmul_rn(g, __fmul_rn(k.one_minus_beta2, g)));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fmaf_rn(k.inv_sqrt_bias2, __fsqrt_rn(vi), k.epsilon);
    w[i] = __fsub_rn(wi, __fdiv_rn(__fmul_rn(k.step_size, mi), denom));
  }
}

// GCC on ema.cpp: shadow = fma(keep, shadow, take * w).
__global__ void __launch_bounds__(kThreads)
    ema_kernel(float* shadow, const float* w, int64_t n, float keep, float take) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    shadow[i] = __fmaf_rn(keep, shadow[i], __fmul_rn(take, w[i]));
  }
}

}  // namespace

void sgd_update(float* w, const float* grad, float* velocity, int64_t n, float lr,
                float weight_decay, float momentum, bool nesterov, cudaStream_t stream) {
  detail::check_size(n, "sgd_update");
  if (n == 0) return;
  const unsigned int blocks = detail::blocks_for(n);
  if (velocity == nullptr) {
    sgd_kernel<SgdKind::kPlain>
        <<<blocks, kThreads, 0, stream>>>(w, grad, nullptr, n, lr, weight_decay, momentum);
  } else if (nesterov) {
    sgd_kernel<SgdKind::kNesterov>
        <<<blocks, kThreads, 0, stream>>>(w, grad, velocity, n, lr, weight_decay, momentum);
  } else {
    sgd_kernel<SgdKind::kMomentum>
        <<<blocks, kThreads, 0, stream>>>(w, grad, velocity, n, lr, weight_decay, momentum);
  }
  RINGTRAIN_CHECK_LAUNCH();
}

void adam_update(float* w, const float* grad, float* m, float* v, int64_t n,
                 const AdamConstants& constants, cudaStream_t stream) {
  detail::check_size(n, "adam_update");
  if (n == 0) return;
  adam_kernel<<<detail::blocks_for(n), kThreads, 0, stream>>>(w, grad, m, v, n, constants);
  RINGTRAIN_CHECK_LAUNCH();
}

void ema_update(float* shadow, const float* w, int64_t n, float keep, float take,
                cudaStream_t stream) {
  detail::check_size(n, "ema_update");
  if (n == 0) return;
  ema_kernel<<<detail::blocks_for(n), kThreads, 0, stream>>>(shadow, w, n, keep, take);
  RINGTRAIN_CHECK_LAUNCH();
}

}  // namespace ringtrain::gpu
