// The timeline (timeline.h, clock_sync.h): the store, the trace JSON as a viewer reads it, a real
// CPU step's events (nesting per thread; every bucket once per step, ready <= started <= done),
// the gathering over thread ranks, the path check, and the clock alignment against offsets we
// inject. No assertion depends on how fast this machine is.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/clock_sync.h"
#include "ringtrain/data.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/timeline.h"
#include "ringtrain/train.h"
#include "support/fn_allreduce.h"
#include "support/mini_json.h"
#include "support/thread_comm.h"

using namespace ringtrain;
using testing::Json;
using testing::JsonReader;
namespace fs = std::filesystem;

namespace {

struct TimelineTempDir {
  fs::path path;
  TimelineTempDir() {
    char pattern[] = "/tmp/ringtrain-timeline-test-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TimelineTempDir() { fs::remove_all(path); }
};

// Spans (begin, end) of one thread nest: sorted by begin (longer first on ties), each one either
// starts after the enclosing one ends or ends inside it. Returns the first pair that overlaps
// partially, as text ("" if none).
template <typename T>
std::string partial_overlap(std::vector<std::pair<T, T>> spans, T tolerance) {
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  });
  std::vector<std::pair<T, T>> open;  // the enclosing spans, innermost last
  for (const auto& span : spans) {
    while (!open.empty() && span.first >= open.back().second - tolerance) open.pop_back();
    if (!open.empty() && span.second > open.back().second + tolerance) {
      std::ostringstream text;
      text << "[" << open.back().first << ", " << open.back().second << ") and [" << span.first
           << ", " << span.second << ")";
      return text.str();
    }
    open.push_back(span);
  }
  return "";
}

Dataset tiny_dataset() {
  Dataset data;
  data.count = 64;
  data.rows = data.cols = 28;
  data.images.resize(static_cast<size_t>(data.count * 28 * 28));
  data.labels.resize(static_cast<size_t>(data.count));
  for (size_t i = 0; i < data.images.size(); ++i) data.images[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < data.labels.size(); ++i) data.labels[i] = static_cast<uint8_t>(i % 10);
  return data;
}

// Trains `steps` CPU steps of `name` with a timeline attached as mnist_train attaches it (the
// step's workspace, the GradSync, the model's layers) and returns the timeline's events.
std::vector<TraceEvent> train_with_timeline(const char* name, bool overlap, int64_t steps,
                                            Timeline& timeline, size_t* buckets, int* layers) {
  auto model = make_model({.name = name});
  model->init_params(3);
  auto optimizer = make_optimizer({.kind = "sgd"}, model->num_params());
  const Dataset data = tiny_dataset();
  Context ctx;
  testing::FnAllreduce halve([](float* values, int64_t count) {
    for (int64_t i = 0; i < count; ++i) values[i] *= 0.5f;
  });
  const std::unique_ptr<GradSync> sync = make_grad_sync(
      model->grads().data(), model->grad_ranges(), halve,
      {.first_bucket_elements = 1000, .bucket_elements = 5000, .overlap = overlap}, ctx);
  LayerTimer layer_timer(timeline);
  model->set_backward_observer(&layer_timer);
  sync->set_timeline(&timeline);
  StepWorkspace workspace;
  workspace.timeline = &timeline;
  Batch batch;
  std::vector<int64_t> indices(16);
  for (int64_t step = 0; step < steps; ++step) {
    timeline.set_step(step);
    for (size_t i = 0; i < indices.size(); ++i)
      indices[i] = (step * 16 + static_cast<int64_t>(i)) % data.count;
    make_batch(data, indices, batch.images, batch.labels);
    train_step(*model, *optimizer, batch, 0.01f, workspace, ctx, sync.get());
  }
  model->set_backward_observer(nullptr);
  *buckets = sync->buckets().size();
  *layers = model->num_layers();
  const std::span<const TraceEvent> events = timeline.events();
  return {events.begin(), events.end()};
}

}  // namespace

TEST_CASE("the timeline's store keeps its capacity and counts the rest as dropped", "[timeline]") {
  Timeline timeline(4);
  for (int i = 0; i < 10; ++i) timeline.span(TraceKind::kForward, TraceLane::kCompute, i, i + 1);
  CHECK(timeline.events().size() == 4);
  CHECK(timeline.dropped() == 6);
  CHECK(timeline.events()[3].begin_ns == 3);
}

TEST_CASE("the trace JSON parses, with a process per rank, named threads and aligned clocks",
          "[timeline]") {
  RankTrace zero{.rank = 0};
  zero.events = {
      {1'000'000, 3'000'000, 0, -1, TraceKind::kStep, TraceLane::kCompute, false},
      {1'500'000, 2'000'000, 0, 1, TraceKind::kLayerBackward, TraceLane::kCompute, false},
      {1'600'000, 1'600'000, 0, 0, TraceKind::kBucketReady, TraceLane::kCompute, true},
      {1'700'000, 2'500'000, 0, 0, TraceKind::kAllreduce, TraceLane::kComm, false}};
  // Rank 1's clock reads 5 ms more than rank 0's: its event at 6.0 ms is rank 0's 1.0 ms.
  RankTrace one{.rank = 1};
  one.offset_at_start = {5'000'000, 40'000, 0};
  one.offset_at_end = {5'000'000, 30'000, 0};
  one.events = {{6'000'000, 6'250'000, 0, -1, TraceKind::kForward, TraceLane::kCompute, false}};
  const std::vector<RankTrace> ranks = {zero, one};
  const std::string text = trace_json(ranks, {"0.dense", "1.say \"hi\"\\"}, {7});
  Json trace;
  REQUIRE_NOTHROW(trace = JsonReader::parse(text));
  REQUIRE(trace.is_object());
  CHECK(trace["displayTimeUnit"].string() == "ms");
  REQUIRE(trace["traceEvents"].is_array());
  CHECK(trace["otherData"]["clock_alignment"].array().size() == 2);
  CHECK(trace["otherData"]["clock_alignment"].array()[1]["offset_start_ns"].number() == 5e6);
  CHECK(trace["otherData"]["clock_alignment"].array()[1]["round_trip_end_ns"].number() == 3e4);
  std::map<std::pair<int, std::string>, std::string> metadata;  // (pid, name) -> args.name
  std::map<std::string, const Json*> by_name;
  for (const Json& event : trace["traceEvents"].array()) {
    const std::string ph = event["ph"].string();
    const int pid = static_cast<int>(event["pid"].number());
    if (ph == "M") {
      if (event["name"].string() == "process_name")
        metadata[{pid, "process"}] = event["args"]["name"].string();
      if (event["name"].string() == "thread_name")
        metadata[{pid, "thread " + std::to_string(static_cast<int>(event["tid"].number()))}] =
            event["args"]["name"].string();
      continue;
    }
    REQUIRE(event["ts"].is_number());
    if (ph == "X") REQUIRE(event["dur"].is_number());
    by_name[event["name"].string()] = &event;
  }
  CHECK(metadata[{0, "process"}] == "rank 0");
  CHECK(metadata[{1, "process"}] == "rank 1");
  CHECK(metadata[{0, "thread 0"}] == "compute");
  CHECK(metadata[{1, "thread 1"}] == "communication");
  REQUIRE(by_name.count("step"));
  REQUIRE(by_name.count("forward"));
  REQUIRE(by_name.count("backward 1.say \"hi\"\\"));  // escaped and read back
  REQUIRE(by_name.count("bucket 0 ready"));
  REQUIRE(by_name.count("allreduce bucket 0"));
  const Json& step = *by_name["step"];
  const Json& forward = *by_name["forward"];
  CHECK(step["ts"].number() == 0.0);  // the earliest event is the origin
  CHECK(step["dur"].number() == Approx(2000.0));
  CHECK(forward["pid"].number() == 1);
  CHECK(forward["ts"].number() == Approx(0.0).margin(1e-9));  // 6.0 ms - 5 ms offset - origin
  CHECK(forward["dur"].number() == Approx(250.0));
  const Json& ready = *by_name["bucket 0 ready"];
  CHECK(ready["ph"].string() == "i");
  CHECK(ready["ts"].number() == Approx(600.0));
  const Json& allreduce = *by_name["allreduce bucket 0"];
  CHECK(allreduce["tid"].number() == 1);
  CHECK(allreduce["args"]["elements"].number() == 7);
}

TEST_CASE(
    "a CPU step's timeline nests per thread and has every bucket once per step, ready <= "
    "started <= done",
    "[timeline]") {
  for (const bool overlap : {true, false}) {
    for (const char* name : {"mlp", "cnn"}) {
      INFO(name << (overlap ? " overlapped" : " not overlapped"));
      Timeline timeline;
      size_t buckets = 0;
      int layers = 0;
      const int64_t steps = 3;
      const std::vector<TraceEvent> events =
          train_with_timeline(name, overlap, steps, timeline, &buckets, &layers);
      REQUIRE(buckets >= 2);  // the limits above cut both models into several buckets
      CHECK(timeline.dropped() == 0);
      // Per thread, the spans nest (on this rank's clock, in nanoseconds).
      for (const TraceLane lane : {TraceLane::kCompute, TraceLane::kComm}) {
        std::vector<std::pair<int64_t, int64_t>> spans;
        for (const TraceEvent& e : events)
          if (!e.instant && e.lane == lane) spans.emplace_back(e.begin_ns, e.end_ns);
        CHECK(partial_overlap(spans, int64_t{0}).empty());
      }
      std::map<std::tuple<int64_t, int32_t, bool>, std::vector<TraceEvent>> bucket_events;
      std::map<std::pair<int64_t, TraceKind>, int> per_step;
      for (const TraceEvent& e : events) {
        ++per_step[{e.step, e.kind}];
        if (e.kind == TraceKind::kBucketReady || e.kind == TraceKind::kAllreduce)
          bucket_events[{e.step, e.index, e.kind == TraceKind::kBucketReady}].push_back(e);
        if (e.kind == TraceKind::kAllreduce)
          CHECK(e.lane == (overlap ? TraceLane::kComm : TraceLane::kCompute));
      }
      for (int64_t step = 0; step < steps; ++step) {
        CHECK(per_step[{step, TraceKind::kForward}] == 1);
        CHECK(per_step[{step, TraceKind::kBackward}] == 1);
        CHECK(per_step[{step, TraceKind::kGradWait}] == 1);
        CHECK(per_step[{step, TraceKind::kOptimizer}] == 1);
        CHECK(per_step[{step, TraceKind::kLayerBackward}] >= 2);
        CHECK(per_step[{step, TraceKind::kLayerBackward}] <= layers);
        for (size_t k = 0; k < buckets; ++k) {
          const auto index = static_cast<int32_t>(k);
          const auto& ready = bucket_events[{step, index, true}];
          const auto& reduce = bucket_events[{step, index, false}];
          REQUIRE(ready.size() == 1);
          REQUIRE(reduce.size() == 1);
          CHECK(ready[0].begin_ns <= reduce[0].begin_ns);
          CHECK(reduce[0].begin_ns <= reduce[0].end_ns);
        }
        CHECK(per_step[{step, TraceKind::kBucketReady}] == static_cast<int>(buckets));
        CHECK(per_step[{step, TraceKind::kAllreduce}] == static_cast<int>(buckets));
      }
      // And the same holds in the JSON a viewer reads (microseconds with three decimals).
      RankTrace rank{.rank = 0};
      rank.events = events;
      const Json trace = JsonReader::parse(trace_json(std::vector<RankTrace>{rank}, {}, {}));
      std::map<int, std::vector<std::pair<double, double>>> by_tid;
      for (const Json& e : trace["traceEvents"].array())
        if (e["ph"].string() == "X")
          by_tid[static_cast<int>(e["tid"].number())].emplace_back(
              e["ts"].number(), e["ts"].number() + e["dur"].number());
      for (const auto& [tid, spans] : by_tid) {
        INFO("tid " << tid);
        CHECK(partial_overlap(spans, 1e-4).empty());
      }
    }
  }
}

TEST_CASE("clock alignment recovers injected offsets within half the round trip", "[timeline]") {
  // Rank r's clock is the real one shifted by offsets[r]: 3 s ahead, 7 ms behind, 1.23 s ahead.
  const std::vector<int64_t> offsets = {0, 3'000'000'000, -7'000'000, 1'234'567'891};
  for (const int rounds : {1, 8}) {
    INFO(rounds << " round(s)");
    std::vector<ClockOffset> measured;
    std::mutex mutex;
    run_ranks(static_cast<int>(offsets.size()), [&](Comm& comm) {
      const int64_t shift = offsets[static_cast<size_t>(comm.rank())];
      const std::vector<ClockOffset> result =
          measure_clock_offsets(comm, rounds, [shift] { return Timeline::now_ns() + shift; });
      std::lock_guard lock(mutex);
      if (comm.rank() == 0) measured = result;
    });
    REQUIRE(measured.size() == offsets.size());
    CHECK(measured[0].offset_ns == 0);
    for (size_t r = 1; r < offsets.size(); ++r) {
      INFO("rank " << r << ": measured " << measured[r].offset_ns << " ns, round trip "
                   << measured[r].round_trip_ns << " ns");
      CHECK(measured[r].round_trip_ns > 0);
      // Causality alone bounds the error by half the round trip (+1 ns for the halving).
      CHECK(std::abs(measured[r].offset_ns - offsets[r]) <= measured[r].round_trip_ns / 2 + 1);
    }
  }
}

TEST_CASE("write_timeline gathers every rank's events into rank 0's file", "[timeline]") {
  TimelineTempDir temp;
  const std::string path = (temp.path / "trace.json").string();
  std::vector<int64_t> written(3, -1);
  run_ranks(3, [&](Comm& comm) {
    Timeline timeline(64);
    timeline.describe({"0.flatten", "1.dense(784->10)"}, {7850});
    const std::vector<ClockOffset> start = measure_clock_offsets(comm, 2);
    for (int i = 0; i <= comm.rank(); ++i) {
      timeline.set_step(i);
      const int64_t now = Timeline::now_ns();
      timeline.span(TraceKind::kLayerBackward, TraceLane::kCompute, now, now + 1000, 1);
      timeline.span(TraceKind::kAllreduce, TraceLane::kComm, now + 10, now + 500, 0);
    }
    written[static_cast<size_t>(comm.rank())] = write_timeline(comm, timeline, path, start);
  });
  CHECK(written == std::vector<int64_t>{12, 0, 0});  // 2 events x (1 + 2 + 3) steps
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Json trace = JsonReader::parse(text);
  std::map<int, int> spans_per_rank;
  std::set<std::string> names;
  for (const Json& e : trace["traceEvents"].array()) {
    if (e["ph"].string() == "X") ++spans_per_rank[static_cast<int>(e["pid"].number())];
    names.insert(e["name"].string());
  }
  CHECK(spans_per_rank == std::map<int, int>{{0, 2}, {1, 4}, {2, 6}});
  CHECK(names.count("backward 1.dense(784->10)") == 1);
  CHECK(names.count("allreduce bucket 0") == 1);
  CHECK(trace["otherData"]["clock_alignment"].array().size() == 3);
}

TEST_CASE("check_timeline_path refuses a missing folder and a folder, naming --timeline",
          "[timeline]") {
  TimelineTempDir temp;
  CHECK_NOTHROW(check_timeline_path((temp.path / "t.json").string()));
  const std::string missing = (temp.path / "nowhere" / "t.json").string();
  CHECK_THROWS_WITH(check_timeline_path(missing),
                    Catch::Contains("--timeline " + missing) && Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(check_timeline_path(temp.path.string()),
                    Catch::Contains("--timeline") && Catch::Contains("is a folder"));
  CHECK_THROWS_AS(check_timeline_path(""), Error);
}

TEST_CASE(
    "a clock that measurably drifted is corrected by interpolation; one within the error "
    "bounds by the better measurement",
    "[timeline]") {
  // Rank 1's clock gains 1 ms over rank 0's in 1 s: offsets of 0 and 1 ms, each within 50 ns.
  RankTrace drifting{.rank = 1};
  drifting.offset_at_start = {0, 100, 1'000'000};
  drifting.offset_at_end = {1'000'000, 100, 1'001'000'000};
  drifting.events = {
      {1'000'000, 1'000'000, 0, -1, TraceKind::kForward, TraceLane::kCompute, false},
      {1'002'000'000, 1'002'000'000, 1, -1, TraceKind::kForward, TraceLane::kCompute, false}};
  const auto gap_us = [](const RankTrace& rank) {
    const Json trace = JsonReader::parse(trace_json(std::vector<RankTrace>{rank}, {}, {}));
    std::vector<double> ts;
    for (const Json& e : trace["traceEvents"].array())
      if (e["ph"].string() == "X") ts.push_back(e["ts"].number());
    REQUIRE(ts.size() == 2);
    return ts[1] - ts[0];
  };
  // 1.001 s of rank 1's clock after the first, less the 1 ms it gained: 1 s of rank 0's.
  CHECK(gap_us(drifting) == Approx(1e6).margin(1e-3));
  // The same offsets measured with 10 ms round trips cannot tell a drift from the error: the
  // better measurement (the end's, 4 ms) is used throughout, and the gap is the local one.
  RankTrace noisy = drifting;
  noisy.offset_at_start.round_trip_ns = 10'000'000;
  noisy.offset_at_end.round_trip_ns = 4'000'000;
  CHECK(gap_us(noisy) == Approx(1.001e6).margin(1e-3));
}
