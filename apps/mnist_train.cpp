// mnist_train: trains the source documents' MNIST models (mlp, cnn), data-parallel over the
// ranks of `mpirun -np N` (or on one process without mpirun). The loop lives here, in plain
// sight: take this rank's share of the global batch, step (the ring averages the gradients
// while backward runs), log, evaluate, summarise.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "ringtrain/bucketer.h"
#include "ringtrain/check.h"
#include "ringtrain/data.h"
#include "ringtrain/distributed.h"
#include "ringtrain/log.h"
#include "ringtrain/model.h"
#include "ringtrain/mpi_comm.h"
#include "ringtrain/optim.h"
#include "ringtrain/report.h"
#include "ringtrain/train.h"

namespace {

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string data_dir;
  std::string model = "mlp";
  std::vector<int64_t> hidden;
  int64_t epochs = 1;
  int64_t steps = 0;
  int64_t batch_size = 32;
  OptimizerConfig optimizer;
  LrSchedule schedule;
  double warmup_epochs = 0.0;
  float ema_decay = 0.0f;
  uint64_t seed = 42;
  int threads = 1;
  int64_t log_every = 100;
  int64_t eval_every = 0;
  int64_t eval_batch = 1000;
  std::string metrics_out;
  std::string save_params;
  std::string log_level = "info";
  std::string allreduce = "ring";
  std::string overlap = "auto";
  bool no_overlap = false;
  double fusion_threshold_mb = 4.0;
  double first_bucket_mb = 0.25;
  std::string lr_scaling = "none";
  int64_t check_replicas = 0;
  double test_comm_delay_ms = 0.0;
  int test_perturb_rank = -1;
};

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--data-dir", o.data_dir,
                 "Folder with the four MNIST-format IDX files (.gz or plain). Default: "
                 "$RINGTRAIN_DATA, else data/mnist, else Debian's Fashion-MNIST");
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--hidden", o.hidden, "MLP hidden widths, e.g. 4096,4096 (default 500,500)")
      ->delimiter(',');
  auto* epochs = app.add_option("--epochs", o.epochs, "Passes over the training set")
                     ->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "Train for exactly this many steps instead of --epochs")
      ->check(CLI::PositiveNumber)
      ->excludes(epochs);
  app.add_option("--batch-size", o.batch_size, "Samples per step")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.schedule.base_lr, "Base learning rate")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", o.optimizer.kind, "sgd or adam");
  app.add_option("--momentum", o.optimizer.momentum, "SGD momentum (PyTorch form)");
  app.add_flag("--nesterov", o.optimizer.nesterov, "Nesterov momentum for SGD");
  app.add_option("--weight-decay", o.optimizer.weight_decay, "L2 penalty added to the gradient");
  app.add_option("--adam-beta1", o.optimizer.beta1, "Adam beta1");
  app.add_option("--adam-beta2", o.optimizer.beta2, "Adam beta2");
  app.add_option("--adam-epsilon", o.optimizer.epsilon, "Adam epsilon");
  app.add_option("--lr-schedule", o.schedule.kind, "constant, exponential or linear-warmup");
  app.add_option("--lr-decay-rate", o.schedule.decay_rate, "exponential: factor per decay period");
  app.add_option("--lr-decay-steps", o.schedule.decay_steps,
                 "exponential: steps per decay period (default 60000/128)");
  app.add_flag("--lr-staircase", o.schedule.staircase, "exponential: decay in whole periods");
  auto* warmup_steps = app.add_option("--warmup-steps", o.schedule.warmup_steps,
                                      "linear-warmup: steps to reach the scaled rate");
  app.add_option("--warmup-epochs", o.warmup_epochs, "linear-warmup: the same, in epochs")
      ->excludes(warmup_steps);
  app.add_option("--reference-batch", o.schedule.reference_batch,
                 "linear-warmup: the batch the base rate was tuned for (default: this run's)");
  app.add_option("--ema-decay", o.ema_decay,
                 "Keep an exponential moving average of the weights and evaluate with it "
                 "(e.g. 0.99); 0 disables");
  app.add_option("--seed", o.seed, "Seed for initial weights and data order");
  app.add_option("--threads", o.threads, "CPU math threads")->check(CLI::PositiveNumber);
  app.add_option("--log-every", o.log_every, "Steps between progress lines (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-every", o.eval_every,
                 "Steps between test evaluations (0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-batch", o.eval_batch, "Batch size for evaluation")
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-out", o.metrics_out, "Write JSON lines (train, eval, summary) here");
  app.add_option("--save-params", o.save_params,
                 "Write the final flat parameter buffer here (RTPARAMS format)");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error");
  app.add_option("--allreduce", o.allreduce,
                 "Gradient averaging: ring (ours) or mpi (MPI_Allreduce)")
      ->check(CLI::IsMember({"ring", "mpi"}));
  auto* overlap = app.add_option(
      "--overlap", o.overlap,
      "Average gradients while backward runs: on, off, or auto (on unless this node's ranks "
      "x --threads already fill its cores, where the communication thread can only take "
      "cycles from backward)");
  overlap->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_flag("--no-overlap", o.no_overlap,
               "Average all gradients after backward (the baseline): --overlap off")
      ->excludes(overlap);
  app.add_option("--fusion-threshold-mb", o.fusion_threshold_mb,
                 "Gradient bucket size in MB (0: one bucket for everything)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--first-bucket-mb", o.first_bucket_mb,
                 "Size of the first (last layers') bucket in MB: small, so communication starts "
                 "early")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr-scaling", o.lr_scaling,
                 "linear: the rate ramps from --lr to --lr x ranks over --warmup-epochs or "
                 "--warmup-steps (Goyal et al.)")
      ->check(CLI::IsMember({"none", "linear"}));
  app.add_option("--check-replicas", o.check_replicas,
                 "Every K steps (and at the end), check that all ranks hold identical "
                 "parameters (0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--test-comm-delay-ms", o.test_comm_delay_ms,
                 "Testing only: sleep this long before each bucket's reduction")
      ->group("")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--test-perturb-rank", o.test_perturb_rank,
                 "Testing only: after the first step, nudge one parameter on this rank so that "
                 "the replica check must catch it")
      ->group("");
}

// Evaluates the test set with the given weights in the model (restoring the trained ones).
// Evaluates the test set, split over the ranks, with the EMA weights when there are any
// (restoring the trained ones after).
EvalResult evaluate_test(Comm& comm, Model& model, const Dataset& test, const Options& o,
                         const WeightEma* ema, Batch& scratch, Context& ctx) {
  if (ema == nullptr) return evaluate_sharded(comm, model, test, o.eval_batch, scratch, ctx);
  Tensor& params = model.params();
  std::vector<float> trained(params.data(), params.data() + params.numel());
  std::copy(ema->shadow().begin(), ema->shadow().end(), params.data());
  EvalResult result = evaluate_sharded(comm, model, test, o.eval_batch, scratch, ctx);
  std::copy(trained.begin(), trained.end(), params.data());
  return result;
}

// Means per step of the step's parts, in milliseconds.
struct StepTimes {
  double compute_ms = 0, comm_ms = 0, exposed_ms = 0;
  int64_t steps = 0;
  void add(double step_ms, const CommStats& comm) {
    compute_ms += step_ms - comm.exposed_ms;
    comm_ms += comm.comm_ms;
    exposed_ms += comm.exposed_ms;
    ++steps;
  }
  double mean(double total) const { return steps ? total / static_cast<double>(steps) : 0.0; }
  // 1 - exposed / communication: the share of communication hidden behind computation.
  double overlap_efficiency() const { return comm_ms > 0 ? 1.0 - exposed_ms / comm_ms : 0.0; }
};

int run(const Options& o, Comm& comm) {
  const int rank = comm.rank(), ranks = comm.size();
  // Every rank logs warnings and errors; progress comes from rank 0 only.
  setup_logging(rank, o.log_level);
  if (rank != 0 && spdlog::get_level() < spdlog::level::warn)
    spdlog::set_level(spdlog::level::warn);
  set_cpu_threads(o.threads);
  Context ctx;
  ctx.threads = o.threads;

  const std::string data_dir = o.data_dir.empty() ? default_data_dir() : o.data_dir;
  spdlog::info("data: {}{}", data_dir,
               o.data_dir.empty() ? " (default; --data-dir to change)" : "");
  const MnistData data = load_mnist_dir(data_dir);
  spdlog::info("data: {} train, {} test images of {}x{}", data.train.count, data.test.count,
               data.train.rows, data.train.cols);

  ModelSpec spec{.name = o.model,
                 .hidden = o.hidden,
                 .height = data.train.rows,
                 .width = data.train.cols,
                 .classes = 10};
  std::unique_ptr<Model> model = make_model(spec);
  // The chief initialises; everyone starts from its bits.
  if (rank == 0) model->init_params(o.seed);
  broadcast_params(comm, *model);
  spdlog::info("model {}:\n{}", o.model, model->summary());

  const int64_t global_batch = o.batch_size * ranks;
  const int64_t steps_per_epoch = data.train.count / global_batch;
  RINGTRAIN_CHECK(steps_per_epoch >= 1,
                  "the global batch ({} ranks x --batch-size {}) is larger than the {} training "
                  "images",
                  ranks, o.batch_size, data.train.count);
  const int64_t total_steps = o.steps > 0 ? o.steps : o.epochs * steps_per_epoch;

  LrSchedule schedule = o.schedule;
  if (o.lr_scaling == "linear") {
    RINGTRAIN_CHECK(schedule.kind == "constant" || schedule.kind == "linear-warmup",
                    "--lr-scaling linear ramps the rate itself; it cannot be combined with "
                    "--lr-schedule {}",
                    schedule.kind);
    schedule.kind = "linear-warmup";
    schedule.reference_batch = o.batch_size;  // the target is --lr x ranks
  }
  schedule.global_batch = global_batch;
  if (schedule.reference_batch == 0) schedule.reference_batch = global_batch;
  if (o.warmup_epochs > 0) {
    schedule.warmup_steps =
        static_cast<int64_t>(o.warmup_epochs * static_cast<double>(steps_per_epoch));
  }
  validate(schedule);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(o.optimizer, model->num_params());
  std::optional<WeightEma> ema;
  if (o.ema_decay > 0.0f) {
    ema.emplace(o.ema_decay, std::span<const float>(model->params().data(),
                                                    static_cast<size_t>(model->num_params())));
  }
  // Only the chief writes files; the others would write the same lines.
  MetricsWriter metrics =
      o.metrics_out.empty() || rank != 0 ? MetricsWriter() : MetricsWriter(o.metrics_out);
  const auto mb_to_elements = [](double mb) { return static_cast<int64_t>(mb * 1e6 / 4.0); };
  // Overlap needs a core to run on: on one node whose cores the ranks' compute threads already
  // fill, the communication thread's copies only take cycles from backward (measured slower
  // there: docs/benchmarks.md), while across nodes the wire, not the CPU, is the bottleneck.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const bool node_is_full = comm.local_size() * o.threads >= cores;
  const bool overlap = o.no_overlap          ? false
                       : o.overlap == "auto" ? !(node_is_full && comm.local_size() == comm.size())
                                             : o.overlap == "on";
  const std::string overlap_reason =
      o.no_overlap || o.overlap != "auto"
          ? "set by flag"
          : fmt::format("--overlap auto: {} rank(s) x {} thread(s) on a node of {} cores{}",
                        comm.local_size(), o.threads, cores,
                        comm.local_size() < comm.size() ? ", ranks on several nodes" : "");
  RingScratch ring_scratch;
  // One rank has nothing to average: no bucketer, no communication thread.
  std::optional<GradBucketer> bucketer;
  if (ranks > 1 || o.test_comm_delay_ms > 0) {
    bucketer.emplace(model->grads().data(),
                     assign_buckets(model->grad_ranges(), mb_to_elements(o.first_bucket_mb),
                                    mb_to_elements(o.fusion_threshold_mb)),
                     make_bucket_reduce(comm, o.allreduce, ring_scratch, o.test_comm_delay_ms),
                     overlap);
  }
  const int64_t bucket_count = bucketer ? static_cast<int64_t>(bucketer->buckets().size()) : 0;
  // The communication thread shares the cores with backward: it must not spin long while waiting.
  if (bucketer && overlap) comm.set_spin_before_sleep(std::chrono::microseconds(50));
  spdlog::info(
      "training: {} steps ({} per epoch), {} rank(s) x batch {} = global batch {}, {} "
      "lr {} ({}), {} thread(s) per rank, seed {}",
      total_steps, steps_per_epoch, ranks, o.batch_size, global_batch, optimizer->name(),
      schedule.base_lr, schedule.kind, o.threads, o.seed);
  if (bucketer) {
    spdlog::info("gradients: {} bucket(s) averaged by {} {} ({})", bucket_count, o.allreduce,
                 overlap ? "while backward runs" : "after backward", overlap_reason);
  }

  EpochSampler sampler(data.train.count, o.seed);
  Batch batch, eval_scratch;
  StepWorkspace workspace;
  ProgressBar progress(rank == 0 ? total_steps : 0);
  const bool show_progress = rank == 0 && progress.enabled();
  StepTimes times;
  double train_seconds = 0.0, window_loss = 0.0, last_loss = 0.0;
  int64_t window_correct = 0, window_samples = 0, window_steps = 0;
  const std::span<float> params(model->params().data(), static_cast<size_t>(model->num_params()));

  for (int64_t step = 0; step < total_steps; ++step) {
    const auto start = Clock::now();
    const int64_t epoch = step / steps_per_epoch;
    const auto indices =
        rank_batch(sampler.order(epoch), step % steps_per_epoch, o.batch_size, rank, ranks);
    make_batch(data.train, indices, batch.images, batch.labels);
    const float lr = learning_rate(schedule, step);
    const StepStats stats =
        train_step(*model, *optimizer, batch, lr, workspace, ctx, bucketer ? &*bucketer : nullptr);
    if (ema) ema->update(params);
    const double step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    train_seconds += step_seconds;
    times.add(step_seconds * 1000.0, stats.comm);

    RINGTRAIN_CHECK(std::isfinite(stats.loss),
                    "the loss became {} at step {}: lower --lr (now {}) or check the data",
                    stats.loss, step, lr);
    window_loss += stats.loss;
    window_correct += stats.correct;
    window_samples += stats.samples;
    ++window_steps;
    last_loss = stats.loss;
    const int64_t done = step + 1;
    if (done == 1 && rank == o.test_perturb_rank) params.back() += 1e-3f;
    if (o.check_replicas > 0 && done % o.check_replicas == 0) check_replicas(comm, *model, done);
    if (show_progress) {
      progress.update(done, fmt::format("epoch {} loss {:.4f} {:.0f} img/s", epoch + 1, stats.loss,
                                        static_cast<double>(done * global_batch) / train_seconds));
    }
    if (o.log_every > 0 && (done % o.log_every == 0 || done == total_steps)) {
      const double mean_loss = window_loss / static_cast<double>(window_steps);
      const double accuracy =
          static_cast<double>(window_correct) / static_cast<double>(window_samples);
      if (!show_progress) {
        spdlog::info("step {}/{} epoch {} loss {:.4f} train acc {:.4f} lr {:.6g} {:.0f} img/s",
                     done, total_steps, epoch + 1, mean_loss, accuracy, lr,
                     static_cast<double>(done * global_batch) / train_seconds);
      }
      metrics.write("train", {{"step", done},
                              {"epoch", epoch + 1},
                              {"loss", mean_loss},
                              {"train_accuracy", accuracy},
                              {"lr", static_cast<double>(lr)}});
      window_loss = 0.0;
      window_correct = window_samples = window_steps = 0;
    }
    if (o.eval_every > 0 && done % o.eval_every == 0 && done != total_steps) {
      const EvalResult eval =
          evaluate_test(comm, *model, data.test, o, ema ? &*ema : nullptr, eval_scratch, ctx);
      if (!show_progress) {
        spdlog::info("step {} test accuracy {:.4f} loss {:.4f}", done, eval.accuracy(),
                     eval.mean_loss());
      }
      metrics.write(
          "eval",
          {{"step", done}, {"test_accuracy", eval.accuracy()}, {"test_loss", eval.mean_loss()}});
    }
  }
  if (show_progress) progress.finish();
  check_replicas(comm, *model, total_steps);  // always once: replicas must end identical

  const EvalResult eval =
      evaluate_test(comm, *model, data.test, o, ema ? &*ema : nullptr, eval_scratch, ctx);
  // Every rank waits for the slowest at each step, so rank 0's clock is the job's.
  const double images_per_sec = static_cast<double>(total_steps * global_batch) / train_seconds;
  const double step_ms = train_seconds * 1000.0 / static_cast<double>(total_steps);
  spdlog::info(
      "summary: test accuracy {:.4f}{} ({} / {}), test loss {:.4f}, last batch loss {:.4f}",
      eval.accuracy(), ema ? " (EMA weights)" : "", eval.correct, eval.samples, eval.mean_loss(),
      last_loss);
  spdlog::info("summary: {} steps in {:.2f} s: {:.0f} images/s, {:.3f} ms/step, peak RSS {:.0f} MB",
               total_steps, train_seconds, images_per_sec, step_ms, peak_rss_mb());
  spdlog::info(
      "summary: per step {:.3f} ms compute, {:.3f} ms communication of which {:.3f} ms "
      "exposed: overlap efficiency {:.0f}% ({} ranks, {})",
      times.mean(times.compute_ms), times.mean(times.comm_ms), times.mean(times.exposed_ms),
      std::max(0.0, times.overlap_efficiency()) * 100.0, ranks, overlap ? "overlapped" : "not overlapped");
  metrics.write("summary", {{"test_accuracy", eval.accuracy()},
                            {"images_per_sec", images_per_sec},
                            {"step_ms", step_ms},
                            {"steps", total_steps},
                            {"epochs", static_cast<double>(total_steps) /
                                           static_cast<double>(steps_per_epoch)},
                            {"test_loss", eval.mean_loss()},
                            {"last_loss", last_loss},
                            {"model", o.model},
                            {"batch_size", o.batch_size},
                            {"global_batch", global_batch},
                            {"world_size", int64_t{ranks}},
                            {"ranks", int64_t{ranks}},
                            {"compute_ms", times.mean(times.compute_ms)},
                            {"comm_ms", times.mean(times.comm_ms)},
                            {"exposed_comm_ms", times.mean(times.exposed_ms)},
                            {"overlap_efficiency", times.overlap_efficiency()},
                            {"overlap", overlap},
                            {"allreduce", o.allreduce},
                            {"buckets", bucket_count},
                            {"threads", int64_t{o.threads}},
                            {"ema", ema.has_value()},
                            {"params", model->num_params()},
                            {"peak_rss_mb", peak_rss_mb()},
                            {"data_dir", data_dir}});
  if (!o.save_params.empty() && rank == 0) {
    save_params(o.save_params, params);
    spdlog::info("saved {} parameters to {}", params.size(), o.save_params);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringtrain mnist_train: data-parallel MNIST training (mpirun -np N mnist_train)"};
  Options options;
  add_flags(app, options);
  CLI11_PARSE(app, argc, argv);
  // THREAD_MULTIPLE: the overlap engine's communication thread calls MPI.
  MpiSession session(&argc, &argv);
  int rank = 0, ranks = 1;
  try {
    MpiComm comm;
    rank = comm.rank();
    ranks = comm.size();
    return run(options, comm);
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    if (ranks > 1) {
      spdlog::error("rank {} of {} failed; ending the whole job", rank, ranks);
      MpiSession::abort_job(1);  // so no other rank waits forever on this one
    }
    return 1;
  }
}
