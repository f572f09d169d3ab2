// What a run tells its operator: a JSON-lines metrics file and a terminal progress bar.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace ringtrain {

using JsonValue = std::variant<int64_t, double, std::string, bool>;
using JsonField = std::pair<std::string_view, JsonValue>;

// The median of measurements (the mean of the middle two for an even count; 0 for none): how
// allreduce_bench and mnist_train's communication reference summarise repeated timings.
double median(std::vector<double> values);

// Appends one JSON object per line: {"event":"<event>", fields...}. Lines are flushed as they
// are written, so a run that dies still leaves every line it logged. A default-constructed
// writer (no --metrics-out) writes nothing.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Truncates (or appends: a resumed run continues its file); throws naming the file. A
  // symbolic link at `path` is refused (ExitCode::kBadInput), never written through.
  explicit MetricsWriter(const std::string& path, bool append = false);
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();
  void write(std::string_view event, std::initializer_list<JsonField> fields) {
    write(event, std::span<const JsonField>(fields.begin(), fields.size()));
  }
  // A record assembled by parts.
  void write(std::string_view event, std::span<const JsonField> fields);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// A one-line progress bar with rate and ETA, redrawn in place on a terminal (stderr is a TTY);
// enabled() is false otherwise and the caller logs plain lines instead.
class ProgressBar {
 public:
  explicit ProgressBar(int64_t total_steps);
  bool enabled() const { return enabled_; }
  // Redraws at most ~10 times a second; `status` is shown after the bar.
  void update(int64_t steps_done, std::string_view status);
  void finish();  // ends the line

 private:
  int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// Peak resident memory of this process so far, in MB (getrusage).
double peak_rss_mb();

}  // namespace ringtrain
