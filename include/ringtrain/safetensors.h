// The safetensors file format (huggingface/safetensors), float32 tensors only:
//   8 bytes   N, the header's length, a little-endian uint64
//   N bytes   a JSON object: {"__metadata__": {"key": "value", ...},
//               "name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}
//             padded with spaces to a multiple of 8 bytes, as the reference writer pads it
//   the data  each tensor's values, little-endian, row-major, at [begin, end) of this part;
//             tensors back to back in the order given, no gaps
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/torch_layout.h"

namespace ringtrain {

using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// The whole file's bytes. Tensor names must be unique and not "__metadata__".
std::vector<uint8_t> safetensors_bytes(std::span<const TorchTensor> tensors,
                                       const SafetensorsMetadata& metadata);

// Writes safetensors_bytes atomically (write_file_atomically: never through an existing name).
void write_safetensors(const std::string& path, std::span<const TorchTensor> tensors,
                       const SafetensorsMetadata& metadata);

}  // namespace ringtrain
