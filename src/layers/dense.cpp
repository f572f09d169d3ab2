// Dense (fully connected): y[B,out] = x[B,in] * w[in,out] + b[out], as one Eigen GEMM.
// The bias is written first and the GEMM accumulates onto it, so the output is touched once.
#include <algorithm>

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

template <typename T>
void dense_forward(const T* x, const T* w, const T* b, T* y, int64_t batch, int64_t in,
                   int64_t out) {
  ConstMatrixMap<T> x_m(x, batch, in);
  ConstMatrixMap<T> w_m(w, in, out);
  MatrixMap<T> y_m(y, batch, out);
  y_m.rowwise() = ConstRowVectorMap<T>(b, out);
  y_m.noalias() += x_m * w_m;
}

template <typename T>
void dense_backward(const T* x, const T* w, const T* dy, T* dw, T* db, T* dx, int64_t batch,
                    int64_t in, int64_t out) {
  ConstMatrixMap<T> x_m(x, batch, in);
  ConstMatrixMap<T> dy_m(dy, batch, out);
  if (dw != nullptr) {
    MatrixMap<T>(dw, in, out).noalias() = x_m.transpose() * dy_m;
    RowVectorMap<T>(db, out) = dy_m.colwise().sum();
  }
  if (dx != nullptr) {
    MatrixMap<T>(dx, batch, in).noalias() = dy_m * ConstMatrixMap<T>(w, in, out).transpose();
  }
}

template <typename T>
void dense_backward_weight_rows(const T* x, const T* dy, T* dw, int64_t batch, int64_t in,
                                int64_t out, int64_t row_begin, int64_t row_end) {
  ConstMatrixMap<T> x_m(x, batch, in);
  MatrixMap<T>(dw + row_begin * out, row_end - row_begin, out).noalias() =
      x_m.middleCols(row_begin, row_end - row_begin).transpose() *
      ConstMatrixMap<T>(dy, batch, out);
}

template void dense_backward_weight_rows<float>(const float*, const float*, float*, int64_t,
                                                int64_t, int64_t, int64_t, int64_t);
template void dense_backward_weight_rows<double>(const double*, const double*, double*, int64_t,
                                                 int64_t, int64_t, int64_t, int64_t);
template void dense_forward<float>(const float*, const float*, const float*, float*, int64_t,
                                   int64_t, int64_t);
template void dense_forward<double>(const double*, const double*, const double*, double*, int64_t,
                                    int64_t, int64_t);
template void dense_backward<float>(const float*, const float*, const float*, float*, float*,
                                    float*, int64_t, int64_t, int64_t);
template void dense_backward<double>(const double*, const double*, const double*, double*, double*,
                                     double*, int64_t, int64_t, int64_t);

namespace {

class Dense final : public Layer {
 public:
  Dense(int64_t in, int64_t out) : in_(in), out_(out) {
    RINGTRAIN_CHECK(in > 0 && out > 0, "dense layer needs positive sizes, got {}->{}", in, out);
  }
  std::string name() const override { return fmt::format("dense({}->{})", in_, out_); }
  // y = x w and dx = dy w^T are Eigen GEMMs whose columns, in Eigen's column-major view
  // (y^T = w^T x^T), are the batch's rows: Eigen 3.4 blocks the depth (kc) from the depth and
  // the cache sizes alone, cuts the rows of w^T into blocks that are multiples of the kernel's
  // row panel, and runs every full 4-column panel through the same micro-kernel, so a row's
  // sums are the same for any batch of a multiple of 4 rows (tests/test_model.cpp checks it
  // for several shapes). Not where Eigen leaves the GEMM: a product whose three sizes add up
  // to less than 20 is computed coefficient by coefficient, and one with a single output
  // column (in or out of 1) as a matrix-vector product. dw and db sum over the rows: they are
  // computed per micro-shard (dense_terms.h).
  bool rows_independent(int64_t rows) const override {
    return in_ > 1 && out_ > 1 && rows + in_ + out_ >= 20;
  }
  std::optional<DenseSizes> dense_sizes() const override { return DenseSizes{in_, out_}; }
  Shape output_shape(const Shape& input) const override {
    RINGTRAIN_CHECK(input.numel() == in_, "{} got a sample of shape {} ({} values)", name(),
                    input.str(), input.numel());
    return Shape{out_};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {{"weight", Shape{in_, out_}, Init::kGlorotUniform, in_, out_},
            {"bias", Shape{out_}, Init::kZeros, in_, out_}};
  }
  void bind(std::span<Tensor> params, std::span<Tensor> grads) override {
    w_ = params[0];
    b_ = params[1];
    dw_ = grads[0];
    db_ = grads[1];
  }
  void forward(const Tensor& x, Tensor& y, Context& ctx) override {
    const int64_t batch = x.dim(0);
    y.resize(Shape{batch, out_});
    if (runs_on_gpu(*this, x, ctx)) {
      gpu_ops::dense_forward(ctx, x.data(), w_.data(), b_.data(), y.data(), batch, in_, out_);
      return;
    }
    dense_forward(x.data(), w_.data(), b_.data(), y.data(), batch, in_, out_);
  }
  std::vector<int64_t> grad_pieces() const override {
    std::vector<int64_t> pieces;
    for (int64_t row = 0; row < in_; row += rows_per_piece()) {
      pieces.push_back(std::min(rows_per_piece(), in_ - row) * out_);
    }
    pieces.back() += out_;  // the bias ends the last piece
    return pieces;
  }
  void backward_params(const Tensor& x, const Tensor&, const Tensor& dy, Context& ctx,
                       const GradProgressFn& progress) override {
    const int64_t batch = x.dim(0);
    if (runs_on_gpu(*this, x, ctx)) {
      // The same pieces as on the CPU, so the buckets are the same; each is reported when its
      // GEMM is queued (the stream GradSync orders the averaging after it with an event).
      gpu_ops::bias_backward(ctx, dy.data(), db_.data(), batch, out_);
      for (int64_t row = 0; row < in_; row += rows_per_piece()) {
        const int64_t end = std::min(in_, row + rows_per_piece());
        gpu_ops::dense_backward_weight_rows(ctx, x.data(), dy.data(), dw_.data(), batch, in_, out_,
                                            row, end);
        if (end < in_) progress(end * out_);
      }
      return;
    }
    if (rows_per_piece() >= in_) {
      dense_backward<float>(x.data(), w_.data(), dy.data(), dw_.data(), db_.data(), nullptr, batch,
                            in_, out_);
      return;
    }
    // A large weight: its gradient in row blocks, each reported when done (the bias, which
    // closes the layer's slice, is reported with the last block by the model).
    detail::RowVectorMap<float>(db_.data(), out_) =
        detail::ConstMatrixMap<float>(dy.data(), batch, out_).colwise().sum();
    for (int64_t row = 0; row < in_; row += rows_per_piece()) {
      const int64_t end = std::min(in_, row + rows_per_piece());
      dense_backward_weight_rows(x.data(), dy.data(), dw_.data(), batch, in_, out_, row, end);
      if (end < in_) progress(end * out_);
    }
  }
  void backward_input(const Tensor& x, const Tensor&, const Tensor& dy, Tensor& dx,
                      Context& ctx) override {
    dx.resize(x.shape());
    if (runs_on_gpu(*this, x, ctx)) {
      gpu_ops::dense_backward_input(ctx, w_.data(), dy.data(), dx.data(), x.dim(0), in_, out_);
      return;
    }
    dense_backward<float>(x.data(), w_.data(), dy.data(), nullptr, nullptr, dx.data(), x.dim(0),
                          in_, out_);
  }

 private:
  // Weights above 2 Mi values (8 MB) are finished in pieces of about 1 Mi values: small enough
  // that averaging starts early, large enough that each piece is still an efficient GEMM.
  static constexpr int64_t kPieceElements = 1 << 20;
  int64_t rows_per_piece() const {
    return in_ * out_ <= 2 * kPieceElements ? in_ : std::max<int64_t>(1, kPieceElements / out_);
  }

  int64_t in_, out_;
  Tensor w_, b_;    // w_ [in, out], b_ [out]: views into the flat parameter buffer
  Tensor dw_, db_;  // the same shapes, views into the flat gradient buffer
};

}  // namespace

std::unique_ptr<Layer> make_dense(int64_t in, int64_t out) {
  return std::make_unique<Dense>(in, out);
}

}  // namespace ringtrain
