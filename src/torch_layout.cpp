// A trained model in PyTorch's layout (see torch_layout.h). The layers are recognised by the
// names Layer::name() gives them ("dense(784->500)", "conv3x3(1->8)", "maxpool2x2", "relu",
// "flatten"), each checked against its parameters' shapes, so a layer this file does not know
// is refused instead of being exported wrongly.
#include "ringtrain/torch_layout.h"

#include <charconv>
#include <optional>

#include <fmt/format.h>

#include "ringtrain/check.h"

namespace ringtrain {

namespace {

[[noreturn]] void refuse(const std::string& flag, const std::string& why) {
  throw Error(fmt::format("{}: {}", flag, why), ExitCode::kUsage, /*on_every_rank=*/true);
}

// "dense(784->500)" -> {784, 500}; nothing when `name` is not "<kind>(<in>-><out>)".
std::optional<std::pair<int64_t, int64_t>> sizes_of(const std::string& name,
                                                    const std::string& kind) {
  if (name.size() < kind.size() + 2 || name.compare(0, kind.size() + 1, kind + "(") != 0 ||
      name.back() != ')')
    return std::nullopt;
  const std::string inner = name.substr(kind.size() + 1, name.size() - kind.size() - 2);
  const size_t arrow = inner.find("->");
  if (arrow == std::string::npos) return std::nullopt;
  int64_t in = 0, out = 0;
  const char* first = inner.data();
  const auto [in_end, in_error] = std::from_chars(first, first + arrow, in);
  const auto [out_end, out_error] = std::from_chars(first + arrow + 2, first + inner.size(), out);
  if (in_error != std::errc() || out_error != std::errc() || in_end != first + arrow ||
      out_end != first + inner.size() || in <= 0 || out <= 0)
    return std::nullopt;
  return std::pair{in, out};
}

// The parameter `suffix` ("weight", "bias") of layer `layer`, checked to have `shape`.
const ParamView& param_of(const Model& model, int layer, const std::string& suffix,
                          const Shape& shape) {
  for (const ParamView& view : model.param_views()) {
    if (view.layer != layer) continue;
    if (view.name.size() > suffix.size() &&
        view.name.compare(view.name.size() - suffix.size() - 1, std::string::npos, "." + suffix) ==
            0) {
      RINGTRAIN_CHECK(view.shape == shape, "{} has shape {}, expected {}", view.name,
                      view.shape.str(), shape.str());
      return view;
    }
  }
  RINGTRAIN_FAIL("layer {} has no parameter '{}'", model.layer_name(layer), suffix);
}

// A bias needs no reordering: PyTorch's [out] is ringtrain's.
TorchTensor bias_tensor(const std::string& layer_name, std::span<const float> params,
                        const ParamView& bias) {
  const auto begin = params.begin() + bias.offset;
  return {layer_name + ".bias", {bias.size}, std::vector<float>(begin, begin + bias.size)};
}

}  // namespace

std::vector<TorchLayer> torch_layers(const Model& model, const std::string& flag) {
  const Shape& input = model.input_shape();  // [H, W, C]
  if (input.rank() != 3 || input[2] != 1)
    refuse(flag, fmt::format("the model's input {} is not one-channel [H, W, 1]; only such "
                             "models can be exported",
                             input.str()));
  std::vector<TorchLayer> layers;
  int dense_count = 0, conv_count = 0;
  for (int i = 0; i < model.num_layers(); ++i) {
    const std::string name = model.layer_name(i).substr(model.layer_name(i).find('.') + 1);
    if (const auto dense = sizes_of(name, "dense")) {
      layers.push_back(
          {TorchOp::kDense, fmt::format("fc{}", ++dense_count), dense->first, dense->second});
    } else if (const auto conv = sizes_of(name, "conv3x3")) {
      layers.push_back(
          {TorchOp::kConv3x3, fmt::format("conv{}", ++conv_count), conv->first, conv->second});
    } else if (name == "relu") {
      layers.push_back({TorchOp::kRelu, "", 0, 0});
    } else if (name == "maxpool2x2") {
      layers.push_back({TorchOp::kMaxPool2x2, "", 0, 0});
    } else if (name == "flatten") {
      layers.push_back({TorchOp::kFlatten, "", 0, 0});
    } else {
      refuse(flag, fmt::format("layer {} has no exporter; the mlp and cnn models can be "
                               "exported",
                               model.layer_name(i)));
    }
  }
  return layers;
}

TorchModel to_torch_layout(const Model& model, std::span<const float> params,
                           const std::string& flag) {
  RINGTRAIN_CHECK(static_cast<int64_t>(params.size()) == model.num_params(),
                  "{}: {} parameters for a model of {}", flag, params.size(), model.num_params());
  TorchModel result;
  const Shape& input = model.input_shape();  // [H, W, 1]
  result.input = {input[2], input[0], input[1]};
  result.classes = model.output_shape().numel();
  result.layers = torch_layers(model, flag);
  // The feature map as forward reaches each layer, [C, H, W]; after a flatten, the map it
  // flattened, which the next dense layer's columns are reordered for.
  int64_t channels = input[2], height = input[0], width = input[1];
  bool flattened = false;
  for (int i = 0; i < model.num_layers(); ++i) {
    const TorchLayer& layer = result.layers[static_cast<size_t>(i)];
    if (layer.op == TorchOp::kDense) {
      const int64_t in = layer.in, out = layer.out;
      const ParamView& w = param_of(model, i, "weight", Shape{in, out});
      const ParamView& b = param_of(model, i, "bias", Shape{out});
      const float* source = params.data() + w.offset;  // [in, out], rows in (h, w, c) order
      // Reorder only where the input is a flattened map of several channels: with one
      // channel, or after an earlier dense layer, both orders are the same.
      const bool reorder = flattened && channels > 1;
      RINGTRAIN_CHECK(!reorder || channels * height * width == in,
                      "{}: {} reads {} features from a [{}, {}, {}] map", flag, model.layer_name(i),
                      in, channels, height, width);
      TorchTensor weight{layer.name + ".weight", {out, in}, std::vector<float>(in * out)};
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t j = 0; j < in; ++j) {  // j: PyTorch's column, (c, h, w) order
          int64_t row = j;
          if (reorder) {
            const int64_t c = j / (height * width), h = j / width % height, x = j % width;
            row = (h * width + x) * channels + c;
          }
          weight.values[static_cast<size_t>(o * in + j)] = source[row * out + o];
        }
      }
      result.tensors.push_back(std::move(weight));
      result.tensors.push_back(bias_tensor(layer.name, params, b));
      channels = out;
      height = width = 1;
      flattened = false;
    } else if (layer.op == TorchOp::kConv3x3) {
      const int64_t cin = layer.in, cout = layer.out;
      const ParamView& w = param_of(model, i, "weight", Shape{3, 3, cin, cout});
      const ParamView& b = param_of(model, i, "bias", Shape{cout});
      const float* source = params.data() + w.offset;  // [kh, kw, cin, cout]
      TorchTensor weight{layer.name + ".weight",
                         {cout, cin, 3, 3},
                         std::vector<float>(static_cast<size_t>(9 * cin * cout))};
      for (int64_t o = 0; o < cout; ++o)
        for (int64_t c = 0; c < cin; ++c)
          for (int64_t kh = 0; kh < 3; ++kh)
            for (int64_t kw = 0; kw < 3; ++kw)
              weight.values[static_cast<size_t>(((o * cin + c) * 3 + kh) * 3 + kw)] =
                  source[((kh * 3 + kw) * cin + c) * cout + o];
      result.tensors.push_back(std::move(weight));
      result.tensors.push_back(bias_tensor(layer.name, params, b));
      channels = cout;
    } else if (layer.op == TorchOp::kMaxPool2x2) {
      height /= 2;
      width /= 2;
    } else if (layer.op == TorchOp::kFlatten) {
      flattened = true;
    }
  }
  return result;
}

}  // namespace ringtrain
