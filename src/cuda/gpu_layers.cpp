// The layers' GPU math (gpu_ops.h): cuBLAS for Dense, the kernels for everything else, all on
// the compute stream, nothing waited for. Conv2D and MaxPool2D run the direct kernels
// (kernels/conv.h) or, with ctx.conv_impl == ConvImpl::kCudnn, cuDNN (cudnn_layers.h).
#include "ringtrain/gpu_ops.h"

#include "conv.h"
#include "cudnn_layers.h"
#include "kernels.h"
#include "ringtrain/cuda_check.h"

namespace ringtrain::gpu_ops {

namespace {

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

cublasHandle_t blas_of(const Context& ctx) {
  RINGTRAIN_CHECK(ctx.device == Device::kCuda && ctx.blas != nullptr,
                  "GPU math on a context without a cuBLAS handle (make it with GpuContext)");
  return static_cast<cublasHandle_t>(ctx.blas);
}

int as_int(int64_t value, const char* what) {
  RINGTRAIN_CHECK(value >= 0 && value <= 0x7fffffff, "{} = {} is out of cuBLAS's int range", what,
                  value);
  return static_cast<int>(value);
}

}  // namespace

void dense_forward(const Context& ctx, const float* x, const float* w, const float* b, float* y,
                   int64_t batch, int64_t in, int64_t out) {
  const float one = 1.0f, zero = 0.0f;
  const int m = as_int(out, "out"), n = as_int(batch, "batch"), k = as_int(in, "in");
  RINGTRAIN_CHECK_CUBLAS(
      cublasSgemm(blas_of(ctx), CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, w, m, x, k, &zero, y, m));
  gpu::bias_add(y, b, batch, out, stream_of(ctx));
}

void dense_backward_weight_rows(const Context& ctx, const float* x, const float* dy, float* dw,
                                int64_t batch, int64_t in, int64_t out, int64_t row_begin,
                                int64_t row_end) {
  RINGTRAIN_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= in,
                  "weight rows [{}, {}) of {}", row_begin, row_end, in);
  if (row_end == row_begin) return;
  const float one = 1.0f, zero = 0.0f;
  const int m = as_int(out, "out"), n = as_int(row_end - row_begin, "rows"),
            k = as_int(batch, "batch"), ldx = as_int(in, "in");
  RINGTRAIN_CHECK_CUBLAS(cublasSgemm(blas_of(ctx), CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &one, dy, m,
                                     x + row_begin, ldx, &zero, dw + row_begin * out, m));
}

void bias_backward(const Context& ctx, const float* dy, float* db, int64_t rows, int64_t out) {
  gpu::bias_grad(dy, db, rows, out, stream_of(ctx));
}

void dense_backward_input(const Context& ctx, const float* w, const float* dy, float* dx,
                          int64_t batch, int64_t in, int64_t out) {
  const float one = 1.0f, zero = 0.0f;
  const int m = as_int(in, "in"), n = as_int(batch, "batch"), k = as_int(out, "out");
  RINGTRAIN_CHECK_CUBLAS(cublasSgemm(blas_of(ctx), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, k,
                                     dy, k, &zero, dx, m));
}

void relu_forward(const Context& ctx, const float* x, float* y, int64_t n) {
  gpu::relu_forward(x, y, n, stream_of(ctx));
}

void relu_backward(const Context& ctx, const float* y, const float* dy, float* dx, int64_t n) {
  gpu::relu_backward(y, dy, dx, n, stream_of(ctx));
}

void conv2d_forward(const Context& ctx, const float* x, const float* w, const float* b, float* y,
                    int64_t batch, int64_t height, int64_t width, int64_t cin, int64_t cout) {
  if (ctx.conv_impl == ConvImpl::kCudnn) {
    return cudnn_layers::conv2d_forward(ctx, x, w, b, y, batch, height, width, cin, cout);
  }
  gpu::conv2d_forward(x, w, b, y, batch, height, width, cin, cout, stream_of(ctx));
}

// The workspace: the bias gradient's partial sums first, then the weight gradient's.
int64_t conv2d_backward_workspace_floats(int64_t batch, int64_t height, int64_t width, int64_t cin,
                                         int64_t cout) {
  return gpu::bias_grad_workspace_floats(batch * height * width, cout) +
         gpu::conv2d_backward_weights_workspace_floats(batch, height, width, cin, cout);
}

void conv2d_backward(const Context& ctx, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, int64_t batch, int64_t height, int64_t width,
                     int64_t cin, int64_t cout, float* workspace, int64_t workspace_floats) {
  RINGTRAIN_CHECK((dw == nullptr) == (db == nullptr),
                  "conv2d_backward: dw and db come together (both or neither)");
  const int64_t bias_floats = gpu::bias_grad_workspace_floats(batch * height * width, cout);
  const int64_t needed = conv2d_backward_workspace_floats(batch, height, width, cin, cout);
  RINGTRAIN_CHECK(dw == nullptr || (workspace != nullptr && workspace_floats >= needed),
                  "conv2d_backward: the workspace holds {} floats, {} are needed", workspace_floats,
                  needed);
  if (ctx.conv_impl == ConvImpl::kCudnn) {
    return cudnn_layers::conv2d_backward(ctx, x, w, dy, dw, db, dx, batch, height, width, cin, cout,
                                         workspace, bias_floats);
  }
  if (dw != nullptr) {
    gpu::conv2d_backward_weights(x, dy, dw, batch, height, width, cin, cout,
                                 workspace + bias_floats, workspace_floats - bias_floats,
                                 stream_of(ctx));
    gpu::bias_grad(dy, db, batch * height * width, cout, workspace, bias_floats, stream_of(ctx));
  }
  if (dx != nullptr) {
    gpu::conv2d_backward_input(w, dy, dx, batch, height, width, cin, cout, stream_of(ctx));
  }
}

void maxpool2d_forward(const Context& ctx, const float* x, float* y, int64_t batch, int64_t height,
                       int64_t width, int64_t channels) {
  if (ctx.conv_impl == ConvImpl::kCudnn) {
    return cudnn_layers::maxpool2d_forward(ctx, x, y, batch, height, width, channels);
  }
  gpu::maxpool2d_forward(x, y, batch, height, width, channels, stream_of(ctx));
}

void maxpool2d_backward(const Context& ctx, const float* x, const float* y, const float* dy,
                        float* dx, int64_t batch, int64_t height, int64_t width, int64_t channels) {
  if (ctx.conv_impl == ConvImpl::kCudnn) {
    return cudnn_layers::maxpool2d_backward(ctx, x, y, dy, dx, batch, height, width, channels);
  }
  gpu::maxpool2d_backward(x, y, dy, dx, batch, height, width, channels, stream_of(ctx));
}

}  // namespace ringtrain::gpu_ops
