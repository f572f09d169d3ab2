// Flatten: [B, ...] -> [B, prod(...)]. NHWC order, as TensorFlow flattens. No copy in either
// direction: the output and the input gradient are views of their neighbours' storage.
#include "ringtrain/layers.h"

namespace ringtrain {

namespace {

class Flatten final : public Layer {
 public:
  std::string name() const override { return "flatten"; }
  bool rows_independent(int64_t) const override { return true; }  // a view
  Shape output_shape(const Shape& input) const override { return Shape{input.numel()}; }
  void forward(const Tensor& x, Tensor& y, Context&) override {
    const int64_t batch = x.dim(0);
    y = x.reshaped(Shape{batch, x.numel() / batch});
  }
  void backward_input(const Tensor& x, const Tensor&, const Tensor& dy, Tensor& dx,
                      Context&) override {
    dx = dy.reshaped(x.shape());
  }
};

}  // namespace

std::unique_ptr<Layer> make_flatten() {
  return std::make_unique<Flatten>();
}

}  // namespace ringtrain
