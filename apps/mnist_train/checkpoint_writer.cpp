// The chief's checkpoint writes (see checkpoint_writer.h).
#include "checkpoint_writer.h"

#include <chrono>
#include <csignal>

#include "ringtrain/check.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

CheckpointHeader checkpoint_header(const Options& o, const Model& model, const RunPlan& plan,
                                   int ranks, const std::string& optimizer) {
  return CheckpointHeader{.model = o.model,
                          .layers = model.signature(),
                          .num_params = model.num_params(),
                          .steps_per_epoch = plan.steps_per_epoch,
                          .seed = o.seed,
                          .global_batch = plan.global_batch,
                          .ranks = ranks,
                          .micro_batch = o.reproducible ? o.micro_batch : 0,
                          .schedule = plan.schedule,
                          .optimizer = optimizer};
}

Checkpoint checkpoint_at(const CheckpointHeader& header, int64_t step) {
  return Checkpoint{.model = header.model,
                    .layers = header.layers,
                    .num_params = header.num_params,
                    .step = step,
                    .epoch = step / header.steps_per_epoch,
                    .step_in_epoch = step % header.steps_per_epoch,
                    .seed = header.seed,
                    .global_batch = header.global_batch,
                    .ranks = header.ranks,
                    .micro_batch = header.micro_batch,
                    .schedule = header.schedule,
                    .optimizer = header.optimizer};
}

CheckpointWriter::CheckpointWriter(const Options& o, MetricsWriter& metrics, ProgressBoard& board)
    : o_(o), metrics_(metrics) {
  if (o.checkpoint_dir.empty()) return;
  dir_.emplace(o.checkpoint_dir, o.keep_checkpoints);
  dir_->set_progress([&board] { board.progress(); });
}

void CheckpointWriter::save(const Checkpoint& c, const std::string& note) {
  if (!dir_) return;
  const auto start = std::chrono::steady_clock::now();
  if (c.step == o_.test_kill_in_checkpoint_step) {  // the crash-consistency test's kill
    dir_->set_fault_hook([this](const char* point) {
      if (o_.test_kill_in_checkpoint == point) std::raise(SIGKILL);
    });
  }
  std::string path;
  try {
    path = dir_->save(c);
  } catch (const Error& error) {
    if (error.code() != ExitCode::kNonFinite) throw;
    // Without --check-finite a NaN that appeared on another rank's batch reaches every
    // replica in the averaged gradients before that rank's own check ends the job.
    throw Error(fmt::format("the checkpoint of step {} was not written: {}; the checkpoints "
                            "already in {} are intact. Lower --lr or check the data{}",
                            c.step, error.what(), o_.checkpoint_dir,
                            o_.strategy == Strategy::kParameterServers
                                ? std::string()
                                : std::string(", or pass --check-finite")),
                ExitCode::kNonFinite);
  }
  spdlog::info(
      "checkpoint: step {}{} written to {} in {:.0f} ms", c.step, note, path,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  metrics_.write("checkpoint", {{"step", c.step}, {"path", path}});
}

bool CheckpointSchedule::due(int64_t done, bool replicas_equal) {
  const bool by_count = every_ > 0 && done % every_ == 0;
  const bool by_time =
      secs_ > 0 &&
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_time_).count() >= secs_;
  const bool due = by_count || by_time || pending_;
  pending_ = due && !replicas_equal;
  return due && replicas_equal;
}

void CheckpointSchedule::written(int64_t done) {
  last_time_ = std::chrono::steady_clock::now();
  last_step_ = done;
}

}  // namespace ringtrain::app
