// mnist_train --timeline FILE: the file's folder checked before training (by rank 0, the one
// that writes it; every rank stops alike if it cannot), the ranks' clocks aligned, the one
// Timeline attached to the parts that time themselves (the batch feed, the step, the model's
// layers on the CPU, the GradSync), and the file written by rank 0 at the end (timeline.h).
// Without --timeline every call here does nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "batch_feed.h"
#include "options.h"
#include "ringtrain/clock_sync.h"
#include "ringtrain/comm.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "ringtrain/timeline.h"
#include "ringtrain/train.h"

namespace ringtrain::app {

class TimelineRecording {
 public:
  // Collective over comm (with --timeline): the path's check, then the clocks' first alignment.
  TimelineRecording(const Options& o, Comm& comm);
  ~TimelineRecording();
  TimelineRecording(const TimelineRecording&) = delete;
  TimelineRecording& operator=(const TimelineRecording&) = delete;

  Timeline* get() { return timeline_ ? &*timeline_ : nullptr; }
  void attach(Model& model, GradSync* sync, StepWorkspace& workspace, BatchFeed& feed);
  void set_step(int64_t step) {
    if (!timeline_) return;
    if (timeline_->step() < 0) first_step_ = step;  // a resumed run starts past 0
    timeline_->set_step(step);
  }
  // The step as mnist_train times it: from its own start to now.
  void record_step(std::chrono::steady_clock::time_point start) {
    if (timeline_)
      timeline_->span(TraceKind::kStep, TraceLane::kCompute, Timeline::to_ns(start),
                      Timeline::now_ns());
  }
  // Collective: gathers every rank's records and rank 0 writes the file (once).
  void write(Comm& comm);

 private:
  std::string path_;
  std::optional<Timeline> timeline_;
  std::optional<LayerTimer> layer_timer_;
  Model* observed_ = nullptr;  // the model whose backward layer_timer_ observes
  std::vector<ClockOffset> start_offsets_;
  bool written_ = false;
  int64_t first_step_ = 0;
  double record_ns_ = 0.0;  // one span's recording, measured at start-up
};

}  // namespace ringtrain::app
