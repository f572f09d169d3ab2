// The layers' GPU math, called by the layers in src/layers/ when ctx.device is kCuda: the
// device twins of ops.h, float only, asynchronous on ctx.stream (cuBLAS and the kernels), all
// pointers device pointers. Declared in every build; the GPU build defines them in
// src/cuda/gpu_layers.cpp, the CPU-only build in src/gpu_stubs.cpp, where each throws
// "this build has no GPU path" (so the layers need no #ifdef).
//
// Dense through cuBLAS, in full float32 (CUBLAS_DEFAULT_MATH, gpu_context.h). Our matrices are
// row-major; cuBLAS is column-major, and a row-major M[r,c] is the column-major M^T with
// leading dimension c. So every product is computed transposed, with no copies:
//   y[B,out]   = x[B,in] w[in,out]   <=>  y^T[out,B] = w^T[out,in] x^T[in,B]
//                cublasSgemm(N, N, m=out, n=B, k=in, w, ld=out, x, ld=in, y, ld=out)
//   dw[in,out] = x^T dy              <=>  dw^T[out,in] = dy^T[out,B] x[B,in]
//                cublasSgemm(N, T, m=out, n=rows, k=B, dy, ld=out, x+r0, ld=in, dw+r0*out, ld=out)
//   dx[B,in]   = dy w^T              <=>  dx^T[in,B] = w[in,out] dy^T[out,B]
//                cublasSgemm(T, N, m=in, n=B, k=out, w, ld=out, dy, ld=out, dx, ld=in)
// The bias is gpu::bias_add after the GEMM (the CPU writes it first and accumulates the GEMM
// onto it: the same sum up to rounding) and gpu::bias_grad.
#pragma once

#include <cstdint>

#include "ringtrain/context.h"

namespace ringtrain::gpu_ops {

void dense_forward(const Context& ctx, const float* x, const float* w, const float* b, float* y,
                   int64_t batch, int64_t in, int64_t out);
// Rows [row_begin, row_end) of dw = x^T dy.
void dense_backward_weight_rows(const Context& ctx, const float* x, const float* dy, float* dw,
                                int64_t batch, int64_t in, int64_t out, int64_t row_begin,
                                int64_t row_end);
// db = column sums of dy[rows, out] (Dense and, over B*H*W rows, Conv2D).
void bias_backward(const Context& ctx, const float* dy, float* db, int64_t rows, int64_t out);
void dense_backward_input(const Context& ctx, const float* w, const float* dy, float* dx,
                          int64_t batch, int64_t in, int64_t out);

void relu_forward(const Context& ctx, const float* x, float* y, int64_t n);
void relu_backward(const Context& ctx, const float* y, const float* dy, float* dx, int64_t n);

// The direct kernels of kernels/conv.h, or cuDNN when ctx.conv_impl is ConvImpl::kCudnn
// (src/cuda/cudnn_layers.h; --conv-impl).
void conv2d_forward(const Context& ctx, const float* x, const float* w, const float* b, float* y,
                    int64_t batch, int64_t height, int64_t width, int64_t cin, int64_t cout);
// dw and db (either both or neither), dx may be null to skip. The weight and bias gradients
// are sums over B*H*W pixels (100352 at batch 128 on 28x28), done in chunks over many blocks
// with their partial sums in `workspace` (device memory of conv2d_backward_workspace_floats
// floats; unused, and may be null, when dw is).
void conv2d_backward(const Context& ctx, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, int64_t batch, int64_t height, int64_t width,
                     int64_t cin, int64_t cout, float* workspace, int64_t workspace_floats);
int64_t conv2d_backward_workspace_floats(int64_t batch, int64_t height, int64_t width, int64_t cin,
                                         int64_t cout);
void maxpool2d_forward(const Context& ctx, const float* x, float* y, int64_t batch, int64_t height,
                       int64_t width, int64_t channels);
void maxpool2d_backward(const Context& ctx, const float* x, const float* y, const float* dy,
                        float* dx, int64_t batch, int64_t height, int64_t width, int64_t channels);

}  // namespace ringtrain::gpu_ops
