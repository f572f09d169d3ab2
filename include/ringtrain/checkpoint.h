// Checkpoints: everything a run needs to continue exactly where it stopped.
//
// File layout (little-endian), version 1:
//   bytes 0-7    magic "RTCKPT\r\n" (the CR LF catches text-mode transfers that rewrite it)
//   bytes 8-11   format version (uint32)
//   bytes 12-15  reserved, 0
//   bytes 16-23  payload length P (uint64): the file must be exactly 32 + P bytes
//   bytes 24..   payload: the fields of Checkpoint in declaration order; strings and arrays
//                are a uint64 length followed by the bytes / float32 values
//   last 8 bytes hash_bytes() (comm.h) of bytes [0, 24 + P)
// The reader checks the size against the header before it allocates, the checksum before it
// parses, and every length against the bytes left, so a corrupt or hostile file is an error
// naming the file, never a crash or a huge allocation.
//
// Only the chief writes (its replica is every rank's replica); the file goes to a temporary
// name, is flushed and fsync()ed, then renamed over, and the directory is fsync()ed, so a
// crash mid-write leaves the previous checkpoints intact.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/optim.h"

namespace ringtrain {

inline constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  // What it belongs to: resuming into another model is refused.
  std::string model;   // "mlp", "cnn"
  std::string layers;  // Model::signature(): the layer list with shapes
  int64_t num_params = 0;
  // Where training stands. The data order of an epoch is a function of (seed, epoch) alone
  // (EpochSampler), so (seed, epoch, step_in_epoch) is the sampler's whole state, and the
  // seed is the only random-number state a run has after initialisation.
  int64_t step = 0;           // steps completed; the next step has this index
  int64_t epoch = 0;          // epoch of the next step
  int64_t step_in_epoch = 0;  // the next step's position in its epoch
  uint64_t seed = 0;
  int64_t global_batch = 0;  // samples per step over all ranks
  int64_t ranks = 0;         // rank count of the run that wrote it
  // The learning-rate schedule as the run used it; its state is `step`.
  LrSchedule schedule;
  std::vector<float> params;
  // Optimizer: its kind, its step count (Adam's bias correction), its state buffers.
  std::string optimizer;
  int64_t optimizer_steps = 0;
  std::vector<std::vector<float>> optimizer_state;
  // Weight EMA (empty shadow when the run keeps none).
  float ema_decay = 0.0f;
  int64_t ema_updates = 0;
  std::vector<float> ema_shadow;
};

// The whole file's bytes.
std::vector<uint8_t> encode_checkpoint(const Checkpoint& checkpoint);
// Parses and verifies a whole file's bytes; throws ringtrain::Error (ExitCode::kBadInput)
// naming `source` and what is wrong: too short, bad magic, another version, a size that
// disagrees with the header, a checksum mismatch, a field running past the end.
Checkpoint decode_checkpoint(std::span<const uint8_t> bytes, const std::string& source);

// Reads a whole file (at most max_bytes; more is an error naming it).
std::vector<uint8_t> read_file_bytes(const std::string& path,
                                     uint64_t max_bytes = uint64_t{1} << 36);
// Writes bytes to path + ".tmp", fsync()s, renames over path, fsync()s the directory.
void write_file_atomically(const std::string& path, std::span<const uint8_t> bytes);

// The checkpoints of one run: <dir>/ckpt-<step, 10 digits>.rtckpt.
class CheckpointDir {
 public:
  explicit CheckpointDir(std::string dir, int keep = 3);
  const std::string& dir() const { return dir_; }
  // Creates the directory if needed and proves a file can be written there; throws naming
  // the directory (and --checkpoint-dir) otherwise.
  void ensure_writable() const;
  std::string path_for(int64_t step) const;
  // Writes a checkpoint and deletes the oldest beyond `keep`; returns the path written.
  std::string save(const Checkpoint& checkpoint) const;
  // The checkpoint files present, newest (highest step) first.
  std::vector<std::string> list() const;

  struct Loaded {
    std::string path;
    std::vector<uint8_t> bytes;  // the verified file, for broadcasting to the other ranks
    Checkpoint checkpoint;
  };
  // The newest checkpoint that decodes; each one skipped adds a line to `skipped` saying why.
  std::optional<Loaded> load_newest_valid(std::vector<std::string>& skipped) const;

 private:
  std::string dir_;
  int keep_;
};

}  // namespace ringtrain
