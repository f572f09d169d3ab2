// The timeline's store, its gathering on rank 0 and the Chrome trace JSON (see timeline.h).
#include "ringtrain/timeline.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/comm.h"

namespace ringtrain {

const char* to_string(TraceKind kind) {
  switch (kind) {
    case TraceKind::kStep:
      return "step";
    case TraceKind::kData:
      return "data";
    case TraceKind::kForward:
      return "forward";
    case TraceKind::kBackward:
      return "backward";
    case TraceKind::kLayerBackward:
      return "layer_backward";
    case TraceKind::kGradWait:
      return "grad_wait";
    case TraceKind::kBucketReady:
      return "bucket_ready";
    case TraceKind::kAllreduce:
      return "allreduce";
    case TraceKind::kOptimizer:
      return "optimizer";
    case TraceKind::kParamAverage:
      return "param_average";
    case TraceKind::kEvaluation:
      return "evaluation";
    case TraceKind::kCheckpoint:
      return "checkpoint";
  }
  return "unknown";
}

Timeline::Timeline(size_t capacity)
    : capacity_(capacity), events_(std::make_unique_for_overwrite<TraceEvent[]>(capacity)) {}

void Timeline::describe(std::vector<std::string> layer_names,
                        std::vector<int64_t> bucket_elements) {
  layer_names_ = std::move(layer_names);
  bucket_elements_ = std::move(bucket_elements);
}

std::span<const TraceEvent> Timeline::events() const {
  return {events_.get(), std::min(next_.load(std::memory_order_acquire), capacity_)};
}

int64_t Timeline::dropped() const {
  const size_t claimed = next_.load(std::memory_order_acquire);
  return claimed > capacity_ ? static_cast<int64_t>(claimed - capacity_) : 0;
}

namespace {

// The event's name as the viewers show it.
std::string event_name(const TraceEvent& event, const std::vector<std::string>& layer_names) {
  switch (event.kind) {
    case TraceKind::kLayerBackward:
      return event.index >= 0 && static_cast<size_t>(event.index) < layer_names.size()
                 ? "backward " + layer_names[static_cast<size_t>(event.index)]
                 : fmt::format("backward layer {}", event.index);
    case TraceKind::kBucketReady:
      return fmt::format("bucket {} ready", event.index);
    case TraceKind::kAllreduce:
      return fmt::format("allreduce bucket {}", event.index);
    case TraceKind::kGradWait:
      return "wait for gradients";
    case TraceKind::kParamAverage:
      return "parameter average";
    default:
      return to_string(event.kind);
  }
}

// Local time t on rank 0's clock, in whole nanoseconds: t minus this rank's offset. Of the two
// measurements (before and after training) the one with the shorter round trip is used, unless
// they differ by more than both error bounds together: then the clock has measurably drifted,
// and the offset is interpolated between them (held outside). Either way one monotone map is
// applied to both ends of every span, so spans that nest on a thread still nest.
int64_t on_rank0_clock(const RankTrace& rank, int64_t local_ns) {
  const ClockOffset& a = rank.offset_at_start;
  const ClockOffset& b = rank.offset_at_end;
  const int64_t bounds = (a.round_trip_ns + b.round_trip_ns) / 2;
  const bool drifted = b.at_ns > a.at_ns && std::abs(b.offset_ns - a.offset_ns) > bounds;
  if (!drifted) {
    const bool end_is_better = b.at_ns > a.at_ns && b.round_trip_ns < a.round_trip_ns;
    return local_ns - (end_is_better ? b.offset_ns : a.offset_ns);
  }
  const double t = static_cast<double>(local_ns - a.offset_ns);  // near enough to place it
  const double f = std::clamp(
      (t - static_cast<double>(a.at_ns)) / static_cast<double>(b.at_ns - a.at_ns), 0.0, 1.0);
  return local_ns - std::llround(static_cast<double>(a.offset_ns) +
                                 f * static_cast<double>(b.offset_ns - a.offset_ns));
}

// Nanoseconds as the trace's microseconds with three decimals, exactly.
std::string micros(int64_t ns) {
  return fmt::format("{}{}.{:03d}", ns < 0 ? "-" : "", std::abs(ns) / 1000, std::abs(ns) % 1000);
}

// JSON string escaping for the names we make (layer names hold no control characters, but
// say so in code, not in a comment).
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string trace_json(std::span<const RankTrace> ranks,
                       const std::vector<std::string>& layer_names,
                       const std::vector<int64_t>& bucket_elements) {
  // Microseconds from the job's earliest event, on rank 0's clock.
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const RankTrace& rank : ranks)
    for (const TraceEvent& event : rank.events)
      origin = std::min(origin, on_rank0_clock(rank, event.begin_ns));
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;
  fmt::memory_buffer out;
  auto it = std::back_inserter(out);
  fmt::format_to(it,
                 "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"producer\":\"ringtrain "
                 "mnist_train --timeline\",\"clock_alignment\":[");
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankTrace& r = ranks[i];
    fmt::format_to(it,
                   "{}{{\"rank\":{},\"offset_start_ns\":{},\"round_trip_start_ns\":{},"
                   "\"offset_end_ns\":{},\"round_trip_end_ns\":{},\"dropped_events\":{}}}",
                   i ? "," : "", r.rank, r.offset_at_start.offset_ns,
                   r.offset_at_start.round_trip_ns, r.offset_at_end.offset_ns,
                   r.offset_at_end.round_trip_ns, r.dropped);
  }
  fmt::format_to(it, "]}},\"traceEvents\":[\n");
  bool first = true;
  const auto sep = [&first] {
    const char* s = first ? "" : ",\n";
    first = false;
    return s;
  };
  for (const RankTrace& r : ranks) {
    fmt::format_to(it,
                   "{}{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,"
                   "\"args\":{{\"name\":\"rank {}\"}}}}",
                   sep(), r.rank, r.rank);
    fmt::format_to(it,
                   "{}{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{},\"tid\":0,"
                   "\"args\":{{\"sort_index\":{}}}}}",
                   sep(), r.rank, r.rank);
    fmt::format_to(it,
                   "{}{{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":{},\"tid\":0,"
                   "\"args\":{{\"labels\":\"clock offset {:+.1f} us (round trip {:.1f} us) "
                   "before training, {:+.1f} us ({:.1f} us) after\"}}}}",
                   sep(), r.rank, static_cast<double>(r.offset_at_start.offset_ns) / 1e3,
                   static_cast<double>(r.offset_at_start.round_trip_ns) / 1e3,
                   static_cast<double>(r.offset_at_end.offset_ns) / 1e3,
                   static_cast<double>(r.offset_at_end.round_trip_ns) / 1e3);
    const bool gpu = std::any_of(r.events.begin(), r.events.end(), [](const TraceEvent& e) {
      return e.lane == TraceLane::kComputeStream;
    });
    for (const auto& [tid, name] :
         {std::pair{0, "compute"}, std::pair{1, gpu ? "communication stream" : "communication"},
          std::pair{2, "compute stream"}}) {
      if (tid == 2 && !gpu) continue;
      fmt::format_to(it,
                     "{}{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},"
                     "\"args\":{{\"name\":\"{}\"}}}}",
                     sep(), r.rank, tid, name);
      fmt::format_to(it,
                     "{}{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{},\"tid\":{},"
                     "\"args\":{{\"sort_index\":{}}}}}",
                     sep(), r.rank, tid, tid);
    }
    for (const TraceEvent& e : r.events) {
      const int64_t begin = on_rank0_clock(r, e.begin_ns) - origin;
      fmt::format_to(it, "{}{{\"name\":{},\"cat\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":{},", sep(),
                     quoted(event_name(e, layer_names)), to_string(e.kind), r.rank,
                     static_cast<int>(e.lane), micros(begin));
      if (e.instant) {
        fmt::format_to(it, "\"ph\":\"i\",\"s\":\"t\",");
      } else {
        const int64_t end = on_rank0_clock(r, std::max(e.end_ns, e.begin_ns)) - origin;
        fmt::format_to(it, "\"ph\":\"X\",\"dur\":{},", micros(end - begin));
      }
      fmt::format_to(it, "\"args\":{{\"step\":{}", e.step);
      if (e.kind == TraceKind::kLayerBackward) fmt::format_to(it, ",\"layer\":{}", e.index);
      if (e.kind == TraceKind::kBucketReady || e.kind == TraceKind::kAllreduce) {
        fmt::format_to(it, ",\"bucket\":{}", e.index);
        if (e.index >= 0 && static_cast<size_t>(e.index) < bucket_elements.size())
          fmt::format_to(it, ",\"elements\":{}", bucket_elements[static_cast<size_t>(e.index)]);
      }
      fmt::format_to(it, "}}}}");
    }
  }
  fmt::format_to(it, "\n]}}\n");
  return fmt::to_string(out);
}

void check_timeline_path(const std::string& path) {
  namespace fs = std::filesystem;
  const auto refuse = [&path](const std::string& why) {
    throw Error(fmt::format("--timeline {}: {}", path, why), ExitCode::kUsage);
  };
  if (path.empty()) refuse("name the trace file to write");
  std::error_code error;
  const fs::path file(path);
  if (fs::is_directory(file, error))
    refuse("is a folder; name a file in it, e.g. --timeline " + (file / "timeline.json").string());
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (!fs::exists(folder, error))
    refuse(fmt::format("the folder {} does not exist; create it or name a file elsewhere",
                       folder.string()));
  if (!fs::is_directory(folder, error)) refuse(fmt::format("{} is not a folder", folder.string()));
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    refuse(fmt::format("cannot create a file in {}: {}", folder.string(), std::strerror(errno)));
}

int64_t write_timeline(Comm& comm, const Timeline& timeline, const std::string& path,
                       const std::vector<ClockOffset>& start) {
  const std::vector<ClockOffset> end = measure_clock_offsets(comm, kClockSyncRounds);
  // Every rank's records, one root at a time (broadcast: the transport's byte collective);
  // only rank 0 keeps them.
  std::vector<RankTrace> ranks(comm.rank() == 0 ? static_cast<size_t>(comm.size()) : 0);
  std::vector<TraceEvent> incoming;
  for (int root = 0; root < comm.size(); ++root) {
    const std::span<const TraceEvent> mine = timeline.events();
    int64_t header[2] = {static_cast<int64_t>(mine.size()), timeline.dropped()};
    if (comm.rank() != root) header[0] = header[1] = 0;
    comm.broadcast(header, sizeof(header), root);
    if (comm.rank() == root) {
      incoming.assign(mine.begin(), mine.end());
    } else {
      incoming.resize(static_cast<size_t>(header[0]));
    }
    comm.broadcast(incoming.data(), incoming.size() * sizeof(TraceEvent), root);
    if (comm.rank() != 0) continue;
    RankTrace& rank = ranks[static_cast<size_t>(root)];
    rank.rank = root;
    rank.events = incoming;
    rank.dropped = header[1];
    rank.offset_at_start = start.at(static_cast<size_t>(root));
    rank.offset_at_end = end.at(static_cast<size_t>(root));
  }
  if (comm.rank() != 0) return 0;
  int64_t count = 0;
  for (const RankTrace& rank : ranks) count += static_cast<int64_t>(rank.events.size());
  const std::string json = trace_json(ranks, timeline.layer_names(), timeline.bucket_elements());
  try {
    write_file_atomically(path, {reinterpret_cast<const uint8_t*>(json.data()), json.size()});
  } catch (const Error& error) {
    throw Error(fmt::format("--timeline {}: {}", path, error.what()), error.code());
  }
  return count;
}

}  // namespace ringtrain
