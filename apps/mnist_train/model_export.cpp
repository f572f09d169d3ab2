// The final model's files (see model_export.h).
#include "model_export.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/log.h"
#include "ringtrain/onnx_export.h"
#include "ringtrain/safetensors.h"
#include "ringtrain/torch_layout.h"

namespace ringtrain::app {

namespace {

// `path` must name a file in an existing, writable folder (the write itself goes through a
// fresh temporary there, never through an existing name).
void check_output_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  const auto refuse = [&](const std::string& why) {
    throw Error(fmt::format("{} {}: {}", flag, path, why), ExitCode::kUsage);
  };
  std::error_code error;
  const fs::path file(path);
  if (fs::is_directory(file, error)) refuse("is a folder; name a file in it");
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (!fs::is_directory(folder, error))
    refuse(fmt::format("the folder {} does not exist; create it or name a file elsewhere",
                       folder.string()));
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    refuse(fmt::format("cannot create a file in {}: {}", folder.string(), std::strerror(errno)));
}

// The test set's logits [count, classes] under `weights`, by the model's own forward; the
// model's trained weights are put back after.
std::vector<float> test_logits(Model& model, std::span<const float> weights, const Dataset& test,
                               int64_t batch_size, Context& ctx) {
  RINGTRAIN_CHECK(model.device() == Device::kCpu,
                  "--test-dump-logits on a device model (check_export_flags refuses it)");
  const std::vector<float> trained = model.params_to_host();
  model.params_from_host(weights);
  const int64_t classes = model.output_shape().numel();
  std::vector<float> logits(static_cast<size_t>(test.count * classes));
  std::vector<int64_t> indices;
  Tensor images;
  std::vector<int32_t> labels;
  for (int64_t begin = 0; begin < test.count; begin += batch_size) {
    const int64_t end = std::min(test.count, begin + batch_size);
    indices.resize(static_cast<size_t>(end - begin));
    std::iota(indices.begin(), indices.end(), begin);
    make_batch(test, indices, images, labels);
    const Tensor& out = model.forward(images, ctx);  // [end - begin, classes]
    std::copy_n(out.data(), out.numel(), logits.begin() + begin * classes);
  }
  model.params_from_host(trained);
  return logits;
}

}  // namespace

void check_export_flags(const Options& o, const Model& model, bool chief) {
  struct Output {
    const char* flag;
    const std::string& path;
  };
  const Output exports[] = {{"--export-onnx", o.export_onnx},
                            {"--export-safetensors", o.export_safetensors}};
  const Output outputs[] = {exports[0],
                            exports[1],
                            {"--test-dump-logits", o.test_dump_logits},
                            {"--save-params", o.save_params}};
  for (const Output& a : outputs) {
    for (const Output& b : outputs) {
      if (&a < &b && !a.path.empty() && a.path == b.path)
        refuse_usage(
            fmt::format("{} and {} both name {}: give each its own file", a.flag, b.flag, a.path));
    }
  }
  for (const Output& out : exports) {
    if (out.path.empty()) continue;
    (void)torch_layers(model, out.flag);  // refuses a layer the exporters cannot express
  }
  if (!o.test_dump_logits.empty() && model.device() != Device::kCpu)
    refuse_usage("--test-dump-logits runs on a CPU model only: add --device cpu");
  if (!o.export_onnx.empty() && !onnx_export_available())
    refuse_usage(
        "--export-onnx: this build has no ONNX exporter; install libonnx-dev and "
        "libprotobuf-dev (scripts/install_deps.sh) and configure the build again");
  // The files this part writes (--save-params is checked by its own writer, at the end).
  if (chief) {
    for (const Output& out : std::span(outputs).first(3)) {
      if (!out.path.empty()) check_output_path(out.flag, out.path);
    }
  }
}

void export_final_model(const Options& o, Model& model, const WeightEma* ema, const Dataset& test,
                        Context& ctx) {
  if (o.export_onnx.empty() && o.export_safetensors.empty() && o.test_dump_logits.empty()) return;
  const std::vector<float> weights = ema ? ema->shadow_to_host() : model.params_to_host();
  const char* which = ema ? "EMA" : "trained";
  if (!o.export_onnx.empty()) {
    write_onnx_model(o.export_onnx, to_torch_layout(model, weights, "--export-onnx"),
                     RINGTRAIN_CODE_VERSION, "--export-onnx");
    spdlog::info("exported the model ({} weights) to {}: ONNX opset {}, checked by ONNX's checker",
                 which, o.export_onnx, kOnnxOpset);
  }
  if (!o.export_safetensors.empty()) {
    const TorchModel torch = to_torch_layout(model, weights, "--export-safetensors");
    const Shape& input = model.input_shape();
    write_safetensors(o.export_safetensors, torch.tensors,
                      {{"format", "pt"},
                       {"ringtrain.model", o.model},
                       {"ringtrain.layers", model.signature()},
                       {"ringtrain.weights", which},
                       {"ringtrain.input", fmt::format("float32 [N, 1, {}, {}], pixel bytes / 255",
                                                       input[0], input[1])},
                       {"ringtrain.version", RINGTRAIN_CODE_VERSION}});
    spdlog::info("exported {} tensors ({} weights) to {} (safetensors)", torch.tensors.size(),
                 which, o.export_safetensors);
  }
  if (!o.test_dump_logits.empty()) {
    const std::vector<float> logits = test_logits(model, weights, test, o.eval_batch, ctx);
    write_file_atomically(o.test_dump_logits, {reinterpret_cast<const uint8_t*>(logits.data()),
                                               logits.size() * sizeof(float)});
    spdlog::info("wrote the test set's logits ({} weights) to {}", which, o.test_dump_logits);
  }
}

}  // namespace ringtrain::app
