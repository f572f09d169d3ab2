// Checkpoint encoding and verification, and the checkpoint directory (see checkpoint.h).
//
// Every file this code creates starts life under a fresh name, "<dir>/.<final name>.tmp-XXXXXX",
// opened with O_CREAT | O_EXCL | O_NOFOLLOW, so a file or link planted in the directory is
// never opened for writing. The temporary is written in chunks, fsync()ed, then given its
// final name: a checkpoint with renameat2(RENAME_NOREPLACE) (link + unlink where the
// filesystem refuses that flag), so an existing checkpoint is never replaced; any other file
// (write_file_atomically) with rename(), which replaces a link itself. Readers of the directory
// look with lstat and open with O_NOFOLLOW: only regular files named for a step are
// checkpoints. Rotation re-reads the older checkpoints to verify them (a few MB each), so
// that only valid ones count toward `keep` and only valid ones are ever deleted.
#include "ringtrain/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "ringtrain/check.h"
#include "ringtrain/comm.h"

namespace ringtrain {

static_assert(std::endian::native == std::endian::little,
              "the checkpoint format is little-endian; add byte swapping for big-endian hosts");

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'R', 'T', 'C', 'K', 'P', 'T', '\r', '\n'};
constexpr size_t kHeaderBytes = 24;  // magic, version, reserved, payload length
constexpr size_t kTrailerBytes = 8;  // checksum
constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".rtckpt";
constexpr const char* kProbeName = "ringtrain-write-probe";
constexpr const char* kTemporaryMarker = ".tmp-";  // ".<name>.tmp-XXXXXX"
constexpr size_t kTemporaryRandom = 6;
constexpr const char kTemporaryAlphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
constexpr size_t kChunkBytes = size_t{16} << 20;  // progress is reported after each chunk

[[noreturn]] void bad_file(const std::string& source, const std::string& why) {
  throw Error(fmt::format("checkpoint {}: {}", source, why), ExitCode::kBadInput);
}

class Writer {
 public:
  template <typename T>
  void scalar(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void string(const std::string& text) {
    scalar<uint64_t>(text.size());
    bytes_.insert(bytes_.end(), text.begin(), text.end());
  }
  void floats(std::span<const float> values) {
    scalar<uint64_t>(values.size());
    const auto* p = reinterpret_cast<const uint8_t*>(values.data());
    bytes_.insert(bytes_.end(), p, p + values.size_bytes());
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Every read checks the bytes left first; a length field is compared with what remains
// before anything is allocated for it.
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, const std::string& source)
      : bytes_(bytes), source_(source) {}
  template <typename T>
  T scalar(const char* field) {
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  std::string string(const char* field) {
    const auto length = scalar<uint64_t>(field);
    need(length, field);
    std::string text(reinterpret_cast<const char*>(bytes_.data() + offset_), length);
    offset_ += length;
    return text;
  }
  std::vector<float> floats(const char* field) {
    const auto count = scalar<uint64_t>(field);
    if (count > remaining() / sizeof(float))
      bad_file(source_, fmt::format("field '{}' claims {} values but only {} bytes remain", field,
                                    count, remaining()));
    std::vector<float> values(count);
    // An empty vector's data() may be null, which memcpy must never get, even for 0 bytes.
    if (count != 0) std::memcpy(values.data(), bytes_.data() + offset_, count * sizeof(float));
    offset_ += count * sizeof(float);
    return values;
  }
  size_t remaining() const { return bytes_.size() - offset_; }

 private:
  void need(uint64_t count, const char* field) const {
    if (count > remaining())
      bad_file(source_, fmt::format("field '{}' runs past the end ({} bytes needed, {} remain)",
                                    field, count, remaining()));
  }
  std::span<const uint8_t> bytes_;
  const std::string& source_;
  size_t offset_ = 0;
};

// The step in "ckpt-0000000042.rtckpt" (exactly the name path_for gives it), or -1 for any
// other name: "ckpt-42.rtckpt" would be a second name for the same step.
int64_t step_of(const std::string& name) {
  const std::string prefix = kPrefix, suffix = kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix))
    return -1;
  const char* begin = name.data() + prefix.size();
  const char* end = name.data() + name.size() - suffix.size();
  int64_t step = -1;
  const auto [ptr, error] = std::from_chars(begin, end, step);
  if (error != std::errc() || ptr != end || step < 0) return -1;
  return fmt::format("{:010d}", step) == std::string_view(begin, end) ? step : -1;
}

// ".ckpt-0000000042.rtckpt.tmp-Ab3xQ9" or ".ringtrain-write-probe.tmp-Ab3xQ9": what this code
// names its temporaries in a checkpoint directory.
bool is_own_temporary(const std::string& name) {
  const size_t tail = std::strlen(kTemporaryMarker) + kTemporaryRandom;
  if (name.size() <= 1 + tail || name[0] != '.') return false;
  const std::string_view marker(name.data() + name.size() - tail, std::strlen(kTemporaryMarker));
  if (marker != kTemporaryMarker) return false;
  for (size_t i = name.size() - kTemporaryRandom; i < name.size(); ++i) {
    if (std::strchr(kTemporaryAlphabet, name[i]) == nullptr || name[i] == '\0') return false;
  }
  const std::string final_name = name.substr(1, name.size() - 1 - tail);
  return final_name == kProbeName || step_of(final_name) >= 0;
}

std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// "<dir>/.<name>.tmp-XXXXXX" with six random letters or digits.
std::string temporary_name(const std::string& final_path) {
  const fs::path path(final_path);
  std::random_device random;
  std::uniform_int_distribution<size_t> pick(0, sizeof(kTemporaryAlphabet) - 2);
  std::string name = fmt::format(".{}{}", path.filename().string(), kTemporaryMarker);
  for (size_t i = 0; i < kTemporaryRandom; ++i) name += kTemporaryAlphabet[pick(random)];
  return (fs::path(parent_of(final_path)) / name).string();
}

// A temporary created for final_path: closed, and unlinked unless release()d, on every way
// out, an exception from a hook included.
class Temporary {
 public:
  // Creates a fresh one, never opening an existing name; false (errno set) when it cannot.
  bool create(const std::string& final_path) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      path_ = temporary_name(final_path);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd_ >= 0) return true;
      if (errno != EEXIST) break;
    }
    path_.clear();
    return false;
  }
  Temporary() = default;
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;
  ~Temporary() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  // Writes all of bytes (at most kChunkBytes per write call); with `chunk_done`, each chunk is
  // also pushed to the disk before chunk_done is called, so that the progress it reports is the
  // disk's, not the page cache's (the final fsync then has little left). 0 or errno.
  int write(std::span<const uint8_t> bytes, const std::function<void()>& chunk_done) {
    size_t written = 0;
    while (written < bytes.size()) {
      const size_t chunk_start = written;
      const size_t chunk_end = std::min(bytes.size(), written + kChunkBytes);
      while (written < chunk_end) {
        const ssize_t n = ::write(fd_, bytes.data() + written, chunk_end - written);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        written += static_cast<size_t>(n);
      }
      if (chunk_done) {
        // Best effort: a filesystem without it leaves the work to fsync().
        ::sync_file_range(
            fd_, static_cast<off64_t>(written_before_ + chunk_start),
            static_cast<off64_t>(chunk_end - chunk_start),
            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        chunk_done();
      }
    }
    written_before_ += bytes.size();
    return 0;
  }
  // fsync() and close; 0 or errno.
  int sync_and_close() {
    int error = ::fsync(fd_) == 0 ? 0 : errno;
    if (::close(fd_) != 0 && error == 0) error = errno;
    fd_ = -1;
    return error;
  }
  void release() { path_.clear(); }  // it has been renamed: nothing to unlink

 private:
  int fd_ = -1;
  std::string path_;
  size_t written_before_ = 0;  // the file offset where the next write() call starts
};

[[noreturn]] void fail_write(const std::string& tmp, const std::string& path, int error) {
  RINGTRAIN_FAIL("writing {} failed: {} (disk full?); {} is unchanged", tmp, std::strerror(error),
                 path);
}

enum class Placement { kPlaced, kTaken };

// Gives `from` the name `to` unless `to` exists (as anything): never replaces it.
Placement place_without_replacing(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0)
    return Placement::kPlaced;
  int error = errno;
  if (error == EEXIST) return Placement::kTaken;
  if (error == EINVAL || error == ENOSYS) {
    // The filesystem refuses the flag (NFS, some FUSE): link() refuses an existing name too.
    if (::link(from.c_str(), to.c_str()) == 0) {
      ::unlink(from.c_str());
      return Placement::kPlaced;
    }
    error = errno;
    if (error == EEXIST) return Placement::kTaken;
  }
  RINGTRAIN_FAIL(
      "cannot rename {} to {} without replacing an existing file (renameat2 "
      "RENAME_NOREPLACE, or link): {}",
      from, to, std::strerror(error));
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort for filesystems that refuse to open directories
  ::fsync(fd);
  ::close(fd);
}

// A whole regular file; follow_links false: a symbolic link is an error, never read through.
std::vector<uint8_t> read_regular_file(const std::string& path, uint64_t max_bytes,
                                       bool follow_links) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_links ? 0 : O_NOFOLLOW);
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    const int error = errno;
    struct stat entry {};
    if (!follow_links && error == ELOOP && ::lstat(path.c_str(), &entry) == 0 &&
        S_ISLNK(entry.st_mode))
      bad_file(path, "is a symbolic link; it is not followed");
    bad_file(path, fmt::format("cannot open: {}", std::strerror(error)));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    bad_file(path, "not a regular file");
  }
  if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    ::close(fd);
    bad_file(path, fmt::format("larger than {} bytes", max_bytes));
  }
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(info.st_size));
  uint8_t chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof(chunk));
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      bad_file(path, fmt::format("read failed: {}", std::strerror(error)));
    }
    if (got == 0) break;
    if (bytes.size() + static_cast<uint64_t>(got) > max_bytes) {
      ::close(fd);
      bad_file(path, fmt::format("larger than {} bytes", max_bytes));
    }
    bytes.insert(bytes.end(), chunk, chunk + got);
  }
  ::close(fd);
  return bytes;
}

// Whether path is a regular file (not a link to one) holding exactly `bytes`.
bool holds_exactly(const std::string& path, std::span<const uint8_t> bytes) {
  try {
    const std::vector<uint8_t> present = read_regular_file(path, bytes.size(), false);
    return std::equal(present.begin(), present.end(), bytes.begin(), bytes.end());
  } catch (const Error&) {
    return false;
  }
}

// The first NaN or Inf in the state buffers, as "params[12] (nan)", or empty when all are
// finite.
std::string first_non_finite(const Checkpoint& c) {
  const auto scan = [](std::span<const float> values, const std::string& name) -> std::string {
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) return fmt::format("{}[{}] ({})", name, i, values[i]);
    }
    return {};
  };
  std::string bad = scan(c.params, "params");
  for (size_t b = 0; bad.empty() && b < c.optimizer_state.size(); ++b)
    bad = scan(c.optimizer_state[b], fmt::format("optimizer_state[{}]", b));
  if (bad.empty()) bad = scan(c.ema_shadow, "ema_shadow");
  return bad;
}

// The checkpoint files of a directory: regular files (lstat) with a checkpoint name, newest
// first.
std::vector<std::pair<int64_t, std::string>> checkpoint_files(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const int64_t step = step_of(it->path().filename().string());
    std::error_code ignored;
    if (step >= 0 && fs::is_regular_file(it->symlink_status(ignored)))
      found.emplace_back(step, it->path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  return found;
}

// Reads and verifies the checkpoint file named for `step`: it must decode and hold that step.
Checkpoint load_entry(const std::string& path, int64_t step, std::vector<uint8_t>& bytes) {
  bytes = read_regular_file(path, uint64_t{1} << 36, /*follow_links=*/false);
  Checkpoint c = decode_checkpoint(bytes, path);
  if (c.step != step)
    bad_file(path, fmt::format("holds step {}, but its name says step {} (renamed or copied by "
                               "hand?)",
                               c.step, step));
  return c;
}

}  // namespace

std::vector<uint8_t> encode_checkpoint(const Checkpoint& c) {
  if (const std::string bad = first_non_finite(c); !bad.empty()) {
    throw Error(fmt::format("checkpoint at step {}: {} is not finite: the run has diverged, so "
                            "no checkpoint was written",
                            c.step, bad),
                ExitCode::kNonFinite);
  }
  Writer w;
  w.bytes().insert(w.bytes().end(), std::begin(kMagic), std::end(kMagic));
  w.scalar<uint32_t>(kCheckpointVersion);
  w.scalar<uint32_t>(0);
  w.scalar<uint64_t>(0);  // payload length, patched below
  w.string(c.model);
  w.string(c.layers);
  w.scalar<int64_t>(c.num_params);
  w.scalar<int64_t>(c.step);
  w.scalar<int64_t>(c.epoch);
  w.scalar<int64_t>(c.step_in_epoch);
  w.scalar<uint64_t>(c.seed);
  w.scalar<int64_t>(c.global_batch);
  w.scalar<int64_t>(c.ranks);
  w.scalar<int64_t>(c.micro_batch);
  const LrSchedule& s = c.schedule;
  w.string(s.kind);
  w.scalar<float>(s.base_lr);
  w.scalar<float>(s.decay_rate);
  w.scalar<double>(s.decay_steps);
  w.scalar<uint8_t>(s.staircase ? 1 : 0);
  w.scalar<int64_t>(s.warmup_steps);
  w.scalar<int64_t>(s.global_batch);
  w.scalar<int64_t>(s.reference_batch);
  w.floats(c.params);
  w.string(c.optimizer);
  w.scalar<int64_t>(c.optimizer_steps);
  w.scalar<uint64_t>(c.optimizer_state.size());
  for (const auto& buffer : c.optimizer_state) w.floats(buffer);
  w.scalar<float>(c.ema_decay);
  w.scalar<int64_t>(c.ema_updates);
  w.floats(c.ema_shadow);
  std::vector<uint8_t>& bytes = w.bytes();
  const uint64_t payload = bytes.size() - kHeaderBytes;
  std::memcpy(bytes.data() + 16, &payload, sizeof(payload));
  const uint64_t checksum = hash_bytes(bytes.data(), bytes.size());
  w.scalar<uint64_t>(checksum);
  return std::move(bytes);
}

Checkpoint decode_checkpoint(std::span<const uint8_t> bytes, const std::string& source) {
  if (bytes.size() < kHeaderBytes + kTrailerBytes)
    bad_file(source, fmt::format("only {} bytes: truncated, or not a checkpoint", bytes.size()));
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    bad_file(source, "not a ringtrain checkpoint (no RTCKPT magic)");
  uint32_t version = 0;
  uint64_t payload = 0;
  std::memcpy(&version, bytes.data() + 8, sizeof(version));
  std::memcpy(&payload, bytes.data() + 16, sizeof(payload));
  if (version < kOldestCheckpointVersion || version > kCheckpointVersion)
    bad_file(source, fmt::format("format version {}, but this build reads versions {} to {}",
                                 version, kOldestCheckpointVersion, kCheckpointVersion));
  const uint64_t body = bytes.size() - kHeaderBytes - kTrailerBytes;
  if (payload != body)
    bad_file(source, fmt::format("the header says {} payload bytes but the file holds {}: {}",
                                 payload, body, payload > body ? "truncated" : "trailing bytes"));
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - kTrailerBytes, sizeof(stored));
  const uint64_t computed = hash_bytes(bytes.data(), bytes.size() - kTrailerBytes);
  if (stored != computed)
    bad_file(source, fmt::format("checksum mismatch (stored {:016x}, computed {:016x}): the file "
                                 "is corrupt",
                                 stored, computed));

  Reader r(bytes.subspan(kHeaderBytes, payload), source);
  Checkpoint c;
  c.model = r.string("model");
  c.layers = r.string("layers");
  c.num_params = r.scalar<int64_t>("num_params");
  c.step = r.scalar<int64_t>("step");
  c.epoch = r.scalar<int64_t>("epoch");
  c.step_in_epoch = r.scalar<int64_t>("step_in_epoch");
  c.seed = r.scalar<uint64_t>("seed");
  c.global_batch = r.scalar<int64_t>("global_batch");
  c.ranks = r.scalar<int64_t>("ranks");
  if (version >= 2) c.micro_batch = r.scalar<int64_t>("micro_batch");
  LrSchedule& s = c.schedule;
  s.kind = r.string("schedule.kind");
  s.base_lr = r.scalar<float>("schedule.base_lr");
  s.decay_rate = r.scalar<float>("schedule.decay_rate");
  s.decay_steps = r.scalar<double>("schedule.decay_steps");
  s.staircase = r.scalar<uint8_t>("schedule.staircase") != 0;
  s.warmup_steps = r.scalar<int64_t>("schedule.warmup_steps");
  s.global_batch = r.scalar<int64_t>("schedule.global_batch");
  s.reference_batch = r.scalar<int64_t>("schedule.reference_batch");
  c.params = r.floats("params");
  c.optimizer = r.string("optimizer");
  c.optimizer_steps = r.scalar<int64_t>("optimizer_steps");
  const auto buffers = r.scalar<uint64_t>("optimizer_state count");
  // Each buffer needs at least its 8-byte length: a bound that holds before allocating.
  if (buffers > r.remaining() / sizeof(uint64_t))
    bad_file(source,
             fmt::format("claims {} optimizer buffers in {} bytes", buffers, r.remaining()));
  c.optimizer_state.reserve(buffers);
  for (uint64_t i = 0; i < buffers; ++i) c.optimizer_state.push_back(r.floats("optimizer_state"));
  c.ema_decay = r.scalar<float>("ema_decay");
  c.ema_updates = r.scalar<int64_t>("ema_updates");
  c.ema_shadow = r.floats("ema_shadow");
  if (r.remaining() != 0)
    bad_file(source, fmt::format("{} unexplained bytes after the last field", r.remaining()));

  // Internal consistency: sizes that must agree with each other.
  const auto n = static_cast<uint64_t>(c.num_params);
  if (c.num_params < 0 || c.params.size() != n)
    bad_file(source,
             fmt::format("holds {} parameters but declares {}", c.params.size(), c.num_params));
  for (const auto& buffer : c.optimizer_state) {
    if (buffer.size() != n)
      bad_file(source, fmt::format("an optimizer buffer holds {} values for {} parameters",
                                   buffer.size(), c.num_params));
  }
  if (!c.ema_shadow.empty() && c.ema_shadow.size() != n)
    bad_file(source, fmt::format("the EMA shadow holds {} values for {} parameters",
                                 c.ema_shadow.size(), c.num_params));
  if (c.step < 0 || c.epoch < 0 || c.step_in_epoch < 0 || c.global_batch <= 0 || c.ranks <= 0 ||
      c.micro_batch < 0 || c.optimizer_steps < 0 || c.ema_updates < 0)
    bad_file(source, "a step, epoch, batch or rank count is negative");
  if (const std::string bad = first_non_finite(c); !bad.empty())
    bad_file(source, fmt::format("{} is not finite: the run that wrote it had diverged", bad));
  return c;
}

std::vector<uint8_t> read_file_bytes(const std::string& path, uint64_t max_bytes) {
  return read_regular_file(path, max_bytes, /*follow_links=*/true);
}

void write_file_atomically(const std::string& path, std::span<const uint8_t> bytes,
                           const std::function<void()>& progress) {
  Temporary tmp;
  RINGTRAIN_CHECK(tmp.create(path), "cannot create a temporary file for {} in {}: {}", path,
                  parent_of(path), std::strerror(errno));
  int error = tmp.write(bytes, progress);
  if (error == 0) error = tmp.sync_and_close();
  if (error != 0) fail_write(tmp.path(), path, error);
  // rename() replaces whatever path is (a link included) without writing through it.
  if (::rename(tmp.path().c_str(), path.c_str()) != 0)
    RINGTRAIN_FAIL("cannot rename {} to {}: {}", tmp.path(), path, std::strerror(errno));
  tmp.release();
  fsync_directory(parent_of(path));  // the rename is durable once the directory is on disk
}

CheckpointDir::CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  RINGTRAIN_CHECK(!dir_.empty(), "--checkpoint-dir must not be empty");
  RINGTRAIN_CHECK(keep_ >= 1, "--keep-checkpoints must be at least 1, got {}", keep_);
}

void CheckpointDir::ensure_writable() const {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error || !fs::is_directory(dir_)) {
    throw Error(fmt::format("--checkpoint-dir {}: cannot create the directory: {}", dir_,
                            error ? error.message() : "a file of that name exists"),
                ExitCode::kBadInput);
  }
  // Permissions alone do not tell (root ignores them; read-only mounts do not show in the
  // mode bits): write a probe as a checkpoint is written, and place it under a second fresh
  // name the way a checkpoint is placed (the filesystem must support that), then remove it.
  const auto refuse = [&](const std::string& why) {
    throw Error(fmt::format("--checkpoint-dir {}: cannot write there: {}; choose a writable "
                            "directory",
                            dir_, why),
                ExitCode::kBadInput);
  };
  const std::string probe_name = (fs::path(dir_) / kProbeName).string();
  Temporary probe;
  if (!probe.create(probe_name)) refuse(std::strerror(errno));
  static constexpr uint8_t kOk[2] = {'o', 'k'};
  int write_error = probe.write(kOk, {});
  if (write_error == 0) write_error = probe.sync_and_close();
  if (write_error != 0) refuse(std::strerror(write_error));
  const std::string placed = temporary_name(probe_name);
  try {
    if (place_without_replacing(probe.path(), placed) == Placement::kPlaced) {
      probe.release();
      ::unlink(placed.c_str());
    }
  } catch (const Error& failure) {
    refuse(failure.what());
  }
}

std::string CheckpointDir::path_for(int64_t step) const {
  return (fs::path(dir_) / fmt::format("{}{:010d}{}", kPrefix, step, kSuffix)).string();
}

std::string CheckpointDir::save(const Checkpoint& checkpoint) const {
  const std::string path = path_for(checkpoint.step);
  const std::vector<uint8_t> bytes = encode_checkpoint(checkpoint);  // refuses NaN/Inf first
  const std::span<const uint8_t> all(bytes);
  {
    Temporary tmp;
    RINGTRAIN_CHECK(tmp.create(path), "cannot create a temporary file for {} in {}: {}", path, dir_,
                    std::strerror(errno));
    const size_t half = bytes.size() / 2;
    int error = tmp.write(all.first(half), progress_);
    if (error == 0) fault("partial");
    if (error == 0) error = tmp.write(all.subspan(half), progress_);
    if (error == 0) error = tmp.sync_and_close();
    if (error != 0) fail_write(tmp.path(), path, error);
    fault("written");
    if (place_without_replacing(tmp.path(), path) == Placement::kPlaced) {
      tmp.release();
      fault("placed");
      fsync_directory(dir_);
    } else if (!holds_exactly(path, bytes)) {
      // The temporary goes with `tmp`; the existing file is not touched.
      throw Error(fmt::format("checkpoint {} already exists and holds a different state for "
                              "step {} (another run writes to this directory?); it was left "
                              "untouched and this checkpoint was not written",
                              path, checkpoint.step),
                  ExitCode::kBadInput);
    }  // else: the same bytes are already there (a rewrite of the same step); `tmp` goes
  }

  // Rotation, newest first. Only checkpoints that verify count toward keep_; this one counts
  // without being re-read. A valid one is deleted only when it is older than this one and
  // than keep_ kept ones; one that does not verify is left alone.
  int kept = 0;
  bool passed_this_one = false, deleted_any = false;
  for (const auto& [step, file] : checkpoint_files(dir_)) {
    if (step == checkpoint.step) {
      passed_this_one = true;
      ++kept;
      continue;
    }
    try {
      std::vector<uint8_t> ignored;
      load_entry(file, step, ignored);
      if (progress_) progress_();  // verifying a big directory takes a while too
    } catch (const Error&) {
      continue;
    }
    if (!passed_this_one || kept < keep_) {
      ++kept;
      continue;
    }
    if (::unlink(file.c_str()) == 0 && !deleted_any) {
      deleted_any = true;
      fault("rotating");
    }
    // A file someone else removed first is no reason to stop training.
  }
  if (deleted_any) fsync_directory(dir_);
  return path;
}

std::vector<std::string> CheckpointDir::list() const {
  std::vector<std::string> paths;
  for (auto& [step, path] : checkpoint_files(dir_)) paths.push_back(std::move(path));
  return paths;
}

std::vector<std::string> CheckpointDir::later_than(int64_t step) const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    const int64_t named = step_of(it->path().filename().string());
    if (named > step) found.emplace_back(named, it->path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> paths;
  for (auto& [named, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::string CheckpointDir::set_aside(const std::string& path) const {
  for (int n = 1; n <= 1000; ++n) {
    const std::string target = n == 1 ? path + ".damaged" : fmt::format("{}.damaged-{}", path, n);
    if (place_without_replacing(path, target) == Placement::kPlaced) {
      fsync_directory(parent_of(path));
      return target;
    }
  }
  RINGTRAIN_FAIL("cannot set {} aside: {}.damaged and its next 999 alternatives are all taken",
                 path, path);
}

std::vector<std::string> CheckpointDir::remove_stale_temporaries() const {
  std::vector<std::string> removed;
  std::error_code error;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    const std::string path = it->path().string();
    if (is_own_temporary(it->path().filename().string()) && ::unlink(path.c_str()) == 0)
      removed.push_back(path);
  }
  if (!removed.empty()) fsync_directory(dir_);
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::optional<CheckpointDir::Loaded> CheckpointDir::load_newest_valid(
    std::vector<std::string>& skipped) const {
  for (auto& [step, path] : checkpoint_files(dir_)) {
    try {
      Loaded loaded;
      loaded.checkpoint = load_entry(path, step, loaded.bytes);
      loaded.path = std::move(path);
      return loaded;
    } catch (const Error& error) {
      skipped.push_back(error.what());
    }
  }
  return std::nullopt;
}

}  // namespace ringtrain
