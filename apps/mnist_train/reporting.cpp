// What mnist_train tells its operator (see reporting.h).
#include "reporting.h"

#include "ringtrain/log.h"

namespace ringtrain::app {

void StepTimes::add(double step_ms, const CommStats& comm) {
  compute_ms += step_ms - comm.exposed_ms;
  comm_ms += comm.comm_ms;
  exposed_ms += comm.exposed_ms;
  ++steps;
}

void TrainWindow::add(const StepStats& stats) {
  loss_ += stats.loss;
  correct_ += stats.correct;
  samples_ += stats.samples;
  ++steps_;
}

void TrainWindow::report(int64_t done, int64_t total, int64_t epoch, float lr,
                         double images_per_sec, double train_seconds, bool print,
                         MetricsWriter& metrics) {
  const double mean_loss = loss_ / static_cast<double>(steps_);
  const double accuracy = static_cast<double>(correct_) / static_cast<double>(samples_);
  if (print) {
    spdlog::info("step {}/{} epoch {} loss {:.4f} train acc {:.4f} lr {:.6g} {:.0f} img/s", done,
                 total, epoch, mean_loss, accuracy, lr, images_per_sec);
  }
  metrics.write("train",
                {{"step", done},
                 {"epoch", epoch},
                 {"loss", mean_loss},
                 {"train_accuracy", accuracy},
                 {"lr", static_cast<double>(lr)},
                 {"wire_bytes_per_step", wire_steps_ > 0 ? static_cast<double>(wire_bytes_) /
                                                               static_cast<double>(wire_steps_)
                                                         : -1.0},
                 {"train_seconds", train_seconds}});
  *this = TrainWindow();
}

void report_eval(int64_t step, const EvalResult& eval, double train_seconds, bool print,
                 MetricsWriter& metrics) {
  if (print)
    spdlog::info("step {} test accuracy {:.4f} loss {:.4f}", step, eval.accuracy(),
                 eval.mean_loss());
  metrics.write("eval", {{"step", step},
                         {"test_accuracy", eval.accuracy()},
                         {"test_loss", eval.mean_loss()},
                         {"train_seconds", train_seconds}});
}

// Every rank waits for the slowest at each step, so the chief's clock is the job's.
double RunTotals::images_per_sec() const {
  return train_seconds > 0 ? static_cast<double>(trained_steps * global_batch) / train_seconds
                           : 0.0;
}

double RunTotals::step_ms() const {
  return trained_steps > 0 ? train_seconds * 1000.0 / static_cast<double>(trained_steps) : 0.0;
}

void log_summary(const EvalResult& eval, const char* weights, double last_loss,
                 const RunTotals& totals, const std::string& extra) {
  spdlog::info(
      "summary: test accuracy {:.4f}{} ({} / {}), test loss {:.4f}, last batch loss {:.4f}",
      eval.accuracy(), weights, eval.correct, eval.samples, eval.mean_loss(), last_loss);
  spdlog::info(
      "summary: {} steps{} in {:.2f} s: {:.0f} images/s, {:.3f} ms/step, peak RSS {:.0f} MB{}",
      totals.trained_steps,
      totals.start_step > 0 ? fmt::format(" (resumed at step {})", totals.start_step)
                            : std::string(),
      totals.train_seconds, totals.images_per_sec(), totals.step_ms(), peak_rss_mb(), extra);
}

void save_final_params(const Options& o, const Model& model, ProgressBoard& board) {
  if (o.save_params.empty()) return;
  save_params(o.save_params, model.params_to_host(), [&board] { board.progress(); });
  spdlog::info("saved {} parameters to {}", model.num_params(), o.save_params);
}

}  // namespace ringtrain::app
