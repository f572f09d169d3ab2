// The CUDA kernels' launchers (GPU build only). Each launcher checks its launch
// (RINGTRAIN_CHECK_LAUNCH) and runs asynchronously on the given stream; all pointers are
// device pointers unless said otherwise. Each kernel has a CPU twin that the GPU tests compare
// it with (tests/gpu/): the twin is named in the comment.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ringtrain/optim_math.h"

namespace ringtrain::gpu {

// The update kernels take their per-step constants from the host helpers the CPU loops use
// (optim_math.h), under these names.
using ringtrain::adam_constants;
using ringtrain::AdamConstants;
using ringtrain::ema_factors;
using ringtrain::EmaFactors;

// ---- dense layer pieces (the GEMMs are cuBLAS) ----
// y[r, c] += bias[c] for r < rows, c < cols.                    Twin: dense_forward's bias.
void bias_add(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// dbias[c] = sum over r of dy[r, c] (overwrites).               Twin: dense_backward's db.
void bias_grad(const float* dy, float* dbias, int64_t rows, int64_t cols, cudaStream_t stream);
// Both forms are deterministic (fixed summation order, no float atomics). The form above is
// one pass with one block per 32 columns, so a tall dy (a conv's [B*H*W, Cout]) runs on a few
// SMs; this form splits the rows into chunks of 1024 over many blocks, then sums the chunks'
// partial sums, given a device workspace of bias_grad_workspace_floats(rows, cols) floats
// (0 when rows <= 1024: then it is the one-pass form, same bits). The two forms add in
// different orders, so their results may differ in the last bits; each is the same every run.
int64_t bias_grad_workspace_floats(int64_t rows, int64_t cols);
void bias_grad(const float* dy, float* dbias, int64_t rows, int64_t cols, float* workspace,
               int64_t workspace_floats, cudaStream_t stream);

// ---- ReLU over n values (NaN passes through) ----                Twin: relu_forward/backward.
void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream);
void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream);

// ---- fused softmax cross-entropy over logits[rows, classes] ----   Twin: softmax_xent.
// Device-side results of one call. Every call overwrites all three fields (the kernel stores
// the block's totals; with 0 rows the launcher memsets them to 0): nothing is accumulated
// across calls and no zeroing is needed before one. (Review fix: this comment used to say the
// launcher zeroes them before the kernel runs, which it does not.)
struct XentStats {
  double loss_sum;                // sum over rows of -log softmax[label]
  unsigned long long correct;     // rows whose arg-max (first maximum) equals the label
  unsigned long long bad_labels;  // rows whose label is outside [0, classes)
};
// dlogits = (softmax - onehot) / rows when dlogits is not null.
void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows,
                  int64_t classes, XentStats* stats, cudaStream_t stream);

// ---- optimizer updates over the flat buffers ----                 Twin: Optimizer::step.
// g = grad + weight_decay * w; without momentum (velocity null) w -= lr * g; with momentum
// v = momentum * v + g and w -= lr * v, or w -= lr * (g + momentum * v) when nesterov.
void sgd_update(float* w, const float* grad, float* velocity, int64_t n, float lr,
                float weight_decay, float momentum, bool nesterov, cudaStream_t stream);
void adam_update(float* w, const float* grad, float* m, float* v, int64_t n,
                 const AdamConstants& constants, cudaStream_t stream);
// shadow = keep * shadow + take * w.                                Twin: WeightEma::update.
void ema_update(float* shadow, const float* w, int64_t n, float keep, float take,
                cudaStream_t stream);

// ---- the ring's arithmetic and helpers ----
// dst[i] += src[i].                                                 Twin: Comm::add_inplace.
void add_inplace(float* dst, const float* src, int64_t n, cudaStream_t stream);
// x[i] *= factor (the average after a sum).
void scale(float* x, float factor, int64_t n, cudaStream_t stream);
// x[i] /= divisor, an IEEE division per value: the same bits as ring.cpp's `data[i] /= divisor`
// and Comm::divide_inplace (x * (1 / divisor) can differ from it by an ulp).
void divide(float* x, float divisor, int64_t n, cudaStream_t stream);
// *count += the number of NaN or Inf values in x[0, n) (--check-finite).
void count_nonfinite(const float* x, int64_t n, unsigned long long* count, cudaStream_t stream);

}  // namespace ringtrain::gpu
