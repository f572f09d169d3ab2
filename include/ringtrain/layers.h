// The concrete layers: Dense, Conv2D (3x3 same, stride 1), MaxPool2D (2x2/2), ReLU, Flatten.
// The loss (fused softmax cross-entropy) is a function in ops.h, not a layer.
#pragma once

#include <memory>

#include "ringtrain/layer.h"

namespace ringtrain {

std::unique_ptr<Layer> make_dense(int64_t in, int64_t out);
std::unique_ptr<Layer> make_conv2d(int64_t cin, int64_t cout);
std::unique_ptr<Layer> make_maxpool2d();
std::unique_ptr<Layer> make_relu();
std::unique_ptr<Layer> make_flatten();

}  // namespace ringtrain
