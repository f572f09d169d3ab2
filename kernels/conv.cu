// The cnn's 3x3 convolution and 2x2 max pooling as direct kernels (see conv.h for why not
// cuDNN). The forward and input-gradient kernels sum in the order of their CPU twins in
// src/layers/; the weight gradient is a fixed partition of the pixels into chunks whose sums
// are added in a fixed order (no atomics), so every result is deterministic.
#include "conv.h"

#include <algorithm>

#include "kernels.h"

#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"

namespace ringtrain::gpu {

namespace {

constexpr int kThreads = 256;

unsigned int blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  RINGTRAIN_CHECK(blocks <= 0x7fffffff, "a launch over {} elements is too large", n);
  return static_cast<unsigned int>(blocks);
}

// One thread per output value (b, h, w, co).
__global__ void conv2d_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ bias, float* __restrict__ y,
                                      int64_t total, int height, int width, int cin, int cout) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  const int co = static_cast<int>(index % cout);
  const int64_t pixel = index / cout;
  const int col = static_cast<int>(pixel % width);
  const int row = static_cast<int>((pixel / width) % height);
  const int64_t image = pixel / (static_cast<int64_t>(width) * height);
  const float* x_image = x + image * height * width * cin;
  float acc = bias[co];
  for (int kh = 0; kh < 3; ++kh) {
    const int ih = row + kh - 1;
    if (ih < 0 || ih >= height) continue;
    for (int kw = 0; kw < 3; ++kw) {
      const int iw = col + kw - 1;
      if (iw < 0 || iw >= width) continue;
      const float* x_pixel = x_image + (static_cast<int64_t>(ih) * width + iw) * cin;
      const float* tap = w + (kh * 3 + kw) * cin * cout + co;
      for (int ci = 0; ci < cin; ++ci) acc += x_pixel[ci] * tap[ci * cout];
    }
  }
  y[index] = acc;
}

// The weight gradient in two deterministic passes. Pass 1: block (x, y) gives each of its
// threads one weight (tap, ci, co) and the pixel chunk y; the thread walks the chunk's pixels
// in order, keeping (image, row, col) as counters (no division per pixel), and writes its sum
// to partial[chunk, weight]. Pass 2 is bias_grad's fixed-order column sum over the chunks.
// Threads of a warp share the pixel and differ in co (fastest), ci and tap: their dy reads
// are one sector, their x reads a small neighbourhood.
__global__ void conv2d_backward_weights_partial_kernel(const float* __restrict__ x,
                                                       const float* __restrict__ dy,
                                                       float* __restrict__ partial, int64_t pixels,
                                                       int64_t chunk, int height, int width,
                                                       int cin, int cout, int weights) {
  const int weight = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (weight >= weights) return;  // no barrier below: an early return is safe
  const int co = weight % cout;   // weight = ((kh * 3 + kw) * cin + ci) * cout + co
  const int ci = (weight / cout) % cin;
  const int tap = weight / (cout * cin);
  const int dh = tap / 3 - 1, dwid = tap % 3 - 1;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t end = begin + chunk < pixels ? begin + chunk : pixels;
  int col = static_cast<int>(begin % width);
  int row = static_cast<int>((begin / width) % height);
  int64_t image = begin / (static_cast<int64_t>(width) * height);
  float sum = 0.0f;
  for (int64_t p = begin; p < end; ++p) {
    const int ih = row + dh, iw = col + dwid;
    if (ih >= 0 && ih < height && iw >= 0 && iw < width) {
      const int64_t source = (image * height + ih) * width + iw;
      sum += x[source * cin + ci] * dy[p * cout + co];
    }
    if (++col == width) {
      col = 0;
      if (++row == height) {
        row = 0;
        ++image;
      }
    }
  }
  partial[static_cast<int64_t>(blockIdx.y) * weights + weight] = sum;
}

// One thread per input-gradient value (b, qh, qw, ci): a gather, so each is written once.
__global__ void conv2d_backward_input_kernel(const float* __restrict__ w,
                                             const float* __restrict__ dy, float* __restrict__ dx,
                                             int64_t total, int height, int width, int cin,
                                             int cout) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  const int ci = static_cast<int>(index % cin);
  const int64_t pixel = index / cin;
  const int qw = static_cast<int>(pixel % width);
  const int qh = static_cast<int>((pixel / width) % height);
  const int64_t image = pixel / (static_cast<int64_t>(width) * height);
  const float* dy_image = dy + image * height * width * cout;
  float acc = 0.0f;
  for (int kh = 0; kh < 3; ++kh) {
    const int h = qh - kh + 1;
    if (h < 0 || h >= height) continue;
    for (int kw = 0; kw < 3; ++kw) {
      const int c = qw - kw + 1;
      if (c < 0 || c >= width) continue;
      const float* grad = dy_image + (static_cast<int64_t>(h) * width + c) * cout;
      const float* tap = w + ((kh * 3 + kw) * cin + ci) * cout;
      for (int co = 0; co < cout; ++co) acc += grad[co] * tap[co];
    }
  }
  dx[index] = acc;
}

// The offset in x [B, H, W, C] of the top-left value of output value `index`'s 2x2 window
// (output [B, H/2, W/2, C], index = ((b * H/2 + i) * W/2 + j) * C + c).
__device__ __forceinline__ int64_t window_origin(int64_t index, int height, int width,
                                                 int channels) {
  const int out_h = height / 2, out_w = width / 2;
  const int c = static_cast<int>(index % channels);
  const int64_t cell = index / channels;
  const int j = static_cast<int>(cell % out_w);
  const int i = static_cast<int>((cell / out_w) % out_h);
  const int64_t image = cell / (static_cast<int64_t>(out_w) * out_h);
  return ((image * height + 2 * i) * width + 2 * j) * channels + c;
}

// One thread per output value (b, i, j, c).
__global__ void maxpool2d_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                         int64_t total, int height, int width, int channels) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  const float* top = x + window_origin(index, height, width, channels);
  const float* bottom = top + static_cast<int64_t>(width) * channels;
  float m = top[0];
  m = top[channels] > m ? top[channels] : m;
  m = bottom[0] > m ? bottom[0] : m;
  m = bottom[channels] > m ? bottom[channels] : m;
  y[index] = m;
}

// One thread per window and channel: the gradient to the first position (row-major) that
// holds the saved maximum, 0 to the others; the CPU's branch-free sequence.
__global__ void maxpool2d_backward_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                          const float* __restrict__ dy, float* __restrict__ dx,
                                          int64_t total, int height, int width, int channels) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  const int64_t p00 = window_origin(index, height, width, channels);
  const int64_t p01 = p00 + channels;
  const int64_t p10 = p00 + static_cast<int64_t>(width) * channels;
  const int64_t p11 = p10 + channels;
  const float m = y[index];
  float rest = dy[index];
  const bool hit00 = x[p00] == m;
  dx[p00] = hit00 ? rest : 0.0f;
  rest = hit00 ? 0.0f : rest;
  const bool hit01 = x[p01] == m;
  dx[p01] = hit01 ? rest : 0.0f;
  rest = hit01 ? 0.0f : rest;
  const bool hit10 = x[p10] == m;
  dx[p10] = hit10 ? rest : 0.0f;
  rest = hit10 ? 0.0f : rest;
  dx[p11] = x[p11] == m ? rest : 0.0f;
}

void check_conv_shape(int64_t batch, int64_t height, int64_t width, int64_t cin, int64_t cout) {
  RINGTRAIN_CHECK(batch > 0 && height > 0 && width > 0 && cin > 0 && cout > 0 &&
                      height * width <= 0x7fffffff && 9 * cin * cout <= 0x7fffffff,
                  "conv2d kernel: bad shape: batch {}, {}x{}, channels {}->{}", batch, height,
                  width, cin, cout);
}

// Pixels per chunk of the weight gradient's first pass: 256 (enough chunks to fill the GPU
// at the cnn's sizes), more when that would exceed the grid's 65535 rows.
int64_t weight_gradient_chunk(int64_t pixels) {
  return std::max<int64_t>(256, (pixels + 65534) / 65535);
}

void check_pool_shape(int64_t batch, int64_t height, int64_t width, int64_t channels) {
  RINGTRAIN_CHECK(
      batch > 0 && height > 0 && width > 0 && height % 2 == 0 && width % 2 == 0 && channels > 0,
      "maxpool2d kernel: bad shape: batch {}, {}x{}x{}", batch, height, width, channels);
}

}  // namespace

void conv2d_forward(const float* x, const float* w, const float* bias, float* y, int64_t batch,
                    int64_t height, int64_t width, int64_t cin, int64_t cout, cudaStream_t stream) {
  check_conv_shape(batch, height, width, cin, cout);
  const int64_t total = batch * height * width * cout;
  conv2d_forward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
      x, w, bias, y, total, static_cast<int>(height), static_cast<int>(width),
      static_cast<int>(cin), static_cast<int>(cout));
  RINGTRAIN_CHECK_LAUNCH();
}

void conv2d_backward_weights(const float* x, const float* dy, float* dw, int64_t batch,
                             int64_t height, int64_t width, int64_t cin, int64_t cout,
                             float* workspace, int64_t workspace_floats, cudaStream_t stream) {
  check_conv_shape(batch, height, width, cin, cout);
  const int64_t pixels = batch * height * width, weights = 9 * cin * cout;
  const int64_t chunk = weight_gradient_chunk(pixels);
  const int64_t chunks = (pixels + chunk - 1) / chunk;
  RINGTRAIN_CHECK(workspace != nullptr && workspace_floats >= chunks * weights,
                  "conv2d_backward_weights: a workspace of {} floats is needed, {} given",
                  chunks * weights, workspace_floats);
  constexpr int kWeightThreads = 128;
  const dim3 grid(static_cast<unsigned int>((weights + kWeightThreads - 1) / kWeightThreads),
                  static_cast<unsigned int>(chunks));
  conv2d_backward_weights_partial_kernel<<<grid, kWeightThreads, 0, stream>>>(
      x, dy, workspace, pixels, chunk, static_cast<int>(height), static_cast<int>(width),
      static_cast<int>(cin), static_cast<int>(cout), static_cast<int>(weights));
  RINGTRAIN_CHECK_LAUNCH();
  bias_grad(workspace, dw, chunks, weights, stream);  // dw[w] = sum over chunks, fixed order
}

int64_t conv2d_backward_weights_workspace_floats(int64_t batch, int64_t height, int64_t width,
                                                 int64_t cin, int64_t cout) {
  check_conv_shape(batch, height, width, cin, cout);
  const int64_t pixels = batch * height * width;
  const int64_t chunk = weight_gradient_chunk(pixels);
  return (pixels + chunk - 1) / chunk * 9 * cin * cout;
}

void conv2d_backward_input(const float* w, const float* dy, float* dx, int64_t batch,
                           int64_t height, int64_t width, int64_t cin, int64_t cout,
                           cudaStream_t stream) {
  check_conv_shape(batch, height, width, cin, cout);
  const int64_t total = batch * height * width * cin;
  conv2d_backward_input_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
      w, dy, dx, total, static_cast<int>(height), static_cast<int>(width), static_cast<int>(cin),
      static_cast<int>(cout));
  RINGTRAIN_CHECK_LAUNCH();
}

void maxpool2d_forward(const float* x, float* y, int64_t batch, int64_t height, int64_t width,
                       int64_t channels, cudaStream_t stream) {
  check_pool_shape(batch, height, width, channels);
  const int64_t total = batch * (height / 2) * (width / 2) * channels;
  maxpool2d_forward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
      x, y, total, static_cast<int>(height), static_cast<int>(width), static_cast<int>(channels));
  RINGTRAIN_CHECK_LAUNCH();
}

void maxpool2d_backward(const float* x, const float* y, const float* dy, float* dx, int64_t batch,
                        int64_t height, int64_t width, int64_t channels, cudaStream_t stream) {
  check_pool_shape(batch, height, width, channels);
  const int64_t total = batch * (height / 2) * (width / 2) * channels;
  maxpool2d_backward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
      x, y, dy, dx, total, static_cast<int>(height), static_cast<int>(width),
      static_cast<int>(channels));
  RINGTRAIN_CHECK_LAUNCH();
}

}  // namespace ringtrain::gpu
