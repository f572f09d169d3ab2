// Writes the seed corpora of the two fuzz targets: make_seeds <dir> fills <dir>/idx and
// <dir>/checkpoint with small valid inputs in the layouts fuzz_idx.cpp and
// fuzz_checkpoint.cpp describe (IDX pairs plain and gzipped, gzip blobs, checkpoints made by
// encode_checkpoint itself, so they follow the format as the code writes it).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <zlib.h>

#include "ringtrain/checkpoint.h"
#include "support/idx_files.h"

namespace fs = std::filesystem;
using ringtrain::idx_files::Bytes;

namespace {

using ringtrain::idx_files::image_file;
using ringtrain::idx_files::put_be32;

void put_le32(Bytes& out, uint32_t v) {
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// Labels 0, 3, 6, 9, 2, ... (the data tests' files).
Bytes label_file(uint32_t count) {
  return ringtrain::idx_files::label_file(ringtrain::idx_files::labels_mod10(count));
}

Bytes gzip(const Bytes& plain) {
  z_stream zs{};
  if (deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    std::fprintf(stderr, "make_seeds: deflateInit2 failed\n");
    std::exit(1);
  }
  Bytes out(deflateBound(&zs, static_cast<uLong>(plain.size())) + 32);
  zs.next_in = const_cast<Bytef*>(plain.data());
  zs.avail_in = static_cast<uInt>(plain.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  if (deflate(&zs, Z_FINISH) != Z_STREAM_END) {
    std::fprintf(stderr, "make_seeds: deflate failed\n");
    std::exit(1);
  }
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// fuzz_idx's pair layout: mode, aux, the image file's length (LE), the image file, the labels.
Bytes pair(uint8_t mode, uint8_t aux, const Bytes& images, const Bytes& labels) {
  Bytes b = {mode, aux};
  put_le32(b, static_cast<uint32_t>(images.size()));
  b.insert(b.end(), images.begin(), images.end());
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

ringtrain::Checkpoint tiny_checkpoint(bool adam) {
  ringtrain::Checkpoint c;
  c.model = "mlp";
  c.layers = "dense(2x2)";
  c.num_params = 3;
  c.step = 7;
  c.epoch = 1;
  c.step_in_epoch = 2;
  c.seed = 42;
  c.global_batch = 4;
  c.ranks = 2;
  c.schedule.kind = adam ? "linear-warmup" : "exponential";
  c.schedule.staircase = !adam;
  c.schedule.warmup_steps = adam ? 5 : 0;
  c.schedule.global_batch = 4;
  c.schedule.reference_batch = 2;
  c.params = {0.5f, -1.0f, 2.0f};
  c.optimizer = adam ? "adam" : "sgd";
  c.optimizer_steps = 7;
  if (adam) {
    c.optimizer_state = {{0.1f, 0.2f, 0.3f}, {1.0f, 2.0f, 3.0f}};
    c.ema_decay = 0.999f;
    c.ema_updates = 7;
    c.ema_shadow = {0.4f, -0.9f, 1.9f};
  }
  return c;
}

void write(const fs::path& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <dir>\n");
    return 2;
  }
  const fs::path dir = argv[1];
  fs::create_directories(dir / "idx");
  fs::create_directories(dir / "checkpoint");

  // IDX: the MNIST shape (2 images of 28x28) and a tiny one, plain, gzipped and mixed.
  const Bytes mnist_i = image_file(2, 28, 28), mnist_l = label_file(2);
  const Bytes tiny_i = image_file(3, 2, 3), tiny_l = label_file(3);
  write(dir / "idx" / "pair-28x28-plain", pair(0, 0, mnist_i, mnist_l));
  write(dir / "idx" / "pair-28x28-gz", pair(1, 0, gzip(mnist_i), gzip(mnist_l)));
  write(dir / "idx" / "pair-2x3-plain", pair(0, 0, tiny_i, tiny_l));
  write(dir / "idx" / "pair-2x3-gz-images", pair(1, 0, gzip(tiny_i), tiny_l));
  write(dir / "idx" / "pair-2x3-gz-labels", pair(0, 0, tiny_i, gzip(tiny_l)));
  write(dir / "idx" / "pair-2x3-classes", pair(3, 10, tiny_i, tiny_l));
  write(dir / "idx" / "pair-2x3-gz-two-members",
        pair(1, 0,
             concat(gzip(Bytes(tiny_i.begin(), tiny_i.begin() + 10)),
                    gzip(Bytes(tiny_i.begin() + 10, tiny_i.end()))),
             tiny_l));
  write(dir / "idx" / "blob-gz", concat({2, 1}, gzip(tiny_i)));
  write(dir / "idx" / "blob-gz-two-members", concat({2, 0}, concat(gzip(tiny_l), gzip(tiny_i))));
  // The harness gzips these itself (mode bits 2-7): a pair, and blobs as 2 stored members and
  // as 3 members at level 9, the second one exactly at its cap of 64 bytes.
  write(dir / "idx" / "pair-2x3-harness-gz", pair(0x0c, 0, tiny_i, tiny_l));
  write(dir / "idx" / "pair-28x28-harness-gz-images", pair(0x04, 0, mnist_i, mnist_l));
  write(dir / "idx" / "blob-harness-gz-stored", concat({0x16, 0}, tiny_i));
  write(dir / "idx" / "blob-harness-gz-at-cap",
        concat({0xe6, 1}, Bytes(mnist_i.begin(), mnist_i.begin() + 64)));

  // Checkpoints, each in fuzz_checkpoint's three modes: the whole file; header + payload (the
  // harness adds the checksum); the payload alone (the harness adds header and checksum).
  for (bool adam : {false, true}) {
    const Bytes file = ringtrain::encode_checkpoint(tiny_checkpoint(adam));
    const std::string name = adam ? "adam-ema" : "sgd";
    write(dir / "checkpoint" / (name + "-file"), concat({0}, file));
    write(dir / "checkpoint" / (name + "-unsummed"),
          concat({1}, Bytes(file.begin(), file.end() - 8)));
    write(dir / "checkpoint" / (name + "-payload"),
          concat({2}, Bytes(file.begin() + 24, file.end() - 8)));
  }
  return 0;
}
