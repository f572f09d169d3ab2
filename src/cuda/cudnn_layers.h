// The cuDNN implementation of the GPU Conv2D 3x3 (stride 1, pad 1) and MaxPool2D 2x2 (stride
// 2), chosen by Context::conv_impl == ConvImpl::kCudnn (gpu_layers.cpp dispatches). Private to
// src/cuda/. The same contracts, shapes and layouts as the direct kernels (kernels/conv.h):
// NHWC activations, HWIO weights w[3,3,Cin,Cout], bias[Cout], device pointers, asynchronous on
// ctx.stream; how and why it differs from them: cudnn_layers.cpp.
#pragma once

#include <cstdint>

#include "ringtrain/context.h"

namespace ringtrain::cudnn_layers {

// y = bias + conv(x, w).
void conv2d_forward(const Context& ctx, const float* x, const float* w, const float* b, float* y,
                    int64_t batch, int64_t height, int64_t width, int64_t cin, int64_t cout);
// dw and db (either both or neither; they are overwritten), dx may be null to skip.
// workspace: for the bias gradient, as gpu_ops::conv2d_backward's.
void conv2d_backward(const Context& ctx, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, int64_t batch, int64_t height, int64_t width,
                     int64_t cin, int64_t cout, float* workspace, int64_t workspace_floats);
// x[B,H,W,C] -> y[B,H/2,W/2,C], H and W even.
void maxpool2d_forward(const Context& ctx, const float* x, float* y, int64_t batch, int64_t height,
                       int64_t width, int64_t channels);
// dx (overwritten) from the forward's x, y and dy. Tied maxima: see cudnn_layers.cpp.
void maxpool2d_backward(const Context& ctx, const float* x, const float* y, const float* dy,
                        float* dx, int64_t batch, int64_t height, int64_t width, int64_t channels);

// Frees the cached descriptors and scratch buffers made for `dnn_handle` (a cudnnHandle_t).
// Call it before destroying the handle when the process goes on using the GPU (otherwise the
// cache keeps them until exit; harmless but held). Synchronises the device (cudaFree).
void release_plans(DnnHandle dnn_handle);

}  // namespace ringtrain::cudnn_layers
