// A trained model in PyTorch's layout: the one description both exporters (ONNX, safetensors)
// write, so that the two files always agree with each other and with a PyTorch model.
//
// ringtrain computes in NHWC with weights laid out for its GEMMs; PyTorch (and ONNX) are NCHW:
//   dense  w [in, out]              -> fcK.weight   [out, in]   (transposed)
//   conv   w [kh, kw, cin, cout]    -> convK.weight [cout, cin, kh, kw]
//   biases [out]                    -> fcK.bias, convK.bias [out]
// and a dense layer that reads a flattened feature map [C, H, W] with C > 1 gets its input
// columns reordered from ringtrain's (h, w, c) flattening to PyTorch's (c, h, w), so that
// nn.Flatten on NCHW feeds it the same numbers. K counts the dense (conv) layers from 1 in
// forward order. The input is one channel, where NHWC and NCHW are the same bytes:
// [N, 1, H, W] float pixels scaled to [0, 1] (byte * kPixelScale, data.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/model.h"

namespace ringtrain {

enum class TorchOp { kDense, kConv3x3, kRelu, kMaxPool2x2, kFlatten };

// One layer of the exported graph, in forward order.
struct TorchLayer {
  TorchOp op;
  std::string name;  // "fc1", "conv2"; empty for layers without parameters
  int64_t in = 0;    // dense: features; conv: channels
  int64_t out = 0;
};

// One parameter tensor in PyTorch's layout, float32.
struct TorchTensor {
  std::string name;            // "fc1.weight"
  std::vector<int64_t> shape;  // PyTorch's shape, e.g. [out, in]
  std::vector<float> values;   // row-major in that shape
};

struct TorchModel {
  std::vector<int64_t> input;  // the per-sample input [C, H, W] = [1, 28, 28]
  int64_t classes = 0;
  std::vector<TorchLayer> layers;
  std::vector<TorchTensor> tensors;  // forward order: fc1.weight, fc1.bias, fc2.weight, ...
};

// The layers of `model` as PyTorch's modules, without weights. Throws (ExitCode::kUsage) for a
// layer with no PyTorch/ONNX counterpart here, naming it and `flag`, so that a run can be
// refused before it trains.
std::vector<TorchLayer> torch_layers(const Model& model, const std::string& flag);

// The model with the weights `params` (the flat buffer in the model's layout, host memory:
// the trained weights or their EMA).
TorchModel to_torch_layout(const Model& model, std::span<const float> params,
                           const std::string& flag);

}  // namespace ringtrain
