// The safetensors writer (see safetensors.h). The JSON is written here, not by a library: the
// header holds only strings, integers and lists of integers, and the strings are escaped as
// JSON requires (quotes, backslashes, control characters).
#include "ringtrain/safetensors.h"

#include <bit>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"

namespace ringtrain {

namespace {

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (byte < 0x20) {
      out += fmt::format("\\u{:04x}", byte);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

void append_le64(std::vector<uint8_t>& bytes, uint64_t value) {
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

}  // namespace

std::vector<uint8_t> safetensors_bytes(std::span<const TorchTensor> tensors,
                                       const SafetensorsMetadata& metadata) {
  static_assert(std::endian::native == std::endian::little,
                "the data part is copied as it lies in memory: little-endian hosts only");
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      if (i > 0) header += ',';
      header += json_string(metadata[i].first) + ':' + json_string(metadata[i].second);
    }
    header += '}';
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TorchTensor& tensor : tensors) {
    RINGTRAIN_CHECK(tensor.name != "__metadata__" && names.insert(tensor.name).second,
                    "safetensors: the tensor name '{}' is reserved or used twice", tensor.name);
    int64_t count = 1;
    for (const int64_t dim : tensor.shape) count *= dim;
    RINGTRAIN_CHECK(count == static_cast<int64_t>(tensor.values.size()),
                    "safetensors: {} has {} values for its shape of {}", tensor.name,
                    tensor.values.size(), count);
    const uint64_t end = offset + tensor.values.size() * sizeof(float);
    if (header.size() > 1) header += ',';
    header += fmt::format("{}:{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          json_string(tensor.name), fmt::join(tensor.shape, ","), offset, end);
    offset = end;
  }
  header += '}';
  // The reference writer pads with spaces so that the data starts 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> bytes;
  bytes.reserve(8 + header.size() + offset);
  append_le64(bytes, header.size());
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (const TorchTensor& tensor : tensors) {
    const auto* data = reinterpret_cast<const uint8_t*>(tensor.values.data());
    bytes.insert(bytes.end(), data, data + tensor.values.size() * sizeof(float));
  }
  return bytes;
}

void write_safetensors(const std::string& path, std::span<const TorchTensor> tensors,
                       const SafetensorsMetadata& metadata) {
  write_file_atomically(path, safetensors_bytes(tensors, metadata));
}

}  // namespace ringtrain
