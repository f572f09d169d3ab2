// mnist_train's flags: every option with its help text and its allowed range. A value outside
// its range is refused by CLI11 before anything starts (exit 2, naming the flag and the range);
// the checks that need the rank count or the data (check_derived_ranges) are made in run().
//
// The ranges are wider than any real run and narrow enough that nothing computed from them
// can overflow: step counts and step numbers up to kMaxSteps (so steps x global batch, the
// samples behind every images/s figure, fits an int64), seconds up to a week (a steady_clock
// duration holds 292 years of nanoseconds), rates and factors inside float.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "options.h"
#include "ringtrain/check.h"

namespace ringtrain::app {

namespace {

constexpr int64_t kMaxSteps = 1'000'000'000'000;  // steps, intervals, step numbers: 1e12
constexpr int64_t kMaxBatch = 1'000'000'000;      // x any int rank count stays inside int64
constexpr int64_t kMaxRanks = 1'000'000;          // rank numbers and counts of ranks
constexpr double kWeekS = 7 * 24 * 3600.0;        // timeouts and sleeps, in seconds
constexpr double kMaxFactor = 1e6;                // --lr, --weight-decay, --adam-epsilon, MB

// A bound as the messages print it: whole numbers in full, others in their shortest exact form.
std::string show(long double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e16)
    return fmt::format("{}", static_cast<int64_t>(value));
  return fmt::format("{}", static_cast<double>(value));
}

// [lo, hi], with either end open.
struct Interval {
  long double lo, hi;
  bool lo_open = false, hi_open = false;
  bool contains(long double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  std::string text() const {
    return fmt::format("{}{}, {}{}", lo_open ? "(" : "[", show(lo), show(hi), hi_open ? ")" : "]");
  }
};

// A CLI11 validator from `check` (the text -> "" or what is wrong with it). CLI11 puts the
// option's name before the message ("--lr: must be ..."), except for a hidden option (the
// testing-only flags, group ""), whose name it leaves out: for those, pass the name as
// `hidden_flag`, and the message is thrown with it, past CLI11's catch of validation errors
// (main() exits 2 all the same).
CLI::Validator validator(std::function<std::string(const std::string&)> check,
                         const std::string& description, const std::string& hidden_flag) {
  return CLI::Validator(
      [check = std::move(check), hidden_flag](const std::string& text) -> std::string {
        std::string message = check(text);
        if (!message.empty() && !hidden_flag.empty())
          throw CLI::ParseError(hidden_flag + ": " + message, CLI::ExitCodes::ValidationError);
        return message;
      },
      description);
}

// An integer flag of type T in [lo, hi]. The text is read as CLI11 will convert it (strtoll,
// base 0: 0x1f is hex, 017 octal), so the value checked is the value used; a number beyond
// int64 (which strtoll would silently clamp) and a fraction are refused.
template <typename T>
CLI::Validator whole_number(int64_t lo, int64_t hi, const std::string& hidden_flag = "") {
  static_assert(std::is_signed_v<T> && std::is_integral_v<T>);
  RINGTRAIN_CHECK(
      std::numeric_limits<T>::min() <= lo && lo <= hi && hi <= std::numeric_limits<T>::max(),
      "flag range [{}, {}] outside its type", lo, hi);
  const std::string range =
      Interval{static_cast<long double>(lo), static_cast<long double>(hi)}.text();
  return validator(
      [lo, hi, range](const std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 0);
        if (text.empty() || end != text.c_str() + text.size())
          return fmt::format("must be a whole number in {}, got '{}'", range, text);
        if (errno == ERANGE || value < lo || value > hi)
          return fmt::format("must be in {}, got {}", range, text);
        return {};
      },
      range, hidden_flag);
}

// --seed: any uint64. CLI11 reads "-1" as 2^64 - 1 (strtoull negates); a minus sign is refused
// instead, so that a seed is the number typed.
CLI::Validator seed_number() {
  const std::string range = fmt::format("[0, {}]", std::numeric_limits<uint64_t>::max());
  return validator(
      [range](const std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const size_t first = text.find_first_not_of(" \t");
        const bool negative = first != std::string::npos && text[first] == '-';
        std::strtoull(text.c_str(), &end, 0);
        if (text.empty() || negative || end != text.c_str() + text.size())
          return fmt::format("must be a whole number in {}, got '{}'", range, text);
        if (errno == ERANGE) return fmt::format("must be in {}, got {}", range, text);
        return {};
      },
      range, "");
}

// A floating-point flag of type T (float or double) in `in`: finite, and inside it both as
// typed and once converted to T, so that "0.9999999999" (1 as a float) is not in [0, 1) and
// "1e-50" (0 as a float) is not > 0. The text is read as CLI11 reads it (strtold).
template <typename T>
CLI::Validator real_number(Interval in, const std::string& hidden_flag = "") {
  static_assert(std::is_floating_point_v<T>);
  RINGTRAIN_CHECK(in.hi <= std::numeric_limits<T>::max(), "flag range {} outside its type",
                  in.text());
  const std::string range = in.text();
  return validator(
      [in, range](const std::string& text) -> std::string {
        char* end = nullptr;
        const long double value = std::strtold(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value))
          return fmt::format("must be a finite number in {}, got '{}'", range, text);
        if (!in.contains(value)) return fmt::format("must be in {}, got {}", range, text);
        // In range as typed, so inside T: the conversion is defined.
        const T converted = static_cast<T>(value);
        if (!in.contains(converted))
          return fmt::format("must be in {}, got {} ({} as a {})", range, text, show(converted),
                             sizeof(T) == sizeof(float) ? "float" : "double");
        return {};
      },
      range, hidden_flag);
}

const Interval kUnit{0, 1, false, true};  // [0, 1): momentum, betas, decays

// A choice flag whose value is an enum: the names are checked as CLI::IsMember checks them
// (the same messages), then the enum is set.
template <typename Enum>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, Enum& target,
                        std::vector<std::pair<std::string, Enum>> names, const std::string& help) {
  std::vector<std::string> accepted;
  std::string current;
  for (const auto& [name, value] : names) {
    accepted.push_back(name);
    if (value == target) current = name;
  }
  return app
      .add_option_function<std::string>(
          flag,
          [&target, names](const std::string& given) {
            for (const auto& [name, value] : names)
              if (name == given) target = value;
          },
          help)
      ->check(CLI::IsMember(accepted))
      ->default_str(current);
}

}  // namespace

const char* to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::kRing:
      return "ring";
    case Strategy::kParameterServers:
      return "ps";
    case Strategy::kLocalSgd:
      return "local-sgd";
  }
  return "?";
}

const char* to_string(OverlapChoice choice) {
  return choice == OverlapChoice::kAuto ? "auto" : choice == OverlapChoice::kOn ? "on" : "off";
}

const char* to_string(LrScaling scaling) {
  return scaling == LrScaling::kLinear ? "linear" : "none";
}

namespace {

// The data, the model, the batch, the optimizer and its schedule, the seed.
void add_training_flags(CLI::App& app, Options& o) {
  app.add_option("--data-dir", o.data_dir,
                 "Folder with the four MNIST-format IDX files (.gz or plain). Default: "
                 "$RINGTRAIN_DATA, else data/mnist, else Debian's Fashion-MNIST");
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--hidden", o.hidden, "MLP hidden widths, e.g. 4096,4096 (default 500,500)")
      ->delimiter(',')
      ->check(whole_number<int64_t>(1, 65536));
  auto* epochs = app.add_option("--epochs", o.epochs, "Passes over the training set")
                     ->check(whole_number<int64_t>(1, kMaxSteps));
  app.add_option("--steps", o.steps, "Train for exactly this many steps instead of --epochs")
      ->check(whole_number<int64_t>(1, kMaxSteps))
      ->excludes(epochs);
  app.add_option("--batch-size", o.batch_size, "Samples per step (per rank)")
      ->check(whole_number<int64_t>(1, kMaxBatch));
  app.add_option("--global-batch-size", o.global_batch_size,
                 "Samples per optimizer step over all ranks (instead of --batch-size x ranks "
                 "x --accumulate-steps): each rank takes this / (ranks x passes) per pass")
      ->check(whole_number<int64_t>(1, kMaxBatch));
  app.add_option("--accumulate-steps", o.accumulate_steps,
                 "Forward/backward passes per optimizer step, each on its own batch of "
                 "--batch-size, gradients summed locally and averaged once after the last "
                 "(DDP's no_sync); --steps, schedules and checkpoints count optimizer steps")
      ->check(whole_number<int64_t>(1, kMaxRanks));
  app.add_flag("--reproducible", o.reproducible,
               "The same bits for any rank count: the global batch in micro-shards of "
               "--micro-batch rows, their gradients summed exactly (needs --global-batch-size)");
  app.add_option("--micro-batch", o.micro_batch,
                 "--reproducible: rows per micro-shard; the rank count must divide "
                 "global batch / this (default 8)")
      ->check(whole_number<int64_t>(1, kMaxBatch));
  app.add_option("--lr", o.schedule.base_lr, "Base learning rate")
      ->check(real_number<float>({0, kMaxFactor, true}));
  app.add_option("--optimizer", o.optimizer.kind, "sgd or adam")
      ->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--momentum", o.optimizer.momentum, "SGD momentum (PyTorch form)")
      ->check(real_number<float>(kUnit));
  app.add_flag("--nesterov", o.optimizer.nesterov, "Nesterov momentum for SGD");
  app.add_option("--weight-decay", o.optimizer.weight_decay, "L2 penalty added to the gradient")
      ->check(real_number<float>({0, kMaxFactor}));
  app.add_option("--adam-beta1", o.optimizer.beta1, "Adam beta1")->check(real_number<float>(kUnit));
  app.add_option("--adam-beta2", o.optimizer.beta2, "Adam beta2")->check(real_number<float>(kUnit));
  app.add_option("--adam-epsilon", o.optimizer.epsilon, "Adam epsilon")
      ->check(real_number<float>({0, kMaxFactor, true}));
  app.add_option("--lr-schedule", o.schedule.kind, "constant, exponential or linear-warmup")
      ->check(CLI::IsMember({"constant", "exponential", "linear-warmup"}));
  app.add_option("--lr-decay-rate", o.schedule.decay_rate, "exponential: factor per decay period")
      ->check(real_number<float>({0, 1, true}));
  app.add_option("--lr-decay-steps", o.schedule.decay_steps,
                 "exponential: steps per decay period (default 60000/128)")
      ->check(real_number<double>({0, static_cast<double>(kMaxSteps), true}));
  app.add_flag("--lr-staircase", o.schedule.staircase, "exponential: decay in whole periods");
  auto* warmup_steps = app.add_option("--warmup-steps", o.schedule.warmup_steps,
                                      "linear-warmup: steps to reach the scaled rate")
                           ->check(whole_number<int64_t>(0, kMaxSteps));
  app.add_option("--warmup-epochs", o.warmup_epochs, "linear-warmup: the same, in epochs")
      ->check(real_number<double>({0, static_cast<double>(kMaxSteps)}))
      ->excludes(warmup_steps);
  app.add_option("--reference-batch", o.schedule.reference_batch,
                 "linear-warmup: the batch the base rate was tuned for (default, or 0: this run's "
                 "global batch)")
      ->check(whole_number<int64_t>(0, kMaxSteps));
  app.add_option("--ema-decay", o.ema_decay,
                 "Keep an exponential moving average of the weights and evaluate with it "
                 "(e.g. 0.99); 0 disables")
      ->check(real_number<float>(kUnit));
  app.add_option("--seed", o.seed, "Seed for initial weights and data order")->check(seed_number());
  app.add_option("--threads", o.threads, "CPU math threads")->check(whole_number<int>(1, 1024));
  add_choice(app, "--lr-scaling", o.lr_scaling,
             {{"none", LrScaling::kNone}, {"linear", LrScaling::kLinear}},
             "linear: the rate ramps from --lr to --lr x ranks over --warmup-epochs or "
             "--warmup-steps (Goyal et al.)");
}

// Where and how each rank computes.
void add_device_flags(CLI::App& app, Options& o) {
  app.add_option("--device", o.device,
                 "Where to train: cuda (the GPU given by this rank's local rank), cpu, or auto "
                 "(cuda when this build has the GPU path and a GPU is visible, else cpu)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  app.add_flag("--cuda-graphs", o.cuda_graphs,
               "GPU, one rank: capture the step's upload, forward, loss and backward once as a "
               "CUDA graph and replay it (one launch per step instead of one per kernel; same "
               "results, bit for bit)");
  add_choice(app, "--conv-impl", o.conv_impl,
             {{"direct", ConvImpl::kDirect}, {"cudnn", ConvImpl::kCudnn}},
             "GPU Conv2D and MaxPool2D: direct (our kernels, the CPU's summation order and "
             "pooling tie rule) or cudnn");
  app.add_flag("--data-on-gpu", o.data_on_gpu,
               "GPU: copy the training set to the GPU once and gather each batch there (no "
               "image upload per step; the same batches, bit for bit)");
}

// What the run reports and writes, and how often.
void add_output_flags(CLI::App& app, Options& o) {
  app.add_option("--log-every", o.log_every, "Steps between progress lines (0: none)")
      ->check(whole_number<int64_t>(0, kMaxSteps));
  app.add_option("--eval-every", o.eval_every,
                 "Steps between test evaluations (0: only at the end)")
      ->check(whole_number<int64_t>(0, kMaxSteps));
  app.add_option("--eval-batch", o.eval_batch, "Batch size for evaluation")
      ->check(whole_number<int64_t>(1, kMaxSteps));
  app.add_option("--metrics-out", o.metrics_out, "Write JSON lines (train, eval, summary) here");
  app.add_option("--save-params", o.save_params,
                 "Write the final flat parameter buffer here (RTPARAMS format)");
  app.add_option("--export-onnx", o.export_onnx,
                 "Write the final model (the EMA weights under --ema-decay) here as ONNX "
                 "(opset 13; input float [N,1,28,28] pixels / 255; outputs logits, probabilities)");
  app.add_option("--export-safetensors", o.export_safetensors,
                 "Write the final weights (the EMA ones under --ema-decay) here as safetensors, "
                 "with PyTorch's names and shapes (fc1.weight [out,in], conv1.weight "
                 "[out,in,3,3], ...)");
  app.add_option("--timeline", o.timeline,
                 "Write a Chrome trace of every rank's steps, layers and bucket allreduces "
                 "here (rank 0 writes one file; open it in ui.perfetto.dev)");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_option("--check-replicas", o.check_replicas,
                 "Every K steps (and at the end), check that all ranks hold identical "
                 "parameters (0: only at the end)")
      ->check(whole_number<int64_t>(0, kMaxSteps));
}

// How the gradients are averaged.
void add_averaging_flags(CLI::App& app, Options& o) {
  add_choice(app, "--allreduce", o.allreduce,
             {{"ring", AllreduceAlgorithm::kRing}, {"mpi", AllreduceAlgorithm::kLibrary}},
             "Averaging (of the gradients; under local-sgd of the parameters): ring (ours) or "
             "mpi (the library's: MPI_Allreduce, or ncclAllReduce on a GPU)");
  add_choice(app, "--grad-wire", o.grad_wire,
             {{"fp32", GradWire::kFp32}, {"bf16", GradWire::kBf16}, {"fp16", GradWire::kFp16}},
             "What the gradient ring sends (--allreduce ring, --device cpu): fp32, or 16-bit "
             "bf16 / fp16 values (half the bytes; partial sums stay fp32, fp16 is scaled per "
             "bucket so that it cannot overflow)");
  auto* overlap = add_choice(
      app, "--overlap", o.overlap,
      {{"auto", OverlapChoice::kAuto}, {"on", OverlapChoice::kOn}, {"off", OverlapChoice::kOff}},
      "Average gradients while backward runs: on, off, or auto (on unless this node's ranks "
      "x --threads already fill its cores, where the communication thread can only take "
      "cycles from backward)");
  app.add_flag_callback(
         "--no-overlap", [&o] { o.overlap = OverlapChoice::kOff; },
         "Average all gradients after backward (the baseline): --overlap off")
      ->excludes(overlap);
  app.add_option("--fusion-threshold-mb", o.fusion_threshold_mb,
                 "Gradient bucket size in MB (0: one bucket for everything)")
      ->check(real_number<double>({0, kMaxFactor}));
  app.add_option("--first-bucket-mb", o.first_bucket_mb,
                 "Size of the first (last layers') bucket in MB: small, so communication starts "
                 "early")
      ->check(real_number<double>({0, kMaxFactor}));
}

// The strategies beside the ring: parameter servers and local SGD.
void add_strategy_flags(CLI::App& app, Options& o) {
  add_choice(app, "--strategy", o.strategy,
             {{"ring", Strategy::kRing},
              {"ps", Strategy::kParameterServers},
              {"local-sgd", Strategy::kLocalSgd}},
             "ring: every rank a replica, gradients averaged by the ring (default); ps: the "
             "first --num-ps ranks are parameter servers, the rest workers; local-sgd: every "
             "rank steps alone and the parameters are averaged every --average-every steps");
  app.add_option("--num-ps", o.num_ps, "--strategy ps: how many of the ranks are servers")
      ->check(whole_number<int>(1, kMaxRanks));
  add_choice(app, "--ps-mode", o.ps_mode, {{"sync", PsMode::kSync}, {"async", PsMode::kAsync}},
             "--strategy ps: sync (each update averages the first "
             "--replicas-to-aggregate gradients of the step) or async (each gradient is "
             "applied on arrival, at most --max-staleness updates old)");
  app.add_option("--replicas-to-aggregate", o.replicas_to_aggregate,
                 "--ps-mode sync: gradients per update (default: every worker; fewer leaves "
                 "backup workers, whose late gradients are dropped)")
      ->check(whole_number<int>(1, kMaxRanks));
  app.add_option("--max-staleness", o.max_staleness,
                 "--ps-mode async: the most updates a gradient's parameters may be behind the "
                 "server's; an older one is sent back and recomputed (default: 2 x workers)")
      ->check(whole_number<int64_t>(0, kMaxSteps));
  app.add_option("--average-every", o.average_every,
                 "--strategy local-sgd: steps between parameter averages (1: every step)")
      ->check(whole_number<int64_t>(1, kMaxSteps));
}

// Checkpoints, resuming, the watchdog and the NaN guard.
void add_failure_flags(CLI::App& app, Options& o) {
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Write checkpoints here (the chief, rank 0, writes) and resume from them");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "Steps between checkpoints (0: none by count); a last one is written at the end")
      ->check(whole_number<int64_t>(0, kMaxSteps));
  app.add_option("--checkpoint-secs", o.checkpoint_secs,
                 "Seconds between checkpoints (0: none by time)")
      ->check(real_number<double>({0, kWeekS}));
  app.add_option("--keep-checkpoints", o.keep_checkpoints, "How many checkpoints to keep")
      ->check(whole_number<int>(1, 1'000'000));
  app.add_option("--resume", o.resume,
                 "auto: continue from the newest valid checkpoint in --checkpoint-dir if there "
                 "is one; never: refuse a directory that has checkpoints; or a checkpoint file");
  app.add_option("--collective-timeout", o.collective_timeout,
                 "Seconds a collective may go without progress before the watchdog ends the job "
                 "and reports every rank's state")
      ->check(real_number<double>({0, kWeekS, true}));
  app.add_flag("--check-finite", o.check_finite,
               "Skip the update of a step whose loss or averaged gradients hold NaN or Inf on "
               "any rank (decided identically on all ranks)");
  app.add_option("--max-bad-steps", o.max_bad_steps,
                 "--check-finite: stop the job after this many consecutive skipped steps")
      ->check(whole_number<int64_t>(1, kMaxSteps));
}

// The testing-only flags (hidden, so their checks name them): a rank number or a step number,
// -1 for none, and sleeps of up to a week in milliseconds.
void add_test_flags(CLI::App& app, Options& o) {
  const auto test_option = [&app](const char* flag, auto& value, const char* help) {
    return app.add_option(flag, value, help)->group("");
  };
  const auto test_rank = [&](const char* flag, int& value, const char* help) {
    return test_option(flag, value, help)->check(whole_number<int>(-1, kMaxRanks, flag));
  };
  const auto test_step = [&](const char* flag, int64_t& value, const char* help) {
    return test_option(flag, value, help)->check(whole_number<int64_t>(-1, kMaxSteps, flag));
  };
  const auto test_ms = [&](const char* flag, double& value, const char* help) {
    return test_option(flag, value, help)->check(real_number<double>({0, kWeekS * 1000}, flag));
  };
  app.add_option("--test-kill-in-checkpoint", o.test_kill_in_checkpoint,
                 "Testing only: the chief kills itself (SIGKILL) at this point of a checkpoint "
                 "write...")
      ->check(CLI::IsMember({"partial", "written", "placed", "rotating"}))
      ->group("");
  test_step("--test-kill-in-checkpoint-step", o.test_kill_in_checkpoint_step,
            "...of the checkpoint of this step");
  test_rank("--test-preempt-rank", o.test_preempt_rank,
            "Testing only: this rank behaves as if SIGTERM arrived...");
  test_step("--test-preempt-at-step", o.test_preempt_at_step, "...when it starts this step");
  test_ms("--test-comm-delay-ms", o.test_comm_delay_ms,
          "Testing only: sleep this long before each bucket's reduction");
  test_rank("--test-perturb-rank", o.test_perturb_rank,
            "Testing only: after the first step, nudge one parameter on this rank so that "
            "the replica check must catch it");
  test_rank("--test-fail-rank", o.test_fail_rank, "Testing only: this rank throws...");
  test_step("--test-fail-at-step", o.test_fail_at_step, "...when it starts this step");
  test_rank("--test-stall-rank", o.test_stall_rank, "Testing only: this rank sleeps...");
  test_step("--test-stall-at-step", o.test_stall_at_step, "...when it starts this step...");
  app.add_option("--test-stall-seconds", o.test_stall_seconds, "...for this long (seconds)")
      ->group("")
      ->check(real_number<double>({0, kWeekS}, "--test-stall-seconds"));
  test_rank("--test-slow-rank", o.test_slow_rank,
            "Testing only: this rank sleeps --test-slow-ms before every step");
  test_ms("--test-slow-ms", o.test_slow_ms, "...this long");
  test_rank("--test-nan-rank", o.test_nan_rank,
            "Testing only: this rank puts a NaN into its batch...");
  app.add_option("--test-nan-steps", o.test_nan_steps, "...at these steps")
      ->delimiter(',')
      ->group("")
      ->check(whole_number<int64_t>(0, kMaxSteps, "--test-nan-steps"));
  app.add_option("--test-dump-logits", o.test_dump_logits,
                 "Testing only: the chief writes the test set's logits under the exported "
                 "weights here (float32 [count, classes], little-endian)")
      ->group("");
  app.add_flag("--test-stall-at-setup", o.test_stall_at_setup,
               "Testing only: --test-stall-rank sleeps --test-stall-seconds in set-up, before "
               "the configuration check")
      ->group("");
  app.add_flag("--test-stall-after-end", o.test_stall_after_end,
               "Testing only: --test-stall-rank sleeps --test-stall-seconds after its last "
               "writes, before the final barrier")
      ->group("");
  test_ms("--test-slow-transport-ms", o.test_slow_transport_ms,
          "Testing only: hold every 4 MiB piece of a broadcast or MPI_Allreduce this long, "
          "as a slow link would");
  test_ms("--test-long-compute-ms", o.test_long_compute_ms,
          "Testing only (--strategy ps): every worker step computes at least this long "
          "(more forward passes, each layer reporting progress)");
}

}  // namespace

void add_flags(CLI::App& app, Options& o) {
  add_training_flags(app, o);
  add_device_flags(app, o);
  add_output_flags(app, o);
  add_averaging_flags(app, o);
  add_strategy_flags(app, o);
  add_failure_flags(app, o);
  add_test_flags(app, o);
}

void check_derived_ranges(const Options& o, int data_ranks, int64_t train_images) {
  RINGTRAIN_CHECK(data_ranks >= 1 && train_images >= 0,
                  "check_derived_ranges: {} data ranks, {} training images", data_ranks,
                  train_images);
  // An optimizer step takes a batch per rank and pass: batch x ranks x passes <= images,
  // compared as a division: the product may not fit.
  const int64_t shares = int64_t{data_ranks} * o.accumulate_steps;  // both <= 1e6
  const std::string passes =
      o.accumulate_steps > 1 ? fmt::format(" x --accumulate-steps {}", o.accumulate_steps) : "";
  const int64_t largest_batch = train_images / shares;
  if (largest_batch < 1)
    refuse_usage(fmt::format(
        "the {} training images cannot give each of the {} rank(s){} a sample: use at most {} "
        "rank(s){}",
        train_images, data_ranks, o.accumulate_steps > 1 ? " and passes" : "",
        train_images / o.accumulate_steps, o.accumulate_steps > 1 ? " or fewer passes" : ""));
  if (o.batch_size > largest_batch)
    refuse_usage(
        fmt::format("the global batch ({} rank(s){} x --batch-size {}) is larger than the {} "
                    "training images: on {} rank(s) --batch-size must be in [1, {}] (or use "
                    "fewer ranks)",
                    data_ranks, passes, o.batch_size, train_images, data_ranks, largest_batch));
  const int64_t global_batch = o.batch_size * shares;           // <= train_images
  const int64_t steps_per_epoch = train_images / global_batch;  // >= 1
  const int64_t largest_epochs = kMaxSteps / steps_per_epoch;
  if (o.steps == 0 && o.epochs > largest_epochs)
    refuse_usage(
        fmt::format("--epochs {} x {} steps per epoch is more than {} steps: at this global "
                    "batch ({}) --epochs must be in [1, {}] (or pass --steps)",
                    o.epochs, steps_per_epoch, kMaxSteps, global_batch, largest_epochs));
  const double largest_warmup =
      static_cast<double>(kMaxSteps) / static_cast<double>(steps_per_epoch);
  if (o.warmup_epochs > largest_warmup)
    refuse_usage(fmt::format(
        "--warmup-epochs {} x {} steps per epoch is more than {} steps: at this "
        "global batch ({}) --warmup-epochs must be in [0, {}] (or pass "
        "--warmup-steps)",
        o.warmup_epochs, steps_per_epoch, kMaxSteps, global_batch, show(largest_warmup)));
  // The samples a run trains (steps x global batch) are counted in an int64.
  const int64_t total_steps = o.steps > 0 ? o.steps : o.epochs * steps_per_epoch;
  int64_t samples = 0;
  if (__builtin_mul_overflow(total_steps, global_batch, &samples))
    refuse_usage(
        fmt::format("{} steps x a global batch of {} is more samples than an int64 holds: at "
                    "this global batch a run may take at most {} steps (--steps, or --epochs x "
                    "{} steps per epoch)",
                    total_steps, global_batch, std::numeric_limits<int64_t>::max() / global_batch,
                    steps_per_epoch));
}

}  // namespace ringtrain::app
