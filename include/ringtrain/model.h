// Model: an ordered list of layers over two flat buffers, parameters and gradients.
//
// The flat layout is in *backward* order: the last layer's parameters come first. Backward
// produces gradients from the last layer to the first, so the gradients that are ready form a
// growing prefix [0, end) of the gradient buffer, and a fusion bucket is simply a contiguous
// range of it: the ring can reduce it in place with no packing copy. As soon as a layer's
// parameter gradients are written (before its input gradient), the model reports the range
// through the grad-ready callback.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/layer.h"

namespace ringtrain {

// One parameter tensor's place in the flat buffers.
struct ParamView {
  std::string name;  // "2.dense(500->500).weight"
  int layer = 0;
  Shape shape;
  int64_t offset = 0;
  int64_t size = 0;
};

// The gradients [begin, end) of layer `layer` are final for this step.
struct GradRange {
  int layer = 0;
  int64_t begin = 0;
  int64_t end = 0;
};
using GradReadyFn = std::function<void(const GradRange&)>;
// Layer `layer`'s input x and the gradient dy at its output, during a backward.
using LayerRowsFn = std::function<void(int layer, const Tensor& x, const Tensor& dy)>;

// Told as each layer's backward begins and ends (the --timeline's per-layer spans). The model
// knows nothing of what the observer does with it.
class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  virtual void layer_begin(int layer) = 0;
  virtual void layer_end(int layer) = 0;
};

class Model {
 public:
  // input: the per-sample input shape, e.g. {28, 28, 1}.
  explicit Model(const Shape& input);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  void add(std::unique_ptr<Layer> layer);
  // Lays out the flat buffers and binds every layer's views; call once, after the last add().
  // device kCuda: the buffers, the activations and every layer's views are device memory
  // (cudaMalloc on the current device), and forward/backward need a CUDA Context.
  void finalize(Device device = Device::kCpu);
  // Glorot-uniform weights and zero biases from `seed` (the same bits on every machine, on
  // either device: a device model draws on the host and uploads once).
  void init_params(uint64_t seed);

  // x: [B, ...input]. Returns the logits [B, classes]; valid until the next forward.
  const Tensor& forward(const Tensor& x, Context& ctx);
  // dlogits: [B, classes] for the batch of the last forward. Calls on_grad_ready (if set)
  // for each layer that has parameters, in backward order, as soon as that layer's parameter
  // gradients are written and before its input gradient is computed.
  void backward(const Tensor& dlogits, Context& ctx, const GradReadyFn& on_grad_ready = {});
  // Whether micro-shards of `rows` rows each may be stacked into one forward and one
  // backward_inputs with the activations and input gradients each would get alone: a host
  // model whose every layer is rows_independent, rows a multiple of 4, and each micro-shard's
  // rows starting 64-byte aligned in every activation (the alignment of a micro-shard on its
  // own). The caller runs Eigen on one thread: a threaded GEMM splits its work by the sizes.
  bool can_stack_micro_shards(int64_t rows) const;
  // Backward without the parameter gradients, for a caller that computes them itself from
  // each layer's rows (the exact sum's DenseShardTerms): for each layer with parameters, from
  // the last, on_layer(layer, x, dy) with its input and the gradient at its output (for the
  // batch of the last forward), before its input gradient is computed. The gradient buffer
  // is not written.
  void backward_inputs(const Tensor& dlogits, Context& ctx, const LayerRowsFn& on_layer);
  // Every later backward tells `observer` (null: no one) about each layer it runs.
  void set_backward_observer(BackwardObserver* observer) { observer_ = observer; }

  // The pieces in which backward reports gradients, in backward (= flat buffer) order: one
  // per layer with parameters, or several for a large layer (Layer::grad_pieces). Fixed when
  // the model is finalized (empty before).
  const std::vector<GradRange>& grad_ranges() const { return grad_ranges_; }

  // On a device model these are device tensors: copy explicitly (below) to read them.
  Tensor& params() { return params_; }
  const Tensor& params() const { return params_; }
  Tensor& grads() { return grads_; }
  const Tensor& grads() const { return grads_; }
  // Later backward passes write the parameter gradients into `buffer` instead of grads(): a
  // host buffer of num_params() floats, laid out as grads(); nullptr means grads() again.
  // (The exact sum gives each micro-shard its own buffer this way: no copy.) Host model only.
  void write_grads_to(float* buffer);
  Device device() const { return device_; }
  // Explicit, synchronous copies of the flat parameter buffer to and from host memory (plain
  // copies for a host model): checkpoints, broadcasts, replica checks, parameter files.
  std::vector<float> params_to_host() const { return params_.to_host(); }
  void params_from_host(std::span<const float> host) { params_.copy_from_host(host); }
  const std::vector<ParamView>& param_views() const { return views_; }
  int64_t num_params() const { return params_.numel(); }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const Layer& layer(int index) const { return *layers_.at(static_cast<size_t>(index)); }
  std::string layer_name(int layer) const;  // "2.dense(500->500)"
  const Shape& input_shape() const { return input_; }
  const Shape& output_shape() const { return output_; }
  // One line per layer with its output shape and parameter count.
  std::string summary() const;
  // The layer list with shapes on one line ("[28,28,1] dense(784->500) relu ..."): what a
  // checkpoint records to refuse loading into another model.
  std::string signature() const;

 private:
  void compute_grad_ranges();  // grad_ranges_, once the layers' ranges are laid out
  Shape input_;
  Shape output_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<ParamSpec>> specs_;  // per layer
  std::vector<ParamView> views_;
  std::vector<std::vector<Tensor>> param_tensors_;         // per layer, views into params_
  std::vector<std::vector<Tensor>> grad_tensors_;          // per layer, views into grads_
  std::vector<Tensor> bind_scratch_;                       // bind_layer_grads()'s list, reused
  std::vector<GradRange> grad_ranges_;                     // grad_ranges(), from finalize()
  std::vector<std::pair<int64_t, int64_t>> layer_ranges_;  // per layer [begin, end)
  Tensor params_;
  Tensor grads_;
  std::vector<Tensor> acts_;   // acts_[i] is layer i's input; acts_[L] the logits
  std::vector<Tensor> dacts_;  // dacts_[i] is d loss / d acts_[i]
  int first_with_params_ = 0;  // backward stops here: no layer before it needs a gradient
  BackwardObserver* observer_ = nullptr;
  float* grads_target_ = nullptr;  // write_grads_to's buffer; null: grads_
  // Binds layer `layer`'s gradient views to the same offsets in `base`.
  void bind_layer_grads(int layer, float* base);
  // Layer `layer`'s backward_params on (x, y, dy), its pieces reported through on_grad_ready.
  void layer_param_grads(int layer, const Tensor& x, const Tensor& y, const Tensor& dy,
                         Context& ctx, const GradReadyFn& on_grad_ready);
  bool finalized_ = false;
  Device device_ = Device::kCpu;
};

// The models of the source documents, by name: "mlp" (784-hidden...-10, ReLU) and "cnn"
// (conv3x3 1->8, ReLU, maxpool, conv3x3 8->16, ReLU, maxpool, dense 784->10).
// `hidden` sets the MLP's hidden widths (default {500, 500}); it is rejected for "cnn".
struct ModelSpec {
  std::string name = "mlp";
  std::vector<int64_t> hidden;  // empty: the model's default
  int64_t height = 28;
  int64_t width = 28;
  int64_t classes = 10;
  Device device = Device::kCpu;  // where the parameters, gradients and activations live
};
std::unique_ptr<Model> make_model(const ModelSpec& spec);

}  // namespace ringtrain
