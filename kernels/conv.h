// Direct kernels for the cnn's 3x3 convolution and 2x2 max pooling (GPU build only), NHWC
// activations and TensorFlow's HWIO weights w[3,3,Cin,Cout], the layouts of the CPU layers.
//
// Why these and not cuDNN by default: cuDNN's NHWC filter layout is KRSC ([Cout,3,3,Cin]), so
// each step transposes w forward and dw back; the shapes are tiny (1->8 and 8->16 channels on
// 28x28 and 14x14), where a direct kernel is one launch with no workspace; and cuDNN's
// max-pooling backward does not document which of tied maxima receives the gradient, while the
// CPU sends it to the first in row-major window order. These kernels reproduce the CPU math
// (the same sums in the same order, up to FMA contraction) and are deterministic: every
// reduction is a fixed tree, no atomics. A cuDNN implementation exists beside them
// (src/cuda/cudnn_layers.cpp, selected with --conv-impl cudnn, Context::conv_impl); which is
// faster on these and larger shapes has not been measured yet (no GPU when it was written).
//
// Launchers are asynchronous on `stream` and check their launch (RINGTRAIN_CHECK_LAUNCH).
// All pointers are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ringtrain::gpu {

// y[b,h,w,co] = bias[co] + sum over in-bounds taps (kh,kw) and ci of
// x[b,h+kh-1,w+kw-1,ci] * w[kh,kw,ci,co].                       Twin: conv2d_forward.
void conv2d_forward(const float* x, const float* w, const float* bias, float* y, int64_t batch,
                    int64_t height, int64_t width, int64_t cin, int64_t cout, cudaStream_t stream);
// dw[kh,kw,ci,co] = sum over pixels of x[p + tap offset, ci] * dy[p, co] (overwrites); the bias
// gradient is gpu::bias_grad over dy as [B*H*W, Cout].          Twin: conv2d_backward's dw.
// Summed per chunk of pixels, then over the chunks (conv.cu), in a device workspace of
// conv2d_backward_weights_workspace_floats(...) floats.
void conv2d_backward_weights(const float* x, const float* dy, float* dw, int64_t batch,
                             int64_t height, int64_t width, int64_t cin, int64_t cout,
                             float* workspace, int64_t workspace_floats, cudaStream_t stream);
int64_t conv2d_backward_weights_workspace_floats(int64_t batch, int64_t height, int64_t width,
                                                 int64_t cin, int64_t cout);
// dx[b,qh,qw,ci] = sum over taps whose output pixel is in bounds and co of
// w[kh,kw,ci,co] * dy[b,qh-kh+1,qw-kw+1,co] (overwrites).      Twin: conv2d_backward's dx.
void conv2d_backward_input(const float* w, const float* dy, float* dx, int64_t batch,
                           int64_t height, int64_t width, int64_t cin, int64_t cout,
                           cudaStream_t stream);

// x[B,H,W,C] -> y[B,H/2,W/2,C], H and W even.                    Twin: maxpool2d_forward.
void maxpool2d_forward(const float* x, float* y, int64_t batch, int64_t height, int64_t width,
                       int64_t channels, cudaStream_t stream);
// Each window's gradient goes to its first maximum in row-major order; the other three
// positions get 0 (every dx value written once).                 Twin: maxpool2d_backward.
void maxpool2d_backward(const float* x, const float* y, const float* dy, float* dx, int64_t batch,
                        int64_t height, int64_t width, int64_t channels, cudaStream_t stream);

}  // namespace ringtrain::gpu
