// Model: layers over two flat buffers laid out in backward order (see model.h).
#include "ringtrain/model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "ringtrain/check.h"
#include "ringtrain/comm.h"
#include "ringtrain/layers.h"

namespace ringtrain {

bool runs_on_gpu(const Layer& layer, const Tensor& x, const Context& ctx) {
  RINGTRAIN_CHECK(x.device() == ctx.device, "{} got a {} tensor in a {} context", layer.name(),
                  to_string(x.device()), to_string(ctx.device));
  return ctx.device == Device::kCuda;
}

std::vector<int64_t> Layer::grad_pieces() const {
  int64_t total = 0;
  for (const ParamSpec& spec : param_specs()) total += spec.shape.numel();
  return {total};
}

Model::Model(const Shape& input) : input_(input), output_(input) {}

void Model::add(std::unique_ptr<Layer> layer) {
  RINGTRAIN_CHECK(!finalized_, "cannot add {} after finalize()", layer->name());
  output_ = layer->output_shape(output_);  // checks that the layer accepts its input
  specs_.push_back(layer->param_specs());
  layers_.push_back(std::move(layer));
}

void Model::write_grads_to(float* buffer) {
  RINGTRAIN_CHECK(finalized_ && device_ == Device::kCpu,
                  "write_grads_to() needs a finalized host model");
  grads_target_ = buffer;
  for (int i = 0; i < num_layers(); ++i)
    bind_layer_grads(i, buffer != nullptr ? buffer : grads_.data());
}

void Model::bind_layer_grads(int layer, float* base) {
  const auto& own = grad_tensors_[static_cast<size_t>(layer)];
  if (own.empty()) return;
  // The layer copies the views it is given, so one scratch list serves every layer; it keeps
  // its capacity, and rebinding (every micro-shard under --reproducible) allocates nothing.
  std::vector<Tensor>& grads = bind_scratch_;
  grads.clear();
  for (const Tensor& view : own)  // the same offset in `base` as in grads_
    grads.push_back(Tensor::view(base + (view.data() - grads_.data()), view.shape(), device_));
  layers_[static_cast<size_t>(layer)]->bind(param_tensors_[static_cast<size_t>(layer)], grads);
}

void Model::finalize(Device device) {
  RINGTRAIN_CHECK(!finalized_ && !layers_.empty(), "finalize() on an empty or finished model");
  device_ = device;
  const int count = num_layers();
  // Offsets from the last layer to the first: backward fills the gradient buffer front to back.
  layer_ranges_.assign(static_cast<size_t>(count), {0, 0});
  std::vector<std::vector<int64_t>> offsets(static_cast<size_t>(count));
  int64_t total = 0;
  for (int i = count - 1; i >= 0; --i) {
    const auto& specs = specs_[static_cast<size_t>(i)];
    layer_ranges_[static_cast<size_t>(i)].first = total;
    for (const ParamSpec& spec : specs) {
      offsets[static_cast<size_t>(i)].push_back(total);
      views_.push_back(
          {fmt::format("{}.{}.{}", i, layers_[static_cast<size_t>(i)]->name(), spec.name), i,
           spec.shape, total, spec.shape.numel()});
      total += spec.shape.numel();
    }
    layer_ranges_[static_cast<size_t>(i)].second = total;
  }
  params_ = Tensor(Shape{total}, device);
  grads_ = Tensor(Shape{total}, device);
  param_tensors_.resize(static_cast<size_t>(count));
  grad_tensors_.resize(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const auto& specs = specs_[static_cast<size_t>(i)];
    auto& params = param_tensors_[static_cast<size_t>(i)];
    auto& grads = grad_tensors_[static_cast<size_t>(i)];
    for (size_t k = 0; k < specs.size(); ++k) {
      const int64_t offset = offsets[static_cast<size_t>(i)][k];
      params.push_back(Tensor::view(params_.data() + offset, specs[k].shape, device));
      grads.push_back(Tensor::view(grads_.data() + offset, specs[k].shape, device));
    }
    layers_[static_cast<size_t>(i)]->bind(params, grads);
    bind_scratch_.reserve(std::max(bind_scratch_.capacity(), specs.size()));
  }
  // The input gradient of layer i is needed only if a layer before it has parameters.
  first_with_params_ = count;
  for (int i = count - 1; i >= 0; --i) {
    const auto [begin, end] = layer_ranges_[static_cast<size_t>(i)];
    if (end > begin) first_with_params_ = i;
  }
  // Empty tensors on the model's device: each layer's resize() allocates there.
  acts_.assign(static_cast<size_t>(count + 1), Tensor(device));
  dacts_.assign(static_cast<size_t>(count + 1), Tensor(device));
  compute_grad_ranges();
  finalized_ = true;
}

namespace {
// splitmix64: a tiny generator whose output is fixed by its definition, so initial weights are
// the same bits with any compiler or standard library.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
}  // namespace

void Model::init_params(uint64_t seed) {
  RINGTRAIN_CHECK(finalized_, "init_params() before finalize()");
  // A host model draws straight into its buffer; a device model into a host copy, uploaded once.
  std::vector<float> staging(device_ == Device::kCpu ? 0 : static_cast<size_t>(num_params()));
  float* host = device_ == Device::kCpu ? params_.data() : staging.data();
  for (int i = 0; i < num_layers(); ++i) {
    const auto& specs = specs_[static_cast<size_t>(i)];
    for (size_t k = 0; k < specs.size(); ++k) {
      const Tensor& view = param_tensors_[static_cast<size_t>(i)][k];
      float* p = host + (view.data() - params_.data());  // the same offset in the host buffer
      const ParamSpec& spec = specs[k];
      if (spec.init == Init::kZeros) {
        std::fill(p, p + view.numel(), 0.0f);
        continue;
      }
      // One stream per parameter tensor, keyed by its place in the model, not in the buffer.
      uint64_t state = seed ^ (0xD1B54A32D192ED03ULL * (static_cast<uint64_t>(i) * 16 + k + 1));
      const double limit = std::sqrt(6.0 / static_cast<double>(spec.fan_in + spec.fan_out));
      for (int64_t j = 0; j < view.numel(); ++j) {
        const double unit = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0,1)
        p[j] = static_cast<float>((2.0 * unit - 1.0) * limit);
      }
    }
  }
  if (device_ != Device::kCpu) params_.copy_from_host(staging);
}

const Tensor& Model::forward(const Tensor& x, Context& ctx) {
  RINGTRAIN_CHECK(finalized_, "forward() before finalize()");
  RINGTRAIN_CHECK(x.rank() >= 2 && x.shape().without_leading().numel() == input_.numel(),
                  "the model takes samples of shape {}, got a batch of shape {}", input_.str(),
                  x.shape().str());
  RINGTRAIN_CHECK(x.device() == device_ && ctx.device == device_,
                  "the model lives on the {}, got a {} batch in a {} context: upload it first",
                  to_string(device_), to_string(x.device()), to_string(ctx.device));
  acts_[0] = x.reshaped(input_.with_leading(x.dim(0)));
  for (int i = 0; i < num_layers(); ++i) {
    layers_[static_cast<size_t>(i)]->forward(acts_[static_cast<size_t>(i)],
                                             acts_[static_cast<size_t>(i + 1)], ctx);
  }
  return acts_.back();
}

void Model::layer_param_grads(int layer, const Tensor& x, const Tensor& y, const Tensor& dy,
                              Context& ctx, const GradReadyFn& on_grad_ready) {
  const auto [begin, end] = layer_ranges_[static_cast<size_t>(layer)];
  struct Progress {
    const GradReadyFn* ready;
    int layer;
    int64_t begin, reported;
  } state{&on_grad_ready, layer, begin, 0};
  const GradProgressFn progress = [p = &state](int64_t done) {  // one pointer: no allocation
    if (*p->ready && done > p->reported) {
      (*p->ready)(GradRange{p->layer, p->begin + p->reported, p->begin + done});
    }
    p->reported = std::max(p->reported, done);
  };
  layers_[static_cast<size_t>(layer)]->backward_params(x, y, dy, ctx, progress);
  progress(end - begin);
}

void Model::backward(const Tensor& dlogits, Context& ctx, const GradReadyFn& on_grad_ready) {
  RINGTRAIN_CHECK(dlogits.shape() == acts_.back().shape(),
                  "backward() got dlogits {} for logits {}", dlogits.shape().str(),
                  acts_.back().shape().str());
  dacts_.back() = dlogits;
  for (int i = num_layers() - 1; i >= first_with_params_; --i) {
    const auto index = static_cast<size_t>(i);
    Layer& layer = *layers_[index];
    if (observer_ != nullptr) observer_->layer_begin(i);
    // Parameter gradients first, reported as they are finished (in pieces for a large layer),
    // so their averaging overlaps the rest of backward, starting with this layer's dx.
    if (layer_ranges_[index].second > layer_ranges_[index].first)
      layer_param_grads(i, acts_[index], acts_[index + 1], dacts_[index + 1], ctx, on_grad_ready);
    if (i > first_with_params_) {
      layer.backward_input(acts_[index], acts_[index + 1], dacts_[index + 1], dacts_[index], ctx);
    }
    if (observer_ != nullptr) observer_->layer_end(i);
  }
}

bool Model::can_stack_micro_shards(int64_t rows) const {
  RINGTRAIN_CHECK(finalized_ && rows > 0, "can_stack_micro_shards({}) needs a finalized model",
                  rows);
  if (device_ != Device::kCpu || rows % 4 != 0) return false;
  // A micro-shard's block of an activation starts at rows x width floats from the batch's
  // 64-byte aligned start.
  const auto aligned = [rows](int64_t width) {
    return (rows * width * static_cast<int64_t>(sizeof(float))) % 64 == 0;
  };
  Shape shape = input_;
  if (!aligned(shape.numel())) return false;
  for (const auto& layer : layers_) {
    if (!layer->rows_independent(rows)) return false;
    shape = layer->output_shape(shape);
    if (!aligned(shape.numel())) return false;
  }
  return true;
}

void Model::backward_inputs(const Tensor& dlogits, Context& ctx, const LayerRowsFn& on_layer) {
  RINGTRAIN_CHECK(dlogits.shape() == acts_.back().shape(),
                  "backward_inputs() got dlogits {} for logits {}", dlogits.shape().str(),
                  acts_.back().shape().str());
  dacts_.back() = dlogits;
  for (int i = num_layers() - 1; i >= first_with_params_; --i) {
    const auto index = static_cast<size_t>(i);
    Layer& layer = *layers_[index];
    if (observer_ != nullptr) observer_->layer_begin(i);
    if (layer_ranges_[index].second > layer_ranges_[index].first)
      on_layer(i, acts_[index], dacts_[index + 1]);
    if (i > first_with_params_) {
      layer.backward_input(acts_[index], acts_[index + 1], dacts_[index + 1], dacts_[index], ctx);
    }
    if (observer_ != nullptr) observer_->layer_end(i);
  }
}

std::string Model::layer_name(int layer) const {
  return fmt::format("{}.{}", layer, layers_.at(static_cast<size_t>(layer))->name());
}

void Model::compute_grad_ranges() {
  std::vector<GradRange>& ranges = grad_ranges_;
  ranges.clear();
  for (int i = num_layers() - 1; i >= 0; --i) {
    int64_t begin = layer_ranges_[static_cast<size_t>(i)].first;
    if (layer_ranges_[static_cast<size_t>(i)].second == begin) continue;
    for (int64_t piece : layers_[static_cast<size_t>(i)]->grad_pieces()) {
      ranges.push_back({i, begin, begin + piece});
      begin += piece;
    }
    RINGTRAIN_CHECK(begin == layer_ranges_[static_cast<size_t>(i)].second,
                    "{}: grad_pieces() do not add up to its parameters",
                    layers_[static_cast<size_t>(i)]->name());
  }
}

std::string Model::signature() const {
  std::string text = input_.str();
  for (const auto& layer : layers_) text += fmt::format(" {}", layer->name());
  return text;
}

std::string Model::summary() const {
  std::string text;
  Shape shape = input_;
  for (int i = 0; i < num_layers(); ++i) {
    const auto index = static_cast<size_t>(i);
    shape = layers_[index]->output_shape(shape);
    const auto [begin, end] =
        layer_ranges_.empty() ? std::pair<int64_t, int64_t>{0, 0} : layer_ranges_[index];
    text += fmt::format("  {:2d} {:<20} -> {:<14} {:>9} params\n", i, layers_[index]->name(),
                        shape.str(), end - begin);
  }
  text += fmt::format("  total {} parameters ({:.1f} MB as float32)", num_params(),
                      static_cast<double>(num_params()) * 4.0 / 1e6);
  return text;
}

std::unique_ptr<Model> make_model(const ModelSpec& spec) {
  auto model = std::make_unique<Model>(Shape{spec.height, spec.width, 1});
  if (spec.name == "mlp") {
    std::vector<int64_t> hidden =
        spec.hidden.empty() ? std::vector<int64_t>{500, 500} : spec.hidden;
    model->add(make_flatten());
    int64_t in = spec.height * spec.width;
    for (int64_t width : hidden) {
      RINGTRAIN_CHECK(width > 0, "--hidden widths must be positive, got {}", width);
      model->add(make_dense(in, width));
      model->add(make_relu());
      in = width;
    }
    model->add(make_dense(in, spec.classes));
  } else if (spec.name == "cnn") {
    RINGTRAIN_CHECK(spec.hidden.empty(), "--hidden applies to --model mlp only");
    RINGTRAIN_CHECK(spec.height % 4 == 0 && spec.width % 4 == 0,
                    "--model cnn pools twice and needs image sides divisible by 4, got {}x{}",
                    spec.height, spec.width);
    model->add(make_conv2d(1, 8));
    model->add(make_relu());
    model->add(make_maxpool2d());
    model->add(make_conv2d(8, 16));
    model->add(make_relu());
    model->add(make_maxpool2d());
    model->add(make_flatten());
    model->add(make_dense(spec.height / 4 * spec.width / 4 * 16, spec.classes));
  } else {
    RINGTRAIN_FAIL("--model '{}' is unknown: use mlp or cnn", spec.name);
  }
  model->finalize(spec.device);
  return model;
}

}  // namespace ringtrain
