// mnist_train: trains the source documents' MNIST models (mlp, cnn) on one process.
// The loop lives here, in plain sight: sample a batch, step, log, evaluate, summarise.
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ringtrain/check.h"
#include "ringtrain/data.h"
#include "ringtrain/log.h"
#include "ringtrain/model.h"
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
  app.add_option("--eval-every", o.eval_every, "Steps between test evaluations (0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-batch", o.eval_batch, "Batch size for evaluation")
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-out", o.metrics_out, "Write JSON lines (train, eval, summary) here");
  app.add_option("--save-params", o.save_params,
                 "Write the final flat parameter buffer here (RTPARAMS format)");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error");
}

// Evaluates the test set with the given weights in the model (restoring the trained ones).
EvalResult evaluate_test(Model& model, const Dataset& test, const Options& o,
                         const WeightEma* ema, Batch& scratch, Context& ctx) {
  if (ema == nullptr) return evaluate(model, test, 0, test.count, o.eval_batch, scratch, ctx);
  Tensor& params = model.params();
  std::vector<float> trained(params.data(), params.data() + params.numel());
  std::copy(ema->shadow().begin(), ema->shadow().end(), params.data());
  EvalResult result = evaluate(model, test, 0, test.count, o.eval_batch, scratch, ctx);
  std::copy(trained.begin(), trained.end(), params.data());
  return result;
}

int run(const Options& o) {
  setup_logging(0, o.log_level);
  set_cpu_threads(o.threads);
  Context ctx;
  ctx.threads = o.threads;

  const std::string data_dir = o.data_dir.empty() ? default_data_dir() : o.data_dir;
  spdlog::info("data: {}{}", data_dir, o.data_dir.empty() ? " (default; --data-dir to change)" : "");
  const MnistData data = load_mnist_dir(data_dir);
  spdlog::info("data: {} train, {} test images of {}x{}", data.train.count, data.test.count,
               data.train.rows, data.train.cols);

  ModelSpec spec{.name = o.model, .hidden = o.hidden, .height = data.train.rows,
                 .width = data.train.cols, .classes = 10};
  std::unique_ptr<Model> model = make_model(spec);
  model->init_params(o.seed);
  spdlog::info("model {}:\n{}", o.model, model->summary());

  const int64_t steps_per_epoch = data.train.count / o.batch_size;
  RINGTRAIN_CHECK(steps_per_epoch >= 1, "--batch-size {} is larger than the {} training images",
                  o.batch_size, data.train.count);
  const int64_t total_steps = o.steps > 0 ? o.steps : o.epochs * steps_per_epoch;

  LrSchedule schedule = o.schedule;
  schedule.global_batch = o.batch_size;
  if (schedule.reference_batch == 0) schedule.reference_batch = o.batch_size;
  if (o.warmup_epochs > 0) {
    schedule.warmup_steps = static_cast<int64_t>(o.warmup_epochs * static_cast<double>(steps_per_epoch));
  }
  validate(schedule);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(o.optimizer, model->num_params());
  std::optional<WeightEma> ema;
  if (o.ema_decay > 0.0f) {
    ema.emplace(o.ema_decay, std::span<const float>(model->params().data(),
                                                    static_cast<size_t>(model->num_params())));
  }
  MetricsWriter metrics = o.metrics_out.empty() ? MetricsWriter() : MetricsWriter(o.metrics_out);
  spdlog::info("training: {} steps ({} per epoch), batch {}, global batch {}, {} lr {} ({}), "
               "{} thread(s), seed {}",
               total_steps, steps_per_epoch, o.batch_size, o.batch_size, optimizer->name(),
               schedule.base_lr, schedule.kind, o.threads, o.seed);

  EpochSampler sampler(data.train.count, o.seed);
  Batch batch, eval_scratch;
  StepWorkspace workspace;
  ProgressBar progress(total_steps);
  double train_seconds = 0.0, window_loss = 0.0, last_loss = 0.0;
  int64_t window_correct = 0, window_samples = 0, window_steps = 0;
  const std::span<float> params(model->params().data(), static_cast<size_t>(model->num_params()));

  for (int64_t step = 0; step < total_steps; ++step) {
    const auto start = Clock::now();
    const int64_t epoch = step / steps_per_epoch;
    const auto order = sampler.order(epoch);
    const auto indices = order.subspan(
        static_cast<size_t>((step % steps_per_epoch) * o.batch_size), static_cast<size_t>(o.batch_size));
    make_batch(data.train, indices, batch.images, batch.labels);
    const float lr = learning_rate(schedule, step);
    const StepStats stats = train_step(*model, *optimizer, batch, lr, workspace, ctx);
    if (ema) ema->update(params);
    train_seconds += std::chrono::duration<double>(Clock::now() - start).count();

    RINGTRAIN_CHECK(std::isfinite(stats.loss),
                    "the loss became {} at step {}: lower --lr (now {}) or check the data",
                    stats.loss, step, lr);
    window_loss += stats.loss;
    window_correct += stats.correct;
    window_samples += stats.samples;
    ++window_steps;
    last_loss = stats.loss;
    const int64_t done = step + 1;
    progress.update(done, fmt::format("epoch {} loss {:.4f} {:.0f} img/s", epoch + 1, stats.loss,
                                      static_cast<double>(done * o.batch_size) / train_seconds));
    if (o.log_every > 0 && (done % o.log_every == 0 || done == total_steps)) {
      const double mean_loss = window_loss / static_cast<double>(window_steps);
      const double accuracy = static_cast<double>(window_correct) / static_cast<double>(window_samples);
      if (!progress.enabled()) {
        spdlog::info("step {}/{} epoch {} loss {:.4f} train acc {:.4f} lr {:.6g} {:.0f} img/s",
                     done, total_steps, epoch + 1, mean_loss, accuracy, lr,
                     static_cast<double>(done * o.batch_size) / train_seconds);
      }
      metrics.write("train", {{"step", done}, {"epoch", epoch + 1}, {"loss", mean_loss},
                              {"train_accuracy", accuracy}, {"lr", static_cast<double>(lr)}});
      window_loss = 0.0;
      window_correct = window_samples = window_steps = 0;
    }
    if (o.eval_every > 0 && done % o.eval_every == 0 && done != total_steps) {
      const EvalResult eval = evaluate_test(*model, data.test, o, ema ? &*ema : nullptr,
                                            eval_scratch, ctx);
      if (!progress.enabled()) {
        spdlog::info("step {} test accuracy {:.4f} loss {:.4f}", done, eval.accuracy(), eval.mean_loss());
      }
      metrics.write("eval", {{"step", done}, {"test_accuracy", eval.accuracy()},
                             {"test_loss", eval.mean_loss()}});
    }
  }
  progress.finish();

  const EvalResult eval = evaluate_test(*model, data.test, o, ema ? &*ema : nullptr,
                                        eval_scratch, ctx);
  const double images_per_sec = static_cast<double>(total_steps * o.batch_size) / train_seconds;
  const double step_ms = train_seconds * 1000.0 / static_cast<double>(total_steps);
  spdlog::info("summary: test accuracy {:.4f}{} ({} / {}), test loss {:.4f}, last batch loss {:.4f}",
               eval.accuracy(), ema ? " (EMA weights)" : "", eval.correct, eval.samples,
               eval.mean_loss(), last_loss);
  spdlog::info("summary: {} steps in {:.2f} s: {:.0f} images/s, {:.3f} ms/step, peak RSS {:.0f} MB",
               total_steps, train_seconds, images_per_sec, step_ms, peak_rss_mb());
  metrics.write("summary", {{"test_accuracy", eval.accuracy()},
                            {"images_per_sec", images_per_sec},
                            {"step_ms", step_ms},
                            {"steps", total_steps},
                            {"epochs", static_cast<double>(total_steps) / static_cast<double>(steps_per_epoch)},
                            {"test_loss", eval.mean_loss()},
                            {"last_loss", last_loss},
                            {"model", o.model},
                            {"batch_size", o.batch_size},
                            {"global_batch", o.batch_size},
                            {"ranks", int64_t{1}},
                            {"threads", int64_t{o.threads}},
                            {"ema", ema.has_value()},
                            {"params", model->num_params()},
                            {"peak_rss_mb", peak_rss_mb()},
                            {"data_dir", data_dir}});
  if (!o.save_params.empty()) {
    save_params(o.save_params, params);
    spdlog::info("saved {} parameters to {}", params.size(), o.save_params);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringtrain mnist_train: data-parallel MNIST training"};
  Options options;
  add_flags(app, options);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(options);
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    return 1;
  }
}
