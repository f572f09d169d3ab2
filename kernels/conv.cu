// The cnn's 3x3 convolution and 2x2 max pooling as direct kernels (see conv.h for why not
// cuDNN). Every kernel sums in the order of its CPU twin in src/layers/, and every reduction
// is a fixed tree over a fixed partition (no atomics), so results are deterministic.
#include "conv.h"

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

// One block per weight (tap, ci, co): the block's threads stride over the B*H*W output pixels,
// then add their partial sums in a fixed shared-memory tree.
__global__ void conv2d_backward_weights_kernel(const float* __restrict__ x,
                                               const float* __restrict__ dy, float* __restrict__ dw,
                                               int64_t pixels, int height, int width, int cin,
                                               int cout) {
  __shared__ float partial[kThreads];
  const int weight = static_cast<int>(blockIdx.x);  // ((kh * 3 + kw) * cin + ci) * cout + co
  const int co = weight % cout;
  const int ci = (weight / cout) % cin;
  const int tap = weight / (cout * cin);
  const int dh = tap / 3 - 1, dwid = tap % 3 - 1;
  float sum = 0.0f;
  for (int64_t p = threadIdx.x; p < pixels; p += blockDim.x) {
    const int col = static_cast<int>(p % width);
    const int row = static_cast<int>((p / width) % height);
    const int ih = row + dh, iw = col + dwid;
    if (ih < 0 || ih >= height || iw < 0 || iw >= width) continue;
    const int64_t image = p / (static_cast<int64_t>(width) * height);
    const int64_t source = (image * height + ih) * width + iw;
    sum += x[source * cin + ci] * dy[p * cout + co];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) dw[weight] = partial[0];
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

// One thread per output value (b, i, j, c).
__global__ void maxpool2d_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                         int64_t total, int height, int width, int channels) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  const int out_h = height / 2, out_w = width / 2;
  const int c = static_cast<int>(index % channels);
  const int64_t cell = index / channels;
  const int j = static_cast<int>(cell % out_w);
  const int i = static_cast<int>((cell / out_w) % out_h);
  const int64_t image = cell / (static_cast<int64_t>(out_w) * out_h);
  const float* top = x + ((image * height + 2 * i) * width + 2 * j) * channels + c;
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
  const int out_h = height / 2, out_w = width / 2;
  const int c = static_cast<int>(index % channels);
  const int64_t cell = index / channels;
  const int j = static_cast<int>(cell % out_w);
  const int i = static_cast<int>((cell / out_w) % out_h);
  const int64_t image = cell / (static_cast<int64_t>(out_w) * out_h);
  const int64_t p00 = ((image * height + 2 * i) * width + 2 * j) * channels + c;
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
                             cudaStream_t stream) {
  check_conv_shape(batch, height, width, cin, cout);
  const auto weights = static_cast<unsigned int>(9 * cin * cout);
  conv2d_backward_weights_kernel<<<weights, kThreads, 0, stream>>>(
      x, dy, dw, batch * height * width, static_cast<int>(height), static_cast<int>(width),
      static_cast<int>(cin), static_cast<int>(cout));
  RINGTRAIN_CHECK_LAUNCH();
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
