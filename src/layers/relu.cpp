// ReLU: y = max(x, 0); the backward pass reads the saved output, not the input. A NaN passes
// through (as in PyTorch): swallowed here, it would hide a corrupt input from the loss and
// from --check-finite's loss test while still poisoning the weight gradients.
#include "ringtrain/gpu_ops.h"
#include "ringtrain/layers.h"
#include "ringtrain/ops.h"

namespace ringtrain {

template <typename T>
void relu_forward(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] > T(0) || x[i] != x[i]) ? x[i] : T(0);
}

template <typename T>
void relu_backward(const T* y, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
}

template void relu_forward<float>(const float*, float*, int64_t);
template void relu_forward<double>(const double*, double*, int64_t);
template void relu_backward<float>(const float*, const float*, float*, int64_t);
template void relu_backward<double>(const double*, const double*, double*, int64_t);

namespace {

class Relu final : public Layer {
 public:
  std::string name() const override { return "relu"; }
  bool rows_independent(int64_t) const override { return true; }  // elementwise
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(const Tensor& x, Tensor& y, Context& ctx) override {
    y.resize(x.shape());
    if (runs_on_gpu(*this, x, ctx))
      return gpu_ops::relu_forward(ctx, x.data(), y.data(), x.numel());
    relu_forward(x.data(), y.data(), x.numel());
  }
  void backward_input(const Tensor&, const Tensor& y, const Tensor& dy, Tensor& dx,
                      Context& ctx) override {
    dx.resize(y.shape());
    if (runs_on_gpu(*this, y, ctx))
      return gpu_ops::relu_backward(ctx, y.data(), dy.data(), dx.data(), y.numel());
    relu_backward(y.data(), dy.data(), dx.data(), y.numel());
  }
};

}  // namespace

std::unique_ptr<Layer> make_relu() {
  return std::make_unique<Relu>();
}

}  // namespace ringtrain
