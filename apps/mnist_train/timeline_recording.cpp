// mnist_train's --timeline (see timeline_recording.h).
#include "timeline_recording.h"

#include <algorithm>

#include "ringtrain/check.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

namespace {

// What one record costs here, measured on the real code: a span as TraceScope records it (two
// clock readings and a store) into a scratch store, the median of a few batches. The scratch
// store is kept under 128 KiB, glibc's initial mmap threshold, so that freeing it does not
// raise the threshold and change where the run's later allocations come from.
double measure_record_ns() {
  constexpr int kBatch = 256, kBatches = 9;
  Timeline scratch(kBatch * kBatches);
  std::vector<double> per_record;
  for (int b = 0; b < kBatches; ++b) {
    const int64_t start = Timeline::now_ns();
    for (int i = 0; i < kBatch; ++i)
      scratch.span(TraceKind::kForward, TraceLane::kCompute, Timeline::now_ns(),
                   Timeline::now_ns());
    per_record.push_back(static_cast<double>(Timeline::now_ns() - start) / kBatch);
  }
  std::nth_element(per_record.begin(), per_record.begin() + kBatches / 2, per_record.end());
  return per_record[kBatches / 2];
}
}  // namespace

TimelineRecording::TimelineRecording(const Options& o, Comm& comm) : path_(o.timeline) {
  if (path_.empty()) return;
  // Only rank 0 writes the file, so only its file system decides; every rank learns the verdict
  // and stops alike, before training.
  std::string why;
  if (comm.rank() == 0) {
    try {
      check_timeline_path(path_);
    } catch (const Error& error) {
      why = error.what();
    }
  }
  int usable = why.empty() ? 1 : 0;
  comm.broadcast(&usable, sizeof(usable), 0);
  if (usable == 0)
    throw Error(comm.rank() == 0 ? why : "--timeline: rank 0 cannot write the trace file",
                ExitCode::kUsage, /*on_every_rank=*/true);
  timeline_.emplace();
  record_ns_ = measure_record_ns();
  start_offsets_ = measure_clock_offsets(comm, kClockSyncRounds);
  if (comm.rank() == 0) {
    ClockOffset widest;
    for (const ClockOffset& offset : start_offsets_)
      if (offset.round_trip_ns >= widest.round_trip_ns) widest = offset;
    spdlog::info(
        "timeline: recording to {} (at most {} events per rank); clocks aligned to rank 0 "
        "within {:.1f} us (the widest half round trip of {} ranks)",
        path_, timeline_->capacity(), static_cast<double>(widest.round_trip_ns) / 2e3, comm.size());
  }
}

TimelineRecording::~TimelineRecording() {
  if (observed_ != nullptr) observed_->set_backward_observer(nullptr);
}

void TimelineRecording::attach(Model& model, GradSync* sync, StepWorkspace& workspace,
                               BatchFeed& feed) {
  if (!timeline_) return;
  std::vector<std::string> layers;
  for (int i = 0; i < model.num_layers(); ++i) layers.push_back(model.layer_name(i));
  std::vector<int64_t> buckets;
  if (sync != nullptr)
    for (const Bucket& bucket : sync->buckets()) buckets.push_back(bucket.size());
  timeline_->describe(std::move(layers), std::move(buckets));
  // On a GPU the host only queues each layer's work: its host times would say nothing.
  if (model.device() == Device::kCpu) {
    layer_timer_.emplace(*timeline_);
    model.set_backward_observer(&*layer_timer_);
    observed_ = &model;
  }
  if (sync != nullptr) sync->set_timeline(&*timeline_);
  workspace.timeline = &*timeline_;
  feed.set_timeline(&*timeline_);
}

void TimelineRecording::write(Comm& comm) {
  if (!timeline_ || written_) return;
  written_ = true;
  if (timeline_->dropped() > 0)
    spdlog::warn(
        "timeline: rank {} dropped {} event(s) past its capacity of {}: the trace holds its "
        "first {}",
        comm.rank(), timeline_->dropped(), timeline_->capacity(), timeline_->capacity());
  // Rank 0's own records per training step, and what recording them cost at the measured rate.
  int64_t own = 0;
  for (const TraceEvent& event : timeline_->events()) own += event.step >= 0 ? 1 : 0;
  const int64_t steps = timeline_->step() + 1 - first_step_;
  const int64_t events = write_timeline(comm, *timeline_, path_, start_offsets_);
  if (comm.rank() == 0) {
    spdlog::info("timeline: {} events of {} rank(s) written to {} (open it in ui.perfetto.dev)",
                 events, comm.size(), path_);
    if (steps > 0)
      spdlog::info(
          "timeline: recording cost: {:.1f} events per step on rank 0 at {:.1f} ns each "
          "(measured at start-up) = {:.2f} us per step",
          static_cast<double>(own) / static_cast<double>(steps), record_ns_,
          static_cast<double>(own) * record_ns_ / static_cast<double>(steps) / 1e3);
  }
}

}  // namespace ringtrain::app
