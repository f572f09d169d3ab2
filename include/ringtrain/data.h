// MNIST-format (IDX) data sets and the epoch sampler.
//
// Images stay as bytes (all of MNIST is 55 MB that way, four times less than as floats) and
// are normalised to [0, 1] per batch by make_batch. Loading is defensive: the file's own size
// bounds every allocation, so a header that lies can produce an error but never a huge
// allocation or a partial data set.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/tensor.h"

namespace ringtrain {

struct Dataset {
  std::vector<uint8_t> images;  // [count, rows, cols], row-major bytes
  std::vector<uint8_t> labels;  // [count]
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t image_size() const { return rows * cols; }
};

// Reads a file, gunzipping it when it starts with the gzip magic (whatever its name).
// At most max_bytes are accepted (a larger content is an error naming the file).
std::vector<uint8_t> read_maybe_gz(const std::string& path, uint64_t max_bytes);

// Reads an IDX image file (magic 0x00000803, 3 dims) and label file (0x00000801, 1 dim),
// plain or .gz, and checks them against each other. Throws ringtrain::Error naming the file
// and the problem: missing, wrong magic, wrong dimensions, truncated, more data than the
// header claims, label/image count mismatch, a label >= num_classes.
Dataset load_idx(const std::string& images_path, const std::string& labels_path,
                 int num_classes = 10);

// The in-memory halves of the two above, which they are built from (and which fuzz/ drives):
// decode_maybe_gz gunzips `bytes` when they start with the gzip magic and otherwise returns a
// copy, at most max_bytes either way; parse_idx checks and unpacks an (already gunzipped)
// image/label pair exactly as load_idx does, its errors naming `images_source` and
// `labels_source` where load_idx names the paths.
std::vector<uint8_t> decode_maybe_gz(std::span<const uint8_t> bytes, const std::string& source,
                                     uint64_t max_bytes);
Dataset parse_idx(std::span<const uint8_t> image_bytes, std::span<const uint8_t> label_bytes,
                  const std::string& images_source, const std::string& labels_source,
                  int num_classes = 10);

struct MnistData {
  Dataset train;
  Dataset test;
};
// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from a directory (the .gz or the
// plain name, whichever exists). Throws naming the directory and the missing file.
MnistData load_mnist_dir(const std::string& dir);

// The default data directory: $RINGTRAIN_DATA if set, else data/mnist if it holds the files,
// else the Debian package's /usr/share/datasets/fashion-mnist.
std::string default_data_dir();

// make_batch's pixel scale. Multiplying by this rounded reciprocal (not dividing by 255) is
// what every batch maker uses (make_batch, the GPU's gather_batch, the tests), so batches are
// bit-identical wherever they are made.
inline constexpr float kPixelScale = 1.0f / 255.0f;

// Fills images [B, rows, cols, 1] with the samples at `indices`, scaled to [0, 1], and
// labels with their labels. Reuses the tensors' storage when it is large enough.
void make_batch(const Dataset& data, std::span<const int64_t> indices, Tensor& images,
                std::vector<int32_t>& labels);

// The order of one epoch: a permutation of [0, size) that depends only on (seed, epoch), the
// same bits on every machine (its own generator, not std::shuffle's unspecified algorithm).
class EpochSampler {
 public:
  EpochSampler(int64_t size, uint64_t seed);
  // Reshuffles for `epoch` (a cheap no-op when it is the current one).
  std::span<const int64_t> order(int64_t epoch);
  int64_t size() const { return static_cast<int64_t>(order_.size()); }

 private:
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace ringtrain
