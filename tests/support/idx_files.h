// Small IDX files built in memory, for the data tests (test_data.cpp) and the fuzzers' seed
// corpus (fuzz/make_seeds.cpp): one definition of the layout and of the pixel pattern.
#pragma once

#include <cstdint>
#include <vector>

namespace ringtrain::idx_files {

using Bytes = std::vector<uint8_t>;

inline void put_be32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// The pixel the files hold for (image, position): varied, so that gzip cannot squeeze the
// files to nothing and a mix-up of images shows.
inline uint8_t pixel(uint32_t image, uint32_t p) {
  return static_cast<uint8_t>((image * 131 + p * 29 + (p * p) % 7) % 256);
}

// An image file (magic 0x803) of count images of rows x cols.
inline Bytes image_file(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes b;
  put_be32(b, 0x00000803);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t p = 0; p < rows * cols; ++p) b.push_back(pixel(i, p));
  }
  return b;
}

// A label file (magic 0x801) holding these labels.
inline Bytes label_file(const Bytes& labels) {
  Bytes b;
  put_be32(b, 0x00000801);
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// Labels 0, 3, 6, 9, 2, ...: every class, in a known order.
inline Bytes labels_mod10(uint32_t count) {
  Bytes l(count);
  for (uint32_t i = 0; i < count; ++i) l[i] = static_cast<uint8_t>((i * 3) % 10);
  return l;
}

}  // namespace ringtrain::idx_files
