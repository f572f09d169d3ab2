// MaxPool2D, 2x2 window, stride 2, NHWC. Windows do not overlap, so backward writes every
// input position exactly once (the gradient to the window's first maximum, zero elsewhere)
// and needs no separate zeroing pass or saved arg-max: it compares x with the saved y.
#include <fmt/format.h>

#include "ringtrain/check.h"
#include "ringtrain/gpu_ops.h"
#include "ringtrain/layers.h"
#include "ringtrain/ops.h"

namespace ringtrain {

template <typename T>
void maxpool2d_forward(const T* x, T* y, int64_t batch, int64_t height, int64_t width,
                       int64_t channels) {
  const int64_t out_h = height / 2, out_w = width / 2, row = width * channels;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < out_h; ++i) {
      for (int64_t j = 0; j < out_w; ++j) {
        const T* top = x + ((b * height + 2 * i) * width + 2 * j) * channels;
        const T* bottom = top + row;
        T* out = y + ((b * out_h + i) * out_w + j) * channels;
        for (int64_t c = 0; c < channels; ++c) {
          T m = top[c];
          m = top[channels + c] > m ? top[channels + c] : m;
          m = bottom[c] > m ? bottom[c] : m;
          m = bottom[channels + c] > m ? bottom[channels + c] : m;
          out[c] = m;
        }
      }
    }
  }
}

namespace {

// One window's backward over its channels: each position takes what is left of the gradient
// if it holds the max (row-major order decides ties); branch-free, so it vectorises. The
// restrict-qualified parameters tell the compiler the eight arrays do not overlap.
// kChannels > 0 fixes the channel count at compile time; 0 reads it from `channels`.
template <typename T, int kChannels>
inline void maxpool_window_backward(const T* __restrict x00, const T* __restrict x01,
                                    const T* __restrict x10, const T* __restrict x11,
                                    const T* __restrict max, const T* __restrict grad,
                                    T* __restrict d00, T* __restrict d01, T* __restrict d10,
                                    T* __restrict d11, int64_t channels) {
  const int64_t count = kChannels > 0 ? kChannels : channels;
  for (int64_t c = 0; c < count; ++c) {
    const T m = max[c];
    T rest = grad[c];
    const bool hit00 = x00[c] == m;
    d00[c] = hit00 ? rest : T(0);
    rest = hit00 ? T(0) : rest;
    const bool hit01 = x01[c] == m;
    d01[c] = hit01 ? rest : T(0);
    rest = hit01 ? T(0) : rest;
    const bool hit10 = x10[c] == m;
    d10[c] = hit10 ? rest : T(0);
    rest = hit10 ? T(0) : rest;
    d11[c] = x11[c] == m ? rest : T(0);
  }
}

template <typename T, int kChannels>
void maxpool2d_backward_impl(const T* x, const T* y, const T* dy, T* dx, int64_t batch,
                             int64_t height, int64_t width, int64_t channels) {
  const int64_t out_h = height / 2, out_w = width / 2, row = width * channels;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < out_h; ++i) {
      for (int64_t j = 0; j < out_w; ++j) {
        const int64_t in = ((b * height + 2 * i) * width + 2 * j) * channels;
        const int64_t out = ((b * out_h + i) * out_w + j) * channels;
        maxpool_window_backward<T, kChannels>(
            x + in, x + in + channels, x + in + row, x + in + row + channels, y + out, dy + out,
            dx + in, dx + in + channels, dx + in + row, dx + in + row + channels, channels);
      }
    }
  }
}

}  // namespace

template <typename T>
void maxpool2d_backward(const T* x, const T* y, const T* dy, T* dx, int64_t batch, int64_t height,
                        int64_t width, int64_t channels) {
  switch (channels) {
    case 8:
      return maxpool2d_backward_impl<T, 8>(x, y, dy, dx, batch, height, width, channels);
    case 16:
      return maxpool2d_backward_impl<T, 16>(x, y, dy, dx, batch, height, width, channels);
    default:
      return maxpool2d_backward_impl<T, 0>(x, y, dy, dx, batch, height, width, channels);
  }
}

template void maxpool2d_forward<float>(const float*, float*, int64_t, int64_t, int64_t, int64_t);
template void maxpool2d_forward<double>(const double*, double*, int64_t, int64_t, int64_t, int64_t);
template void maxpool2d_backward<float>(const float*, const float*, const float*, float*, int64_t,
                                        int64_t, int64_t, int64_t);
template void maxpool2d_backward<double>(const double*, const double*, const double*, double*,
                                         int64_t, int64_t, int64_t, int64_t);

namespace {

class MaxPool2D final : public Layer {
 public:
  std::string name() const override { return "maxpool2x2"; }
  Shape output_shape(const Shape& input) const override {
    RINGTRAIN_CHECK(input.rank() == 3 && input[0] % 2 == 0 && input[1] % 2 == 0,
                    "maxpool2x2 expects samples [H, W, C] with even H and W, got {}", input.str());
    return Shape{input[0] / 2, input[1] / 2, input[2]};
  }
  void forward(const Tensor& x, Tensor& y, Context& ctx) override {
    y.resize(Shape{x.dim(0), x.dim(1) / 2, x.dim(2) / 2, x.dim(3)});
    if (runs_on_gpu(*this, x, ctx))
      return gpu_ops::maxpool2d_forward(ctx, x.data(), y.data(), x.dim(0), x.dim(1), x.dim(2),
                                        x.dim(3));
    maxpool2d_forward(x.data(), y.data(), x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  }
  void backward_input(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                      Context& ctx) override {
    dx.resize(x.shape());
    if (runs_on_gpu(*this, x, ctx))
      return gpu_ops::maxpool2d_backward(ctx, x.data(), y.data(), dy.data(), dx.data(), x.dim(0),
                                         x.dim(1), x.dim(2), x.dim(3));
    maxpool2d_backward(x.data(), y.data(), dy.data(), dx.data(), x.dim(0), x.dim(1), x.dim(2),
                       x.dim(3));
  }
};

}  // namespace

std::unique_ptr<Layer> make_maxpool2d() {
  return std::make_unique<MaxPool2D>();
}

}  // namespace ringtrain
