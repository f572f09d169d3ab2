// Checkpoints: everything a run needs to continue exactly where it stopped.
//
// File layout (little-endian), version 2 (version 1, which lacks micro_batch, is still read):
//   bytes 0-7    magic "RTCKPT\r\n" (the CR LF catches text-mode transfers that rewrite it)
//   bytes 8-11   format version (uint32)
//   bytes 12-15  reserved, 0
//   bytes 16-23  payload length P (uint64): the file must be exactly 32 + P bytes
//   bytes 24..   payload: the fields of Checkpoint in declaration order; strings and arrays
//                are a uint64 length followed by the bytes / float32 values
//   last 8 bytes hash_bytes() (comm.h) of bytes [0, 24 + P)
// The reader checks the size against the header before it allocates, the checksum before it
// parses, and every length against the bytes left, so a corrupt or hostile file is an error
// naming the file, never a crash or a huge allocation. A checkpoint never holds NaN or Inf:
// the writer refuses such state and the reader rejects it.
//
// Only the chief writes (its replica is every rank's replica). The one invariant of a
// checkpoint directory: a file named for step k holds a valid checkpoint of step k, or it is
// not there at all. So a checkpoint is written under a fresh temporary name (created with
// O_EXCL | O_NOFOLLOW: nothing planted in the directory is ever written through), fsync()ed,
// then given its final name without replacing anything (renameat2 RENAME_NOREPLACE, or link +
// unlink), and the directory is fsync()ed. A crash at any point leaves the previous
// checkpoints intact and at worst a temporary, which remove_stale_temporaries() clears.
// Rotation deletes only checkpoints that verify and are older than the `keep` newest that
// verify; a file that does not verify, a symbolic link or anything else is left alone.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/optim.h"

namespace ringtrain {

inline constexpr uint32_t kCheckpointVersion = 2;
// The oldest version decode_checkpoint() still reads: a checkpoint saved by an earlier build
// keeps its worth.
inline constexpr uint32_t kOldestCheckpointVersion = 1;

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
  // --reproducible's --micro-batch, 0 for the default mode (and in a version 1 file): a
  // resume must keep it for the uninterrupted run's bits.
  int64_t micro_batch = 0;
  // The learning-rate schedule as the run used it; its state is `step`.
  LrSchedule schedule;
  std::vector<float> params;  // [num_params]
  // Optimizer: its kind, its step count (Adam's bias correction), its state buffers.
  std::string optimizer;
  int64_t optimizer_steps = 0;
  std::vector<std::vector<float>> optimizer_state;  // each [num_params]
  // Weight EMA (empty shadow when the run keeps none).
  float ema_decay = 0.0f;
  int64_t ema_updates = 0;
  std::vector<float> ema_shadow;  // [num_params] or empty
};

// The whole file's bytes. Throws ringtrain::Error (ExitCode::kNonFinite) naming the first NaN
// or Inf in the parameters, the optimizer state or the EMA shadow: a diverged run's state is
// never written.
std::vector<uint8_t> encode_checkpoint(const Checkpoint& checkpoint);
// Parses and verifies a whole file's bytes; throws ringtrain::Error (ExitCode::kBadInput)
// naming `source` and what is wrong: too short, bad magic, another version, a size that
// disagrees with the header, a checksum mismatch, a field running past the end, a NaN or Inf
// in the state (the run that wrote it had diverged).
Checkpoint decode_checkpoint(std::span<const uint8_t> bytes, const std::string& source);

// Reads a whole regular file the caller named (a symbolic link to one is followed; a FIFO or
// device is refused), at most max_bytes; throws naming it otherwise.
std::vector<uint8_t> read_file_bytes(const std::string& path,
                                     uint64_t max_bytes = uint64_t{1} << 36);
// Replaces path with exactly these bytes, or leaves it as it was: writes a fresh temporary
// "<dir>/.<name>.tmp-XXXXXX" (O_EXCL | O_NOFOLLOW), fsync()s it, renames it over path (a
// symbolic link at path is replaced, never written through) and fsync()s the directory.
// `progress`, when given, is called after each chunk (at most 16 MiB) reaches the disk.
void write_file_atomically(const std::string& path, std::span<const uint8_t> bytes,
                           const std::function<void()>& progress = {});

// The checkpoints of one run: <dir>/ckpt-<step, 10 digits>.rtckpt. Only regular files with
// exactly that name count as checkpoints; "<name>.damaged", temporaries, symbolic links and
// other entries are never read and never deleted by rotation.
class CheckpointDir {
 public:
  explicit CheckpointDir(std::string dir, int keep = 3);
  const std::string& dir() const { return dir_; }
  // Creates the directory if needed and proves a file can be written there; throws naming
  // the directory (and --checkpoint-dir) otherwise.
  void ensure_writable() const;
  std::string path_for(int64_t step) const;
  // Writes a checkpoint under path_for(checkpoint.step), then rotates: of the checkpoints
  // that verify (this one counts without being re-read), the `keep` newest are kept, and
  // valid ones older than those and than this one are deleted. Returns the path written.
  // Throws kNonFinite (nothing written) for NaN/Inf state; throws kBadInput, leaving the file
  // untouched, when that name already holds other bytes (rewriting identical bytes succeeds).
  std::string save(const Checkpoint& checkpoint) const;
  // The checkpoint files present (regular files, checked with lstat), newest first.
  std::vector<std::string> list() const;
  // Every entry with a checkpoint name (of any type, valid or not) whose step is greater than
  // `step`, newest first: what a run resumed at `step` must refuse or set aside, since it would
  // collide with the names it is about to write.
  std::vector<std::string> later_than(int64_t step) const;
  // Renames path to "<path>.damaged" (or ".damaged-2", ... when taken), never replacing
  // anything; returns the new path. The bytes stay for inspection; the name no longer claims a
  // step, so list() and rotation ignore it. Throws naming the file when it cannot.
  std::string set_aside(const std::string& path) const;
  // Unlinks the temporaries this code leaves when a writer dies mid-save
  // (".ckpt-<step>.rtckpt.tmp-XXXXXX", ".ringtrain-write-probe.tmp-XXXXXX"), whatever their
  // type (unlink never follows a link); returns their paths. Only for the chief at start:
  // another process writing this directory at the same time would lose its temporary.
  std::vector<std::string> remove_stale_temporaries() const;

  // Called with "partial" (about half the bytes written to the temporary, before its fsync),
  // "written" (after its fsync, before placing), "placed" (after placing, before the
  // directory's fsync) and "rotating" (after the first deletion of an old checkpoint, if any):
  // the crash-consistency tests end the process there. Nothing is called when unset.
  void set_fault_hook(std::function<void(const char* point)> hook) {
    fault_hook_ = std::move(hook);
  }
  // Called after each chunk (at most 16 MiB) of a checkpoint is written, so that a watchdog
  // sees a long write moving.
  void set_progress(std::function<void()> progress) { progress_ = std::move(progress); }

  struct Loaded {
    std::string path;
    std::vector<uint8_t> bytes;  // the verified file, for broadcasting to the other ranks
    Checkpoint checkpoint;
  };
  // The newest checkpoint that decodes and holds the step its name says; each one skipped
  // adds a line to `skipped` saying why.
  std::optional<Loaded> load_newest_valid(std::vector<std::string>& skipped) const;

 private:
  void fault(const char* point) const {
    if (fault_hook_) fault_hook_(point);
  }
  std::string dir_;
  int keep_;
  std::function<void(const char*)> fault_hook_;
  std::function<void()> progress_;
};

}  // namespace ringtrain
