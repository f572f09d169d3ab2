// Conv2D, 3x3 kernel, stride 1, 'same' zero padding, with bias; activations NHWC.
//
// im2col turns the whole batch into one matrix cols[B*H*W, 9*Cin] whose row (b,h,w) holds the
// 3x3xCin neighbourhood of pixel (h,w) in (kh, kw, ci) order, the order of the weight
// w[3,3,Cin,Cout] flattened to [9*Cin, Cout]. Then
//   forward:  y[BHW, Cout]  = cols * w + b
//   backward: dw           = cols^T * dy          (cols kept from forward)
//             db           = column sums of dy
//             dcols        = dy * w^T, and col2im adds each row back onto the pixels it came from
// so each pass is one large GEMM, which is where Eigen is fast.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "eigen_maps.h"
#include "ringtrain/check.h"
#include "ringtrain/layers.h"
#include "ringtrain/ops.h"

namespace ringtrain {

using detail::ConstMatrixMap;
using detail::ConstRowVectorMap;
using detail::MatrixMap;
using detail::RowVectorMap;

namespace {

constexpr int64_t kTaps = 9;  // 3x3

template <typename T>
void im2col(const T* x, T* cols, int64_t batch, int64_t height, int64_t width, int64_t cin) {
  const int64_t row_len = kTaps * cin;
  for (int64_t b = 0; b < batch; ++b) {
    const T* image = x + b * height * width * cin;
    for (int64_t h = 0; h < height; ++h) {
      for (int64_t w = 0; w < width; ++w) {
        T* row = cols + ((b * height + h) * width + w) * row_len;
        for (int64_t kh = 0; kh < 3; ++kh) {
          const int64_t ih = h + kh - 1;
          for (int64_t kw = 0; kw < 3; ++kw, row += cin) {
            const int64_t iw = w + kw - 1;
            if (ih < 0 || ih >= height || iw < 0 || iw >= width) {
              std::fill(row, row + cin, T(0));
            } else {
              std::copy_n(image + (ih * width + iw) * cin, cin, row);
            }
          }
        }
      }
    }
  }
}

template <typename T>
void col2im(const T* dcols, T* dx, int64_t batch, int64_t height, int64_t width, int64_t cin) {
  const int64_t row_len = kTaps * cin;
  std::fill(dx, dx + batch * height * width * cin, T(0));
  for (int64_t b = 0; b < batch; ++b) {
    T* image = dx + b * height * width * cin;
    for (int64_t h = 0; h < height; ++h) {
      for (int64_t w = 0; w < width; ++w) {
        const T* row = dcols + ((b * height + h) * width + w) * row_len;
        for (int64_t kh = 0; kh < 3; ++kh) {
          const int64_t ih = h + kh - 1;
          for (int64_t kw = 0; kw < 3; ++kw, row += cin) {
            const int64_t iw = w + kw - 1;
            if (ih < 0 || ih >= height || iw < 0 || iw >= width) continue;
            T* pixel = image + (ih * width + iw) * cin;
            for (int64_t c = 0; c < cin; ++c) pixel[c] += row[c];
          }
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void conv2d_forward(const T* x, const T* w, const T* b, T* y, T* cols, int64_t batch,
                    int64_t height, int64_t width, int64_t cin, int64_t cout) {
  const int64_t pixels = batch * height * width;
  im2col(x, cols, batch, height, width, cin);
  MatrixMap<T> y_m(y, pixels, cout);
  y_m.rowwise() = ConstRowVectorMap<T>(b, cout);
  y_m.noalias() += ConstMatrixMap<T>(cols, pixels, kTaps * cin) *
                   ConstMatrixMap<T>(w, kTaps * cin, cout);
}

template <typename T>
void conv2d_backward(const T* cols, const T* w, const T* dy, T* dw, T* db, T* dx, T* dcols,
                     int64_t batch, int64_t height, int64_t width, int64_t cin, int64_t cout) {
  const int64_t pixels = batch * height * width;
  ConstMatrixMap<T> dy_m(dy, pixels, cout);
  ConstMatrixMap<T> cols_m(cols, pixels, kTaps * cin);
  MatrixMap<T>(dw, kTaps * cin, cout).noalias() = cols_m.transpose() * dy_m;
  RowVectorMap<T>(db, cout) = dy_m.colwise().sum();
  if (dx != nullptr) {
    MatrixMap<T>(dcols, pixels, kTaps * cin).noalias() =
        dy_m * ConstMatrixMap<T>(w, kTaps * cin, cout).transpose();
    col2im(dcols, dx, batch, height, width, cin);
  }
}

template void conv2d_forward<float>(const float*, const float*, const float*, float*, float*,
                                    int64_t, int64_t, int64_t, int64_t, int64_t);
template void conv2d_forward<double>(const double*, const double*, const double*, double*,
                                     double*, int64_t, int64_t, int64_t, int64_t, int64_t);
template void conv2d_backward<float>(const float*, const float*, const float*, float*, float*,
                                     float*, float*, int64_t, int64_t, int64_t, int64_t,
                                     int64_t);
template void conv2d_backward<double>(const double*, const double*, const double*, double*,
                                      double*, double*, double*, int64_t, int64_t, int64_t,
                                      int64_t, int64_t);

namespace {

class Conv2D final : public Layer {
 public:
  Conv2D(int64_t cin, int64_t cout) : cin_(cin), cout_(cout) {
    RINGTRAIN_CHECK(cin > 0 && cout > 0, "conv2d needs positive channel counts, got {}->{}", cin,
                    cout);
  }
  std::string name() const override { return fmt::format("conv3x3({}->{})", cin_, cout_); }
  Shape output_shape(const Shape& input) const override {
    RINGTRAIN_CHECK(input.rank() == 3 && input[2] == cin_,
                    "{} expects samples [H, W, {}], got {}", name(), cin_, input.str());
    return Shape{input[0], input[1], cout_};
  }
  std::vector<ParamSpec> param_specs() const override {
    // TensorFlow's Glorot fans for a conv kernel: receptive field times channels.
    return {{"weight", Shape{3, 3, cin_, cout_}, Init::kGlorotUniform, kTaps * cin_,
             kTaps * cout_},
            {"bias", Shape{cout_}, Init::kZeros, kTaps * cin_, kTaps * cout_}};
  }
  void bind(std::span<Tensor> params, std::span<Tensor> grads) override {
    w_ = params[0];
    b_ = params[1];
    dw_ = grads[0];
    db_ = grads[1];
  }
  void forward(const Tensor& x, Tensor& y, Context&) override {
    const int64_t batch = x.dim(0), height = x.dim(1), width = x.dim(2);
    y.resize(Shape{batch, height, width, cout_});
    cols_.resize(Shape{batch * height * width, kTaps * cin_});
    conv2d_forward(x.data(), w_.data(), b_.data(), y.data(), cols_.data(), batch, height, width,
                   cin_, cout_);
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx, Context&) override {
    const int64_t batch = x.dim(0), height = x.dim(1), width = x.dim(2);
    float* dx_data = nullptr;
    if (dx != nullptr) {
      dx->resize(x.shape());
      dcols_.resize(cols_.shape());
      dx_data = dx->data();
    }
    conv2d_backward(cols_.data(), w_.data(), dy.data(), dw_.data(), db_.data(), dx_data,
                    dcols_.data(), batch, height, width, cin_, cout_);
  }

 private:
  int64_t cin_, cout_;
  Tensor w_, b_;    // w_ [3, 3, cin, cout], b_ [cout]: views into the flat parameters
  Tensor dw_, db_;  // views into the flat gradients
  Tensor cols_;     // [B*H*W, 9*cin] im2col of the last forward's input
  Tensor dcols_;    // [B*H*W, 9*cin] gradient of cols_ (only when dx is wanted)
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(int64_t cin, int64_t cout) {
  return std::make_unique<Conv2D>(cin, cout);
}

}  // namespace ringtrain
