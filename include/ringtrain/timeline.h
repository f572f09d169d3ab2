// The timeline (mnist_train --timeline FILE): what each rank's compute and communication
// threads did, when, written by rank 0 as one Chrome trace-event JSON file for the whole job
// (open it in https://ui.perfetto.dev or chrome://tracing).
//
// The one idea: recording is cheap enough to leave on. The parts that already time themselves
// (the step in mnist_train, train_step, Model::backward through its observer, GradSync's
// engines) hand their own clock readings to a Timeline, which stores a fixed-size record in a
// store allocated once (capacity events; later ones are counted as dropped, never grown into).
// Any thread may record: a slot is claimed with one atomic increment. Names, JSON and the
// clocks of the other ranks are dealt with only at the end: write_timeline gathers every
// rank's records on rank 0, moves them onto rank 0's clock (clock_sync.h) and writes the file.
//
// Trace layout: one process per rank (pid = rank, "rank r"), thread 0 "compute" (data,
// forward, backward and each layer's, the wait for the gradients, optimizer, evaluation,
// checkpoint, the bucket-ready instants) and thread 1 "communication" (each bucket's
// allreduce); on a GPU, thread 2 "compute stream" holds the step's device phases and thread 1
// is the communication stream. "X" events on one thread nest: they come from one thread's own clock
// readings, scopes inside scopes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/clock_sync.h"
#include "ringtrain/model.h"

namespace ringtrain {

class Comm;

enum class TraceKind : uint8_t {
  kStep,           // one training step, as mnist_train times it
  kData,           // making this rank's batch
  kForward,        // forward and the loss
  kBackward,       // the whole backward pass
  kLayerBackward,  // one layer's backward (index: the layer)
  kGradWait,       // GradSync::finish: waiting for the buckets still in flight (exposed)
  kBucketReady,    // instant: backward completed bucket `index`
  kAllreduce,      // bucket `index` averaged: from its start to its end
  kOptimizer,
  kParamAverage,  // --strategy local-sgd: the parameter average
  kEvaluation,
  kCheckpoint,
};
const char* to_string(TraceKind kind);  // the trace's "cat": "step", "data", ...

// The trace's tid. A GPU step's phases are the compute stream's (from CUDA events), beside the
// host thread that queued them; its buckets' allreduces are the communication stream's.
enum class TraceLane : uint8_t { kCompute = 0, kComm = 1, kComputeStream = 2 };

// One record, on this rank's steady clock. Trivially copyable: gathered as raw bytes.
struct TraceEvent {
  int64_t begin_ns;  // steady_clock nanoseconds
  int64_t end_ns;    // == begin_ns for an instant
  int64_t step;      // the step it belongs to (-1: before the first)
  int32_t index;     // the layer or the bucket; -1: none
  TraceKind kind;
  TraceLane lane;
  bool instant;
};

class Timeline {
 public:
  static constexpr size_t kDefaultCapacity = size_t{1} << 20;  // 32 MiB, touched as used
  explicit Timeline(size_t capacity = kDefaultCapacity);
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static int64_t to_ns(std::chrono::steady_clock::time_point at) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
  }

  // The step later records belong to (mnist_train sets it as each step starts).
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }
  // From any thread; never allocates. Past capacity the record is counted, not stored.
  void span(TraceKind kind, TraceLane lane, int64_t begin_ns, int64_t end_ns, int32_t index = -1) {
    store({begin_ns, end_ns, step(), index, kind, lane, false});
  }
  void instant(TraceKind kind, TraceLane lane, int64_t at_ns, int32_t index = -1) {
    store({at_ns, at_ns, step(), index, kind, lane, true});
  }

  // What the trace names: the model's layers (for kLayerBackward) and the buckets' sizes.
  void describe(std::vector<std::string> layer_names, std::vector<int64_t> bucket_elements);
  const std::vector<std::string>& layer_names() const { return layer_names_; }
  const std::vector<int64_t>& bucket_elements() const { return bucket_elements_; }

  // GPU steps: a CUDA event (cudaEvent_t, opaque here) that completed at host time host_ns,
  // set after the step's synchronisation; device events are resolved against it.
  void set_device_anchor(void* event, int64_t host_ns) {
    anchor_event_ = event;
    anchor_ns_ = host_ns;
  }
  void* anchor_event() const { return anchor_event_; }
  int64_t anchor_ns() const { return anchor_ns_; }

  // The records so far: read only while no thread records.
  std::span<const TraceEvent> events() const;
  int64_t dropped() const;
  size_t capacity() const { return capacity_; }

 private:
  void store(const TraceEvent& event) {
    const size_t slot = next_.fetch_add(1, std::memory_order_relaxed);
    if (slot < capacity_) events_[slot] = event;
  }

  size_t capacity_;
  std::unique_ptr<TraceEvent[]> events_;  // [capacity_], allocated once, not initialised
  std::atomic<size_t> next_{0};           // slots claimed, dropped ones included
  std::atomic<int64_t> step_{-1};
  std::vector<std::string> layer_names_;
  std::vector<int64_t> bucket_elements_;
  void* anchor_event_ = nullptr;
  int64_t anchor_ns_ = 0;
};

// A span on the compute lane from construction to destruction; nothing without a timeline.
class TraceScope {
 public:
  TraceScope(Timeline* timeline, TraceKind kind, int32_t index = -1)
      : timeline_(timeline),
        kind_(kind),
        index_(index),
        begin_ns_(timeline ? Timeline::now_ns() : 0) {}
  ~TraceScope() { close(); }
  // Ends the span now (once; the destructor then records nothing).
  void close() {
    if (timeline_ != nullptr)
      timeline_->span(kind_, TraceLane::kCompute, begin_ns_, Timeline::now_ns(), index_);
    timeline_ = nullptr;
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Timeline* timeline_;
  TraceKind kind_;
  int32_t index_;
  int64_t begin_ns_;
};

// Records each layer's backward as a kLayerBackward span (Model::set_backward_observer; CPU
// steps: on a GPU the host only queues the work).
class LayerTimer final : public BackwardObserver {
 public:
  explicit LayerTimer(Timeline& timeline) : timeline_(timeline) {}
  void layer_begin(int) override { begin_ns_ = Timeline::now_ns(); }
  void layer_end(int layer) override {
    timeline_.span(TraceKind::kLayerBackward, TraceLane::kCompute, begin_ns_, Timeline::now_ns(),
                   layer);
  }

 private:
  Timeline& timeline_;
  int64_t begin_ns_ = 0;
};

// One rank's records as the file is made from them.
struct RankTrace {
  int rank = 0;
  std::vector<TraceEvent> events;
  ClockOffset offset_at_start;  // this rank's clock minus rank 0's, measured before training
  ClockOffset offset_at_end;    // and after (see trace_json for which one is used)
  int64_t dropped = 0;
};

// The Chrome trace JSON of the ranks' records, on rank 0's clock, in microseconds from the
// earliest event. A rank's offset is the measurement with the shorter round trip, or, when the
// two differ by more than both error bounds, interpolated between them (a drifting clock):
// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}} with the clock offsets and
// round trips in otherData and in each process's labels.
std::string trace_json(std::span<const RankTrace> ranks,
                       const std::vector<std::string>& layer_names,
                       const std::vector<int64_t>& bucket_elements);

// Fails with a message naming --timeline and `path` unless a file can be made there: its
// folder exists and is writable, and path is not a folder. Checked before training.
void check_timeline_path(const std::string& path);

// Collective: every rank's records to rank 0, which writes `path` (write_file_atomically) and
// returns how many events the file holds (0 on the other ranks). start: the offsets
// measure_clock_offsets gave before training; the ones after it are measured here.
int64_t write_timeline(Comm& comm, const Timeline& timeline, const std::string& path,
                       const std::vector<ClockOffset>& start);

}  // namespace ringtrain
