// Checkpoint encoding, verification and the checkpoint directory (see checkpoint.h).
#include "ringtrain/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

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

// The step in "ckpt-0000000042.rtckpt", or -1 for any other name.
int64_t step_of(const std::string& name) {
  const std::string prefix = kPrefix, suffix = kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix))
    return -1;
  const char* begin = name.data() + prefix.size();
  const char* end = name.data() + name.size() - suffix.size();
  int64_t step = -1;
  const auto [ptr, error] = std::from_chars(begin, end, step);
  return error == std::errc() && ptr == end ? step : -1;
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;  // best effort for directories on filesystems that refuse O_RDONLY dirs
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::vector<uint8_t> encode_checkpoint(const Checkpoint& c) {
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
  if (version != kCheckpointVersion)
    bad_file(source, fmt::format("format version {}, but this build reads version {}", version,
                                 kCheckpointVersion));
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
      c.optimizer_steps < 0 || c.ema_updates < 0)
    bad_file(source, "a step, epoch, batch or rank count is negative");
  return c;
}

std::vector<uint8_t> read_file_bytes(const std::string& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad_file(path, fmt::format("cannot open: {}", std::strerror(errno)));
  std::vector<uint8_t> bytes;
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

void write_file_atomically(const std::string& path, std::span<const uint8_t> bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  RINGTRAIN_CHECK(fd >= 0, "cannot create {}: {}", tmp, std::strerror(errno));
  size_t written = 0;
  int error = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = errno;
      break;
    }
    written += static_cast<size_t>(n);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    ::unlink(tmp.c_str());
    RINGTRAIN_FAIL("writing {} failed: {} (disk full?); {} is unchanged", tmp, std::strerror(error),
                   path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    error = errno;
    ::unlink(tmp.c_str());
    RINGTRAIN_FAIL("cannot rename {} to {}: {}", tmp, path, std::strerror(error));
  }
  // The rename itself is only durable once the directory entry is on disk.
  fsync_path(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string(),
             O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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
  // mode bits): write and remove a probe file.
  const std::string probe = (fs::path(dir_) / ".ringtrain-write-probe").string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, "ok", 2) != 2) {
    const int why = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(probe.c_str());
    throw Error(fmt::format("--checkpoint-dir {}: cannot write there: {}; choose a writable "
                            "directory",
                            dir_, std::strerror(why)),
                ExitCode::kBadInput);
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string CheckpointDir::path_for(int64_t step) const {
  return (fs::path(dir_) / fmt::format("{}{:010d}{}", kPrefix, step, kSuffix)).string();
}

std::string CheckpointDir::save(const Checkpoint& checkpoint) const {
  const std::string path = path_for(checkpoint.step);
  write_file_atomically(path, encode_checkpoint(checkpoint));
  const std::vector<std::string> all = list();
  for (size_t i = static_cast<size_t>(keep_); i < all.size(); ++i) {
    std::error_code ignored;  // a file someone else removed is no reason to stop training
    fs::remove(all[i], ignored);
  }
  return path;
}

std::vector<std::string> CheckpointDir::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    const int64_t step = step_of(it->path().filename().string());
    if (step >= 0 && it->is_regular_file()) found.emplace_back(step, it->path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::optional<CheckpointDir::Loaded> CheckpointDir::load_newest_valid(
    std::vector<std::string>& skipped) const {
  for (const std::string& path : list()) {
    try {
      Loaded loaded;
      loaded.bytes = read_file_bytes(path);
      loaded.checkpoint = decode_checkpoint(loaded.bytes, path);
      loaded.path = path;
      return loaded;
    } catch (const Error& error) {
      skipped.push_back(error.what());
    }
  }
  return std::nullopt;
}

}  // namespace ringtrain
