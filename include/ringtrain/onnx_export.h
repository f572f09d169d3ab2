// ONNX export: a model in PyTorch's layout (torch_layout.h) as an ONNX graph, built with
// Debian's ONNX library (libonnx-dev: its protobuf classes and its checker).
//
//   input  "pixels"        float32 [N, 1, H, W], byte * kPixelScale (data.h): [0, 1], the
//                          numbers ringtrain trains on (and torchvision's ToTensor() gives)
//   nodes  Conv 3x3 (pads 1) | Relu | MaxPool 2x2/2 | Flatten (axis 1) | Gemm (transB = 1),
//          one per ringtrain layer, named after the PyTorch module ("fc1", "conv2", "relu_3")
//   output "logits"        float32 [N, classes], and "probabilities" = Softmax(logits, axis 1)
//   opset  kOnnxOpset of the default domain; ir_version 7 (the oldest that opset 13 allows)
// Initializers are the PyTorch tensors under their names ("fc1.weight" [out, in], ...).
// Before anything is written, ONNX's checker (checker::check_model) and its strict shape
// inference must accept the model, with the declared output shapes.
#pragma once

#include <string>

#include "ringtrain/torch_layout.h"

namespace ringtrain {

inline constexpr int kOnnxOpset = 13;

// Whether this build has the ONNX exporter (CMake found libonnx-dev: RINGTRAIN_ONNX).
bool onnx_export_available();

// The model's serialized ModelProto bytes, checked. Throws naming `flag` when the checker
// refuses the model, and (ExitCode::kUsage) when this build has no ONNX exporter.
std::string onnx_model_bytes(const TorchModel& model, const std::string& producer_version,
                             const std::string& flag);

// Writes onnx_model_bytes to path atomically (write_file_atomically).
void write_onnx_model(const std::string& path, const TorchModel& model,
                      const std::string& producer_version, const std::string& flag);

}  // namespace ringtrain
