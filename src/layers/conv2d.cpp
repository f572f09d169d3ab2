// Conv2D, 3x3 kernel, stride 1, 'same' zero padding, with bias; activations NHWC.
//
// im2col turns the whole batch into one matrix cols[B*H*W, 9*Cin] whose row (b,h,w) holds the
// 3x3xCin neighbourhood of pixel (h,w) in (kh, kw, ci) order, the order of the weight
// w[3,3,Cin,Cout] flattened to [9*Cin, Cout]. Then
//   forward:  y[BHW, Cout]  = cols * w + b
//   backward: dw           = cols^T * dy          (cols kept from forward)
//             db           = column sums of dy
//             dcols        = dy * w^T, and col2im adds each row back onto the pixels it came from
// so each pass is one large GEMM, which is where Eigen is fast. For the small channel counts of
// the cnn model (1->8, 8->16) the GEMMs are so skinny that Eigen spends its time packing, so
// those use direct loops with the channel counts fixed at compile time: the per-pixel
// accumulators then live in vector registers and nothing but x, w and y is touched.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "eigen_maps.h"
#include "ringtrain/check.h"
#include "ringtrain/gpu_ops.h"
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

// ---- direct path: compile-time channel counts ----
// The per-pixel accumulators are Eigen fixed-size arrays: Eigen turns each `acc += v * row`
// into one or two SIMD multiply-adds, which GCC does not reliably do for plain loops here.

template <typename T, int kN>
using Lane = Eigen::Array<T, kN, 1>;
template <typename T, int kN>
using ConstLaneMap = Eigen::Map<const Lane<T, kN>>;
template <typename T, int kN>
using LaneMap = Eigen::Map<Lane<T, kN>>;

constexpr int kPixelBlock = 4;

// Visits the columns of one image row: the edge columns (whose 3x3 window leaves the image)
// one at a time with bounds checks, columns 1 .. width-2 in blocks of kPixelBlock without.
// visit(c, block size, edge?) gets both as compile-time constants.
template <typename Visit>
inline void for_pixel_blocks(int64_t width, Visit&& visit) {
  int64_t c = 0;
  visit(c++, std::integral_constant<int, 1>{}, std::true_type{});
  for (; c + kPixelBlock <= width - 1; c += kPixelBlock) {
    visit(c, std::integral_constant<int, kPixelBlock>{}, std::false_type{});
  }
  for (; c < width; ++c) visit(c, std::integral_constant<int, 1>{}, std::true_type{});
}

// Output pixels (h, c .. c+kBlock-1) of one image: y[p, :] = b + sum over in-bounds taps t and
// input channels ci of x[p + offset(t), ci] * w[t, ci, :]. Computing kBlock neighbours at once
// loads each weight row once for all of them and gives the CPU kBlock independent multiply-add
// chains. Every pixel sums in the same order whatever the block, so results do not depend on
// how a row was cut into blocks. kEdge: some of these columns have taps outside the image.
template <typename T, int kCin, int kCout, int kBlock, bool kEdge>
inline void forward_pixels(const T* image, const T* w, const Lane<T, kCout>& bias, T* out,
                           int64_t h, int64_t c, int64_t height, int64_t width) {
  Lane<T, kCout> acc[kBlock];
  for (int k = 0; k < kBlock; ++k) acc[k] = bias;
  for (int64_t kh = 0; kh < 3; ++kh) {
    const int64_t ih = h + kh - 1;
    if (ih < 0 || ih >= height) continue;
    for (int64_t kw = 0; kw < 3; ++kw) {
      const int64_t base = (ih * width + c + kw - 1) * kCin;  // column c + kw - 1 may be -1
      const T* tap = w + (kh * 3 + kw) * kCin * kCout;
      for (int ci = 0; ci < kCin; ++ci) {
        const Lane<T, kCout> weights = ConstLaneMap<T, kCout>(tap + ci * kCout);
        for (int k = 0; k < kBlock; ++k) {
          if (kEdge && (c + k + kw - 1 < 0 || c + k + kw - 1 >= width)) continue;
          acc[k] += image[base + k * kCin + ci] * weights;
        }
      }
    }
  }
  for (int k = 0; k < kBlock; ++k) LaneMap<T, kCout>(out + k * kCout) = acc[k];
}

template <typename T, int kCin, int kCout>
void direct_forward(const T* x, const T* w, const T* b, T* y, int64_t batch, int64_t height,
                    int64_t width) {
  const Lane<T, kCout> bias = ConstLaneMap<T, kCout>(b);
  for (int64_t bi = 0; bi < batch; ++bi) {
    const T* image = x + bi * height * width * kCin;
    for (int64_t h = 0; h < height; ++h) {
      T* out_row = y + (bi * height + h) * width * kCout;
      for_pixel_blocks(width, [&](int64_t c, auto block, auto edge) {
        forward_pixels<T, kCin, kCout, decltype(block)::value, decltype(edge)::value>(
            image, w, bias, out_row + c * kCout, h, c, height, width);
      });
    }
  }
}

// Adds the contributions of output pixels (h, c .. c+kBlock-1) to dw[t, ci, :] (each row loaded
// and stored once per block) and to the bias gradient, in pixel order.
template <typename T, int kCin, int kCout, int kBlock, bool kEdge>
inline void weight_grad_pixels(const T* image, const T* grad, T* dw, Lane<T, kCout>& grad_b,
                               int64_t h, int64_t c, int64_t height, int64_t width) {
  Lane<T, kCout> g[kBlock];
  for (int k = 0; k < kBlock; ++k) {
    g[k] = ConstLaneMap<T, kCout>(grad + k * kCout);
    grad_b += g[k];
  }
  for (int64_t kh = 0; kh < 3; ++kh) {
    const int64_t ih = h + kh - 1;
    if (ih < 0 || ih >= height) continue;
    for (int64_t kw = 0; kw < 3; ++kw) {
      const int64_t base = (ih * width + c + kw - 1) * kCin;
      T* tap = dw + (kh * 3 + kw) * kCin * kCout;
      for (int ci = 0; ci < kCin; ++ci) {
        LaneMap<T, kCout> row(tap + ci * kCout);
        Lane<T, kCout> sum = row;
        for (int k = 0; k < kBlock; ++k) {
          if (kEdge && (c + k + kw - 1 < 0 || c + k + kw - 1 >= width)) continue;
          sum += image[base + k * kCin + ci] * g[k];
        }
        row = sum;
      }
    }
  }
}

// dw[t, ci, :] = sum over pixels p of x[p + offset(t), ci] * dy[p, :]; db = sum of dy rows.
template <typename T, int kCin, int kCout>
void direct_backward_weights(const T* x, const T* dy, T* dw, T* db, int64_t batch, int64_t height,
                             int64_t width) {
  std::fill(dw, dw + kTaps * kCin * kCout, T(0));
  Lane<T, kCout> grad_b = Lane<T, kCout>::Zero();
  for (int64_t bi = 0; bi < batch; ++bi) {
    const T* image = x + bi * height * width * kCin;
    for (int64_t h = 0; h < height; ++h) {
      const T* grad_row = dy + (bi * height + h) * width * kCout;
      for_pixel_blocks(width, [&](int64_t c, auto block, auto edge) {
        weight_grad_pixels<T, kCin, kCout, decltype(block)::value, decltype(edge)::value>(
            image, grad_row + c * kCout, dw, grad_b, h, c, height, width);
      });
    }
  }
  LaneMap<T, kCout> bias_grad(db);
  bias_grad = grad_b;
}

// Input pixels (qh, qw .. qw+kBlock-1): dx[q, :] = sum over taps t whose output pixel
// p = q - offset(t) is in bounds of w[t] (as [Cin, Cout]) * dy[p, :]. A gather, so every dx
// value is written exactly once; w_t holds w transposed per tap to [Cout, Cin].
template <typename T, int kCin, int kCout, int kBlock, bool kEdge>
inline void input_grad_pixels(const T* grad_image, const T* w_t, T* out, int64_t qh, int64_t qw,
                              int64_t height, int64_t width) {
  Lane<T, kCin> acc[kBlock];
  for (int k = 0; k < kBlock; ++k) acc[k] = Lane<T, kCin>::Zero();
  for (int64_t kh = 0; kh < 3; ++kh) {
    const int64_t h = qh - kh + 1;
    if (h < 0 || h >= height) continue;
    for (int64_t kw = 0; kw < 3; ++kw) {
      const int64_t base = (h * width + qw - kw + 1) * kCout;  // column qw - kw + 1 may be -1
      const T* tap = w_t + (kh * 3 + kw) * kCout * kCin;
      for (int co = 0; co < kCout; ++co) {
        const Lane<T, kCin> weights = ConstLaneMap<T, kCin>(tap + co * kCin);
        for (int k = 0; k < kBlock; ++k) {
          if (kEdge && (qw + k - kw + 1 < 0 || qw + k - kw + 1 >= width)) continue;
          acc[k] += grad_image[base + k * kCout + co] * weights;
        }
      }
    }
  }
  for (int k = 0; k < kBlock; ++k) LaneMap<T, kCin>(out + k * kCin) = acc[k];
}

template <typename T, int kCin, int kCout>
void direct_backward_input(const T* w, const T* dy, T* dx, int64_t batch, int64_t height,
                           int64_t width) {
  T w_t[kTaps * kCout * kCin];
  for (int64_t t = 0; t < kTaps; ++t)
    for (int64_t ci = 0; ci < kCin; ++ci)
      for (int64_t co = 0; co < kCout; ++co)
        w_t[(t * kCout + co) * kCin + ci] = w[(t * kCin + ci) * kCout + co];
  for (int64_t bi = 0; bi < batch; ++bi) {
    const T* grad_image = dy + bi * height * width * kCout;
    for (int64_t qh = 0; qh < height; ++qh) {
      T* out_row = dx + (bi * height + qh) * width * kCin;
      for_pixel_blocks(width, [&](int64_t qw, auto block, auto edge) {
        input_grad_pixels<T, kCin, kCout, decltype(block)::value, decltype(edge)::value>(
            grad_image, w_t, out_row + qw * kCin, qh, qw, height, width);
      });
    }
  }
}

template <typename T>
struct DirectConv {
  int64_t cin, cout;
  void (*forward)(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t);
  void (*backward_weights)(const T*, const T*, T*, T*, int64_t, int64_t, int64_t);
  void (*backward_input)(const T*, const T*, T*, int64_t, int64_t, int64_t);
};

template <typename T, int kCin, int kCout>
constexpr DirectConv<T> direct_entry() {
  return {kCin, kCout, direct_forward<T, kCin, kCout>, direct_backward_weights<T, kCin, kCout>,
          direct_backward_input<T, kCin, kCout>};
}

template <typename T>
const DirectConv<T>* find_direct(int64_t cin, int64_t cout) {
  static constexpr DirectConv<T> kTable[] = {direct_entry<T, 1, 8>(), direct_entry<T, 8, 16>()};
  for (const auto& entry : kTable) {
    if (entry.cin == cin && entry.cout == cout) return &entry;
  }
  return nullptr;
}

}  // namespace

bool conv2d_uses_im2col(int64_t cin, int64_t cout) {
  return find_direct<float>(cin, cout) == nullptr;
}

template <typename T>
void conv2d_forward(const T* x, const T* w, const T* b, T* y, T* cols, int64_t batch,
                    int64_t height, int64_t width, int64_t cin, int64_t cout) {
  if (const auto* direct = find_direct<T>(cin, cout)) {
    direct->forward(x, w, b, y, batch, height, width);
    return;
  }
  const int64_t pixels = batch * height * width;
  im2col(x, cols, batch, height, width, cin);
  MatrixMap<T> y_m(y, pixels, cout);
  y_m.rowwise() = ConstRowVectorMap<T>(b, cout);
  y_m.noalias() +=
      ConstMatrixMap<T>(cols, pixels, kTaps * cin) * ConstMatrixMap<T>(w, kTaps * cin, cout);
}

template <typename T>
void conv2d_backward(const T* x, const T* cols, const T* w, const T* dy, T* dw, T* db, T* dx,
                     T* dcols, int64_t batch, int64_t height, int64_t width, int64_t cin,
                     int64_t cout) {
  if (const auto* direct = find_direct<T>(cin, cout)) {
    if (dw != nullptr) direct->backward_weights(x, dy, dw, db, batch, height, width);
    if (dx != nullptr) direct->backward_input(w, dy, dx, batch, height, width);
    return;
  }
  const int64_t pixels = batch * height * width;
  ConstMatrixMap<T> dy_m(dy, pixels, cout);
  ConstMatrixMap<T> cols_m(cols, pixels, kTaps * cin);
  if (dw != nullptr) {
    MatrixMap<T>(dw, kTaps * cin, cout).noalias() = cols_m.transpose() * dy_m;
    RowVectorMap<T>(db, cout) = dy_m.colwise().sum();
  }
  if (dx != nullptr) {
    MatrixMap<T>(dcols, pixels, kTaps * cin).noalias() =
        dy_m * ConstMatrixMap<T>(w, kTaps * cin, cout).transpose();
    col2im(dcols, dx, batch, height, width, cin);
  }
}

template void conv2d_forward<float>(const float*, const float*, const float*, float*, float*,
                                    int64_t, int64_t, int64_t, int64_t, int64_t);
template void conv2d_forward<double>(const double*, const double*, const double*, double*, double*,
                                     int64_t, int64_t, int64_t, int64_t, int64_t);
template void conv2d_backward<float>(const float*, const float*, const float*, const float*, float*,
                                     float*, float*, float*, int64_t, int64_t, int64_t, int64_t,
                                     int64_t);
template void conv2d_backward<double>(const double*, const double*, const double*, const double*,
                                      double*, double*, double*, double*, int64_t, int64_t, int64_t,
                                      int64_t, int64_t);

namespace {

class Conv2D final : public Layer {
 public:
  Conv2D(int64_t cin, int64_t cout)
      : cin_(cin), cout_(cout), im2col_(conv2d_uses_im2col(cin, cout)) {
    RINGTRAIN_CHECK(cin > 0 && cout > 0, "conv2d needs positive channel counts, got {}->{}", cin,
                    cout);
  }
  std::string name() const override { return fmt::format("conv3x3({}->{})", cin_, cout_); }
  Shape output_shape(const Shape& input) const override {
    RINGTRAIN_CHECK(input.rank() == 3 && input[2] == cin_, "{} expects samples [H, W, {}], got {}",
                    name(), cin_, input.str());
    return Shape{input[0], input[1], cout_};
  }
  std::vector<ParamSpec> param_specs() const override {
    // TensorFlow's Glorot fans for a conv kernel: receptive field times channels.
    return {{"weight", Shape{3, 3, cin_, cout_}, Init::kGlorotUniform, kTaps * cin_, kTaps * cout_},
            {"bias", Shape{cout_}, Init::kZeros, kTaps * cin_, kTaps * cout_}};
  }
  void bind(std::span<Tensor> params, std::span<Tensor> grads) override {
    w_ = params[0];
    b_ = params[1];
    dw_ = grads[0];
    db_ = grads[1];
  }
  void forward(const Tensor& x, Tensor& y, Context& ctx) override {
    const int64_t batch = x.dim(0), height = x.dim(1), width = x.dim(2);
    y.resize(Shape{batch, height, width, cout_});
    if (runs_on_gpu(*this, x, ctx)) {  // direct kernels for every channel count: no scratch
      gpu_ops::conv2d_forward(ctx, x.data(), w_.data(), b_.data(), y.data(), batch, height, width,
                              cin_, cout_);
      return;
    }
    if (im2col_) cols_.resize(Shape{batch * height * width, kTaps * cin_});
    conv2d_forward(x.data(), w_.data(), b_.data(), y.data(), cols_.data(), batch, height, width,
                   cin_, cout_);
  }
  void backward_params(const Tensor& x, const Tensor&, const Tensor& dy, Context& ctx,
                       const GradProgressFn&) override {
    if (runs_on_gpu(*this, x, ctx)) {
      const int64_t workspace_floats =
          gpu_ops::conv2d_backward_workspace_floats(x.dim(0), x.dim(1), x.dim(2), cin_, cout_);
      if (grad_workspace_.device() != Device::kCuda) grad_workspace_ = Tensor(Device::kCuda);
      grad_workspace_.resize(Shape{std::max<int64_t>(workspace_floats, 1)});
      gpu_ops::conv2d_backward(ctx, x.data(), w_.data(), dy.data(), dw_.data(), db_.data(), nullptr,
                               x.dim(0), x.dim(1), x.dim(2), cin_, cout_, grad_workspace_.data(),
                               workspace_floats);
      return;
    }
    conv2d_backward<float>(x.data(), cols_.data(), w_.data(), dy.data(), dw_.data(), db_.data(),
                           nullptr, nullptr, x.dim(0), x.dim(1), x.dim(2), cin_, cout_);
  }
  void backward_input(const Tensor& x, const Tensor&, const Tensor& dy, Tensor& dx,
                      Context& ctx) override {
    dx.resize(x.shape());
    if (runs_on_gpu(*this, x, ctx)) {
      gpu_ops::conv2d_backward(ctx, x.data(), w_.data(), dy.data(), nullptr, nullptr, dx.data(),
                               x.dim(0), x.dim(1), x.dim(2), cin_, cout_, nullptr, 0);
      return;
    }
    if (im2col_) dcols_.resize(cols_.shape());
    conv2d_backward<float>(x.data(), cols_.data(), w_.data(), dy.data(), nullptr, nullptr,
                           dx.data(), dcols_.data(), x.dim(0), x.dim(1), x.dim(2), cin_, cout_);
  }

 private:
  int64_t cin_, cout_;
  bool im2col_;            // false: the direct path, which needs no scratch
  Tensor w_, b_;           // w_ [3, 3, cin, cout], b_ [cout]: views into the flat parameters
  Tensor dw_, db_;         // views into the flat gradients
  Tensor cols_;            // im2col path: [B*H*W, 9*cin] im2col of the last forward's input
  Tensor dcols_;           // im2col path: [B*H*W, 9*cin] gradient of cols_ (only when dx is wanted)
  Tensor grad_workspace_;  // GPU: the weight and bias gradients' partial sums (gpu_ops.h)
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(int64_t cin, int64_t cout) {
  return std::make_unique<Conv2D>(cin, cout);
}

}  // namespace ringtrain
