// The Layer interface. A layer is a thin class over the math in ops.h: it declares the
// parameters it needs, receives views of them (and of their gradients) in the model's two flat
// buffers, and keeps whatever scratch its math needs between forward and backward.
// A layer runs where ctx.device says: the CPU math of ops.h, or its GPU twin in gpu_ops.h on
// ctx.stream (then every tensor it sees, and the views it was bound to, are device memory).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/context.h"
#include "ringtrain/tensor.h"

namespace ringtrain {

enum class Init { kZeros, kGlorotUniform };

struct ParamSpec {
  std::string name;  // "weight", "bias"
  Shape shape;
  Init init;
  int64_t fan_in = 0;  // used by Glorot: limit = sqrt(6 / (fan_in + fan_out))
  int64_t fan_out = 0;
};

// A fully connected layer's sizes: y[B, out] = x[B, in] w[in, out] + b[out].
struct DenseSizes {
  int64_t in = 0;
  int64_t out = 0;
};

// Reports that the first `done` elements of a layer's parameter slice (flat order) are final.
using GradProgressFn = std::function<void(int64_t done)>;

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string name() const = 0;  // "dense(784->500)"
  // The per-sample output shape for a per-sample input shape; throws on a mismatch.
  virtual Shape output_shape(const Shape& input) const = 0;
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  // Views into the flat buffers, one per param_specs() entry, in the same order.
  virtual void bind(std::span<Tensor> params, std::span<Tensor> grads) {
    (void)params;
    (void)grads;
  }
  // x: [B, ...input], y: [B, ...output] (resized by the layer as needed).
  virtual void forward(const Tensor& x, Tensor& y, Context& ctx) = 0;
  // Backward is two calls, so that a layer's parameter gradients can be handed to the
  // gradient averaging before its input gradient is computed (that is more computation for
  // the communication to hide behind). Both read what forward saved.
  // Writes the parameter gradients; layers without parameters have nothing to do. A layer
  // whose gradients are large may finish them in pieces (grad_pieces) and call progress after
  // each, so averaging can start on the first rows while the rest are computed; the model
  // reports whatever is left when backward_params returns.
  virtual void backward_params(const Tensor& x, const Tensor& y, const Tensor& dy, Context& ctx,
                               const GradProgressFn& progress) {
    (void)x;
    (void)y;
    (void)dy;
    (void)ctx;
    (void)progress;
  }
  // The sizes, in flat order, of the pieces backward_params reports; they sum to the layer's
  // parameter count. Default: the whole layer at once.
  virtual std::vector<int64_t> grad_pieces() const;
  // Writes dx, resizing it as needed; called only when some earlier layer has parameters.
  // A layer may turn dx into a view (Flatten does) instead of writing into it.
  virtual void backward_input(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                              Context& ctx) = 0;
  // Whether, on the CPU, forward and backward_input compute each row of their result from the
  // same row of their inputs alone, with arithmetic that is the same for a batch of `rows`
  // rows as for any multiple of them (rows a multiple of 4). --reproducible relies on it
  // (Model::can_stack_micro_shards): micro-shards stacked into one batch then get the
  // activations and input gradients each would get alone.
  virtual bool rows_independent(int64_t rows) const {
    (void)rows;
    return false;
  }
  // A fully connected layer (its parameters the weights w [in, out], then the bias b [out]):
  // its sizes, with which the exact sum computes its parameter gradients from x and dy itself
  // (dense_terms.h). Any other layer: none.
  virtual std::optional<DenseSizes> dense_sizes() const { return std::nullopt; }
};

// Whether `layer` runs this call on the GPU (ctx.device == kCuda), after checking that its
// input lives on ctx.device: a host tensor handed to GPU math (or the reverse) would fault.
bool runs_on_gpu(const Layer& layer, const Tensor& x, const Context& ctx);

}  // namespace ringtrain
