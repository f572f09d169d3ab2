// The metrics file and the progress bar (see report.h).
#include "ringtrain/report.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "ringtrain/check.h"

namespace ringtrain {

namespace {

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_json_value(std::string& out, const JsonValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) {
    out += std::to_string(*i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    out += std::isfinite(*d) ? fmt::format("{}", *d) : "null";  // JSON has no NaN/Inf
  } else if (const auto* s = std::get_if<std::string>(&value)) {
    append_json_string(out, *s);
  } else {
    out += std::get<bool>(value) ? "true" : "false";
  }
}

std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(seconds + 0.5);
  if (total >= 3600)
    return fmt::format("{}:{:02d}:{:02d}", total / 3600, total / 60 % 60, total % 60);
  return fmt::format("{}:{:02d}", total / 60, total % 60);
}

// A symbolic link to a stream (/dev/stdout, /dev/fd/N, a FIFO: `--metrics-out >(jq ...)`)
// opened for appending, never created or truncated through; -1 when the link leads to a regular
// file or anything else that could be someone's data.
int open_linked_stream(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat target {};
  if (::fstat(fd, &target) == 0 &&
      (S_ISFIFO(target.st_mode) || S_ISCHR(target.st_mode) || S_ISSOCK(target.st_mode)))
    return fd;
  ::close(fd);
  return -1;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  // O_NOFOLLOW: a symbolic link planted at the path must not redirect the writes to a file.
  int fd =
      ::open(path.c_str(),
             O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (append ? O_APPEND : O_TRUNC), 0644);
  struct stat entry {};
  if (fd < 0 && errno == ELOOP && ::lstat(path.c_str(), &entry) == 0 && S_ISLNK(entry.st_mode))
    fd = open_linked_stream(path);
  if (fd < 0) {
    const int error = errno;
    if (S_ISLNK(entry.st_mode)) {
      throw Error(fmt::format("--metrics-out {}: is a symbolic link to a file; it is not written "
                              "through: give the file's own path",
                              path),
                  ExitCode::kBadInput);
    }
    RINGTRAIN_FAIL("--metrics-out: cannot create {}: {}", path, std::strerror(error));
  }
  file_ = ::fdopen(fd, append ? "a" : "w");
  if (file_ == nullptr) {
    const int error = errno;
    ::close(fd);
    RINGTRAIN_FAIL("--metrics-out: cannot open {}: {}", path, std::strerror(error));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2.0;
}

void MetricsWriter::write(std::string_view event, std::span<const JsonField> fields) {
  if (file_ == nullptr) return;
  std::string line = "{\"event\":";
  append_json_string(line, event);
  for (const auto& [key, value] : fields) {
    line += ',';
    append_json_string(line, key);
    line += ':';
    append_json_value(line, value);
  }
  line += "}\n";
  const bool ok = std::fputs(line.c_str(), file_) >= 0 && std::fflush(file_) == 0;
  RINGTRAIN_CHECK(ok, "--metrics-out: writing {} failed: {}", path_, std::strerror(errno));
}

ProgressBar::ProgressBar(int64_t total_steps)
    : total_(total_steps),
      enabled_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_() {}

void ProgressBar::update(int64_t steps_done, std::string_view status) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (steps_done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const double fraction =
      total_ > 0 ? static_cast<double>(steps_done) / static_cast<double>(total_) : 1.0;
  const int filled = static_cast<int>(fraction * kWidth);
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double eta = steps_done > 0 ? elapsed / static_cast<double>(steps_done) *
                                          static_cast<double>(total_ - steps_done)
                                    : 0.0;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  fmt::print(stderr, "\r[{}] {:3.0f}% {}/{} {} ETA {}\x1b[K", bar, fraction * 100.0, steps_done,
             total_, status, format_duration(eta));
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (enabled_) fmt::print(stderr, "\n");
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace ringtrain
