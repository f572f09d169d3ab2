// Tests for the exporters: torch_layout.h (a naive NCHW forward over the PyTorch-layout tensors,
// written here from PyTorch's definitions of Linear, Conv2d, MaxPool2d and Flatten, must give
// the model's own logits; a layer without a counterpart is refused), safetensors.h (the exact
// bytes of a small file: length, JSON, padding, data), and onnx_export.h (ONNX's checker and
// strict shape inference accept the models and refuse a broken graph or logits of the wrong
// shape; a build without ONNX refuses with a usage error).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/layers.h"
#include "ringtrain/model.h"
#include "ringtrain/onnx_export.h"
#include "ringtrain/safetensors.h"
#include "ringtrain/torch_layout.h"

namespace {

using Catch::Matchers::Contains;
using ringtrain::Context;
using ringtrain::Model;
using ringtrain::ModelSpec;
using ringtrain::Shape;
using ringtrain::Tensor;
using ringtrain::TorchModel;
using ringtrain::TorchOp;
using ringtrain::TorchTensor;

std::unique_ptr<Model> trained_looking(const std::string& name, std::vector<int64_t> hidden) {
  ModelSpec spec;
  spec.name = name;
  spec.hidden = std::move(hidden);
  auto model = ringtrain::make_model(spec);
  model->init_params(7);
  // Non-zero biases, so that a bias put in the wrong place shows.
  std::vector<float> params = model->params_to_host();
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
  for (float& p : params) p += noise(gen);
  model->params_from_host(params);
  return model;
}

// PyTorch's forward over [C, H, W] samples, in double, from the exported tensors alone.
std::vector<double> reference_logits(const TorchModel& m, const std::vector<float>& pixels,
                                     int64_t batch) {
  std::map<std::string, const TorchTensor*> by_name;
  for (const TorchTensor& t : m.tensors) by_name[t.name] = &t;
  std::vector<double> out;
  const int64_t sample = m.input[0] * m.input[1] * m.input[2];
  for (int64_t b = 0; b < batch; ++b) {
    int64_t c = m.input[0], h = m.input[1], w = m.input[2];
    std::vector<double> x(pixels.begin() + b * sample, pixels.begin() + (b + 1) * sample);
    for (const ringtrain::TorchLayer& layer : m.layers) {
      std::vector<double> y;
      if (layer.op == TorchOp::kDense) {  // y = W x + b, W [out, in]
        const auto& weight = by_name.at(layer.name + ".weight")->values;
        const auto& bias = by_name.at(layer.name + ".bias")->values;
        REQUIRE(static_cast<int64_t>(x.size()) == layer.in);
        y.assign(static_cast<size_t>(layer.out), 0.0);
        for (int64_t o = 0; o < layer.out; ++o) {
          double sum = bias[static_cast<size_t>(o)];
          for (int64_t i = 0; i < layer.in; ++i)
            sum += weight[static_cast<size_t>(o * layer.in + i)] * x[static_cast<size_t>(i)];
          y[static_cast<size_t>(o)] = sum;
        }
        c = layer.out, h = w = 1;
      } else if (layer.op == TorchOp::kConv3x3) {  // W [out, in, 3, 3], padding 1
        const auto& weight = by_name.at(layer.name + ".weight")->values;
        const auto& bias = by_name.at(layer.name + ".bias")->values;
        y.assign(static_cast<size_t>(layer.out * h * w), 0.0);
        for (int64_t o = 0; o < layer.out; ++o)
          for (int64_t r = 0; r < h; ++r)
            for (int64_t s = 0; s < w; ++s) {
              double sum = bias[static_cast<size_t>(o)];
              for (int64_t i = 0; i < c; ++i)
                for (int64_t kh = 0; kh < 3; ++kh)
                  for (int64_t kw = 0; kw < 3; ++kw) {
                    const int64_t ir = r + kh - 1, is = s + kw - 1;
                    if (ir < 0 || ir >= h || is < 0 || is >= w) continue;
                    sum += weight[static_cast<size_t>(((o * c + i) * 3 + kh) * 3 + kw)] *
                           x[static_cast<size_t>((i * h + ir) * w + is)];
                  }
              y[static_cast<size_t>((o * h + r) * w + s)] = sum;
            }
        c = layer.out;
      } else if (layer.op == TorchOp::kMaxPool2x2) {
        y.assign(static_cast<size_t>(c * (h / 2) * (w / 2)), 0.0);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t r = 0; r < h / 2; ++r)
            for (int64_t s = 0; s < w / 2; ++s) {
              double best = -INFINITY;
              for (int64_t d = 0; d < 4; ++d)
                best = std::max(
                    best, x[static_cast<size_t>((i * h + 2 * r + d / 2) * w + 2 * s + d % 2)]);
              y[static_cast<size_t>((i * (h / 2) + r) * (w / 2) + s)] = best;
            }
        h /= 2, w /= 2;
      } else if (layer.op == TorchOp::kRelu) {
        y = x;
        for (double& v : y) v = std::max(v, 0.0);
      } else {  // Flatten: (c, h, w) order, nothing moves
        y = x;
      }
      x = std::move(y);
    }
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

void check_layout_matches_forward(const std::string& name, std::vector<int64_t> hidden) {
  auto model = trained_looking(name, std::move(hidden));
  const TorchModel torch = ringtrain::to_torch_layout(*model, model->params_to_host(), "--test");
  constexpr int64_t kBatch = 3;
  // One channel: the NHWC batch and the NCHW batch are the same floats.
  Tensor images(Shape{kBatch, 28, 28, 1});
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = pixel(gen);
  Context ctx;
  const Tensor& logits = model->forward(images, ctx);
  const std::vector<double> expected = reference_logits(
      torch, std::vector<float>(images.data(), images.data() + images.numel()), kBatch);
  REQUIRE(static_cast<int64_t>(expected.size()) == logits.numel());
  double worst = 0.0;
  for (int64_t i = 0; i < logits.numel(); ++i)
    worst = std::max(worst, std::abs(expected[static_cast<size_t>(i)] - logits.data()[i]));
  INFO(name << ": max |logit difference| " << worst);
  CHECK(worst < 1e-4);  // float32 sums of at most 784 terms of size ~1
}

}  // namespace

TEST_CASE("torch layout: the cnn's tensors under PyTorch's NCHW forward give its logits",
          "[export]") {
  auto model = trained_looking("cnn", {});
  const TorchModel torch = ringtrain::to_torch_layout(*model, model->params_to_host(), "--x");
  std::vector<std::string> names;
  for (const TorchTensor& t : torch.tensors) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight",
                                          "conv2.bias", "fc1.weight", "fc1.bias"});
  CHECK(torch.tensors[2].shape == std::vector<int64_t>{16, 8, 3, 3});
  CHECK(torch.tensors[4].shape == std::vector<int64_t>{10, 784});
  CHECK(torch.input == std::vector<int64_t>{1, 28, 28});
  check_layout_matches_forward("cnn", {});
}

TEST_CASE("torch layout: mlps with --hidden lists give their logits", "[export]") {
  check_layout_matches_forward("mlp", {});
  check_layout_matches_forward("mlp", {64, 32, 16});
  auto model = trained_looking("mlp", {64, 32});
  const TorchModel torch = ringtrain::to_torch_layout(*model, model->params_to_host(), "--x");
  REQUIRE(torch.tensors.size() == 6);
  CHECK(torch.tensors[0].name == "fc1.weight");
  CHECK(torch.tensors[0].shape == std::vector<int64_t>{64, 784});
  CHECK(torch.tensors[5].name == "fc3.bias");
}

namespace {
class Unknown final : public ringtrain::Layer {
 public:
  std::string name() const override { return "tanh"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(const Tensor& x, Tensor& y, Context&) override { y = x; }
  void backward_input(const Tensor&, const Tensor&, const Tensor& dy, Tensor& dx,
                      Context&) override {
    dx = dy;
  }
};
}  // namespace

TEST_CASE("torch layout: a layer with no counterpart is refused, naming it and the flag",
          "[export]") {
  Model model(Shape{28, 28, 1});
  model.add(ringtrain::make_flatten());
  model.add(std::make_unique<Unknown>());
  model.add(ringtrain::make_dense(784, 10));
  model.finalize();
  try {
    (void)ringtrain::torch_layers(model, "--export-onnx");
    FAIL("no error");
  } catch (const ringtrain::Error& error) {
    CHECK(error.code() == ringtrain::ExitCode::kUsage);
    CHECK_THAT(error.what(), Contains("--export-onnx") && Contains("1.tanh"));
  }
}

TEST_CASE("safetensors: length, JSON header padded to 8 bytes, then the data", "[export]") {
  const std::vector<TorchTensor> tensors = {{"a.weight", {2, 1}, {1.0f, -2.0f}},
                                            {"a.bias", {1}, {0.5f}}};
  const std::vector<uint8_t> bytes =
      ringtrain::safetensors_bytes(tensors, {{"format", "pt"}, {"note", "say \"hi\"\n"}});
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | bytes[static_cast<size_t>(i)];
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(length));
  const std::string json = R"({"__metadata__":{"format":"pt","note":"say \"hi\"\u000a"},)"
                           R"("a.weight":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},)"
                           R"("a.bias":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  CHECK(header.substr(0, json.size()) == json);
  CHECK(header.find_first_not_of(' ', json.size()) == std::string::npos);  // padding: spaces
  CHECK(header.size() - json.size() < 8);
  CHECK((8 + length) % 8 == 0);
  REQUIRE(bytes.size() == 8 + length + 12);
  float values[3];
  std::memcpy(values, bytes.data() + 8 + length, sizeof(values));
  CHECK(values[0] == 1.0f);
  CHECK(values[1] == -2.0f);
  CHECK(values[2] == 0.5f);
}

TEST_CASE("safetensors: duplicate names and wrong value counts are refused", "[export]") {
  const std::vector<TorchTensor> twice = {{"w", {1}, {1.0f}}, {"w", {1}, {2.0f}}};
  CHECK_THROWS_WITH(ringtrain::safetensors_bytes(twice, {}), Contains("'w'"));
  const std::vector<TorchTensor> short_of = {{"w", {2, 2}, {1.0f}}};
  CHECK_THROWS_WITH(ringtrain::safetensors_bytes(short_of, {}), Contains("1 values"));
}

TEST_CASE("onnx: the checker accepts both models and refuses broken graphs", "[export]") {
  auto cnn = trained_looking("cnn", {});
  const TorchModel torch = ringtrain::to_torch_layout(*cnn, cnn->params_to_host(), "--x");
  if (!ringtrain::onnx_export_available()) {
    try {
      (void)ringtrain::onnx_model_bytes(torch, "test", "--export-onnx");
      FAIL("no error");
    } catch (const ringtrain::Error& error) {
      CHECK(error.code() == ringtrain::ExitCode::kUsage);
      CHECK_THAT(error.what(), Contains("libonnx-dev"));
    }
    WARN("this build has no ONNX exporter: only its refusal was checked");
    return;
  }
  const std::string bytes = ringtrain::onnx_model_bytes(torch, "test", "--export-onnx");
  // The initializers' raw float32 bytes are all in the file.
  size_t floats = 0;
  for (const TorchTensor& t : torch.tensors) floats += t.values.size();
  CHECK(bytes.size() > floats * sizeof(float));
  auto mlp = trained_looking("mlp", {32, 16});
  CHECK_NOTHROW(ringtrain::onnx_model_bytes(
      ringtrain::to_torch_layout(*mlp, mlp->params_to_host(), "--x"), "test", "--export-onnx"));

  TorchModel missing = torch;  // a node reads an initializer that is not there
  missing.tensors.erase(missing.tensors.begin() + 1);
  CHECK_THROWS_WITH(ringtrain::onnx_model_bytes(missing, "test", "--export-onnx"),
                    Contains("--export-onnx: ONNX's checker refuses"));
  // fc1 [10, 784] -> [5, 784]: inference gives logits [N, 5], not the declared [N, 10].
  TorchModel wrong_shape = torch;
  wrong_shape.tensors[4].shape = {5, 784};
  wrong_shape.tensors[4].values.resize(5 * 784);
  wrong_shape.tensors[5].shape = {5};
  wrong_shape.tensors[5].values.resize(5);
  CHECK_THROWS_WITH(ringtrain::onnx_model_bytes(wrong_shape, "test", "--export-onnx"),
                    Contains("ONNX's checker refuses"));
}
