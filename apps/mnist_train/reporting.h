// What mnist_train tells its operator, shared by the ring's loop and the parameter-server
// workers: the progress lines and their metrics, evaluations, the summary's common lines, the
// step-time account, and the final parameter file.
#pragma once

#include <cstdint>

#include "options.h"
#include "ringtrain/comm.h"
#include "ringtrain/model.h"
#include "ringtrain/report.h"
#include "ringtrain/train.h"

namespace ringtrain::app {

// Means per step of the step's parts, in milliseconds.
struct StepTimes {
  double compute_ms = 0, comm_ms = 0, exposed_ms = 0;
  int64_t steps = 0;
  void add(double step_ms, const CommStats& comm);
  double mean(double total) const { return steps ? total / static_cast<double>(steps) : 0.0; }
  // 1 - exposed / communication: the share of communication hidden behind computation.
  double overlap_efficiency() const { return comm_ms > 0 ? 1.0 - exposed_ms / comm_ms : 0.0; }
};

// The training statistics between two progress lines.
class TrainWindow {
 public:
  void add(const StepStats& stats);
  // The bytes this rank's Allreduce sent in one step (Allreduce::tally), for the record's
  // wire_bytes_per_step (-1 in windows where nothing was counted).
  void add_wire_bytes(int64_t bytes) {
    wire_bytes_ += bytes;
    ++wire_steps_;
  }
  bool empty() const { return steps_ == 0; }
  // "step {done}/{total} epoch ... loss ... train acc ... lr ... img/s" (when `print`) and a
  // "train" metrics record; then starts a new window. train_seconds: this run's training time
  // so far (the time axis of scripts/plot_metrics).
  void report(int64_t done, int64_t total, int64_t epoch, float lr, double images_per_sec,
              double train_seconds, bool print, MetricsWriter& metrics);

 private:
  double loss_ = 0.0;
  int64_t correct_ = 0, samples_ = 0, steps_ = 0;
  int64_t wire_bytes_ = 0, wire_steps_ = 0;
};

// "step {step} test accuracy ... loss ..." (when `print`) and an "eval" metrics record.
void report_eval(int64_t step, const EvalResult& eval, double train_seconds, bool print,
                 MetricsWriter& metrics);

// The job's totals, as both strategies report them.
struct RunTotals {
  int64_t trained_steps = 0;  // this run's (from start_step)
  int64_t start_step = 0;
  double train_seconds = 0.0;
  int64_t global_batch = 0;
  double images_per_sec() const;
  double step_ms() const;
};
// The summary's first two lines: accuracy and loss, then steps, time, rate and memory.
// `weights`: " (EMA weights)" or empty; `extra`: appended to the second line.
void log_summary(const EvalResult& eval, const char* weights, double last_loss,
                 const RunTotals& totals, const std::string& extra);

// --save-params: the chief writes the final parameters (a long write is progress on `board`).
void save_final_params(const Options& o, const Model& model, ProgressBoard& board);

}  // namespace ringtrain::app
