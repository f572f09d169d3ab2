// MaxPool2D, 2x2 window, stride 2, NHWC. Windows do not overlap, so backward writes every
// input position exactly once (the gradient to the window's first maximum, zero elsewhere)
// and needs no separate zeroing pass or saved arg-max: it compares x with the saved y.
#include <fmt/format.h>

#include "ringtrain/check.h"
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

template <typename T>
void maxpool2d_backward(const T* x, const T* y, const T* dy, T* dx, int64_t batch,
                        int64_t height, int64_t width, int64_t channels) {
  const int64_t out_h = height / 2, out_w = width / 2, row = width * channels;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < out_h; ++i) {
      for (int64_t j = 0; j < out_w; ++j) {
        const int64_t in_offset = ((b * height + 2 * i) * width + 2 * j) * channels;
        const int64_t out_offset = ((b * out_h + i) * out_w + j) * channels;
        const T* window[4] = {x + in_offset, x + in_offset + channels, x + in_offset + row,
                              x + in_offset + row + channels};
        T* grad[4] = {dx + in_offset, dx + in_offset + channels, dx + in_offset + row,
                      dx + in_offset + row + channels};
        for (int64_t c = 0; c < channels; ++c) {
          const T m = y[out_offset + c];
          T g = dy[out_offset + c];
          for (int k = 0; k < 4; ++k) {
            const bool hit = window[k][c] == m;
            grad[k][c] = hit ? g : T(0);
            g = hit ? T(0) : g;  // only the first maximum receives the gradient
          }
        }
      }
    }
  }
}

template void maxpool2d_forward<float>(const float*, float*, int64_t, int64_t, int64_t, int64_t);
template void maxpool2d_forward<double>(const double*, double*, int64_t, int64_t, int64_t,
                                        int64_t);
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
                    "maxpool2x2 expects samples [H, W, C] with even H and W, got {}",
                    input.str());
    return Shape{input[0] / 2, input[1] / 2, input[2]};
  }
  void forward(const Tensor& x, Tensor& y, Context&) override {
    y.resize(Shape{x.dim(0), x.dim(1) / 2, x.dim(2) / 2, x.dim(3)});
    maxpool2d_forward(x.data(), y.data(), x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                Context&) override {
    if (dx == nullptr) return;
    dx->resize(x.shape());
    maxpool2d_backward(x.data(), y.data(), dy.data(), dx->data(), x.dim(0), x.dim(1), x.dim(2),
                       x.dim(3));
  }
};

}  // namespace

std::unique_ptr<Layer> make_maxpool2d() { return std::make_unique<MaxPool2D>(); }

}  // namespace ringtrain
