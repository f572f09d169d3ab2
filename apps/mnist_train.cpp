// mnist_train: trains the source documents' MNIST models (mlp, cnn), data-parallel over the
// ranks of `mpirun -np N` (or on one process without mpirun). The loop lives here, in plain
// sight: take this rank's share of the global batch, step (the ring averages the gradients
// while backward runs), log, evaluate, checkpoint, summarise.
//
// Before training, the ranks compare their configurations (a mismatch would hang or diverge)
// and resume from the newest valid checkpoint; during training a watchdog ends the job when a
// collective stops making progress. Failures and exit codes: docs/failures.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "mnist_train.h"
#include "ringtrain/bucketer.h"
#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/data.h"
#include "ringtrain/distributed.h"
#include "ringtrain/gpu.h"
#include "ringtrain/log.h"
#include "ringtrain/model.h"
#include "ringtrain/mpi_comm.h"
#include "ringtrain/optim.h"
#include "ringtrain/preemption.h"
#include "ringtrain/report.h"
#include "ringtrain/train.h"
#include "ringtrain/watchdog.h"

#ifdef RINGTRAIN_HAVE_GPU
#include "ringtrain/device_bucketer.h"
#include "ringtrain/gpu_context.h"
#include "ringtrain/nccl_comm.h"
#include "ringtrain/staged_ring.h"
#endif

namespace ringtrain::app {

[[noreturn]] void refuse(const std::string& message) {
  throw Error(message, ExitCode::kBadInput, /*on_every_rank=*/true);
}

std::string describe_schedule(const LrSchedule& s) {
  return fmt::format("{} lr {} decay {} per {} staircase {} warmup {} batch {} reference {}",
                     s.kind, s.base_lr, s.decay_rate, s.decay_steps, s.staircase, s.warmup_steps,
                     s.global_batch, s.reference_batch);
}

void check_checkpoint_fits(const Checkpoint& c, const Options& o, const Model& model,
                           const Optimizer& optimizer, size_t optimizer_buffers) {
  if (c.model != o.model || c.layers != model.signature() || c.num_params != model.num_params())
    refuse(fmt::format(
        "the checkpoint at step {} is of model {} ({}, {} parameters); this run "
        "builds {} ({}, {} parameters): use the same --model and --hidden, or "
        "another --checkpoint-dir",
        c.step, c.model, c.layers, c.num_params, o.model, model.signature(), model.num_params()));
  if (c.optimizer != optimizer.name() || c.optimizer_state.size() != optimizer_buffers)
    refuse(fmt::format(
        "the checkpoint at step {} holds {} state with {} buffer(s); this run's "
        "{} needs {}: use the optimizer flags of the run that wrote it",
        c.step, c.optimizer, c.optimizer_state.size(), optimizer.name(), optimizer_buffers));
  if (c.seed != o.seed)
    refuse(
        fmt::format("the checkpoint at step {} was written with --seed {}, this run has "
                    "--seed {}: the data order would change; pass --seed {}",
                    c.step, c.seed, o.seed, c.seed));
}

void stall_for_test(const Options& o, int rank, const std::string& where) {
  if (rank != o.test_stall_rank) return;
  spdlog::warn("--test-stall-rank: rank {} stalls for {:g} s {}", rank, o.test_stall_seconds,
               where);
  std::this_thread::sleep_for(std::chrono::duration<double>(o.test_stall_seconds));
}

void inject_test_failures(const Options& o, int rank, int64_t step) {
  if (rank == o.test_fail_rank && step == o.test_fail_at_step)
    RINGTRAIN_FAIL("--test-fail-rank: rank {} fails on purpose at step {}", rank, step);
  if (step == o.test_stall_at_step) stall_for_test(o, rank, fmt::format("at step {}", step));
  if (rank == o.test_slow_rank)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.test_slow_ms));
}

}  // namespace ringtrain::app

namespace {

using namespace ringtrain;
using namespace ringtrain::app;
using Clock = std::chrono::steady_clock;

// Evaluates the test set, split over the ranks, with the EMA weights when there are any
// (restoring the trained ones after).
// trained_scratch keeps a device model's trained weights meanwhile (allocated once: a new
// allocation would make --cuda-graphs recapture after every evaluation).
EvalResult evaluate_test(Comm& comm, Model& model, const Dataset& test, const Options& o,
                         const WeightEma* ema, Batch& scratch, Context& ctx,
                         Tensor& trained_scratch) {
  if (ema == nullptr) return evaluate_sharded(comm, model, test, o.eval_batch, scratch, ctx);
  if (model.device() != Device::kCpu) {  // device-to-device copies of the trained weights
    Tensor& params = model.params();
    Tensor& trained = trained_scratch;
    if (trained.device() != Device::kCuda) trained = Tensor(Device::kCuda);
    trained.resize(params.shape());
    copy_floats(trained.data(), Device::kCuda, params.data(), Device::kCuda, params.numel());
    copy_floats(params.data(), Device::kCuda, ema->shadow_data(), ema->device(), params.numel());
    EvalResult result = evaluate_sharded(comm, model, test, o.eval_batch, scratch, ctx);
    copy_floats(params.data(), Device::kCuda, trained.data(), Device::kCuda, params.numel());
    return result;
  }
  Tensor& params = model.params();
  std::vector<float> trained(params.data(), params.data() + params.numel());
  std::copy(ema->shadow().begin(), ema->shadow().end(), params.data());
  EvalResult result = evaluate_sharded(comm, model, test, o.eval_batch, scratch, ctx);
  std::copy(trained.begin(), trained.end(), params.data());
  return result;
}

std::string describe_optimizer(const OptimizerConfig& c) {
  return fmt::format("{} momentum {} nesterov {} wd {} betas {} {} eps {}", c.kind, c.momentum,
                     c.nesterov, c.weight_decay, c.beta1, c.beta2, c.epsilon);
}

template <typename T>
std::string join(const std::vector<T>& values) {
  return fmt::format("{}", fmt::join(values, ","));
}

// Everything that must be equal on every rank for the collectives to line up and the replicas
// to stay identical. Per-node settings (--threads, --overlap's decision) may differ.
std::vector<ConfigField> config_fields(const Options& o, const Model& model, const MnistData& data,
                                       Device device) {
  const auto data_hash = [](const Dataset& d) {
    return fmt::format("{} x {}x{} images {:016x} labels {:016x}", d.count, d.rows, d.cols,
                       hash_bytes(d.images.data(), d.images.size()),
                       hash_bytes(d.labels.data(), d.labels.size()));
  };
  return {
      {"code version", RINGTRAIN_CODE_VERSION},
      {"model", o.model + " " + join(o.hidden)},
      {"layers", model.signature()},
      {"parameters", std::to_string(model.num_params())},
      {"--batch-size", fmt::format("{}{}", o.batch_size, o.batch_size_given ? "" : " (default)")},
      {"--steps/--epochs", fmt::format("{} / {}", o.steps, o.epochs)},
      {"--seed", std::to_string(o.seed)},
      {"optimizer", describe_optimizer(o.optimizer)},
      {"lr schedule", describe_schedule(o.schedule) + fmt::format(" warmup-epochs {} scaling {}",
                                                                  o.warmup_epochs, o.lr_scaling)},
      {"--ema-decay", fmt::format("{}", o.ema_decay)},
      {"training data", data_hash(data.train)},
      {"test data", data_hash(data.test)},
      {"--allreduce", o.allreduce},
      // The transport follows the device (MPI for host gradients, NCCL for device ones): all
      // ranks must train on the same kind of device.
      {"device", to_string(device)},
      {"--conv-impl", o.conv_impl},
      {"buckets", fmt::format("first {} MB, then {} MB", o.first_bucket_mb, o.fusion_threshold_mb)},
      {"--check-replicas", std::to_string(o.check_replicas)},
      {"--eval-every/--eval-batch", fmt::format("{} / {}", o.eval_every, o.eval_batch)},
      {"--check-finite", fmt::format("{} (max {} bad steps)", o.check_finite, o.max_bad_steps)},
      {"--resume", o.resume},
      // The servers send the chief snapshots only when they know it writes checkpoints.
      {"--checkpoint-dir/--checkpoint-every (ps)",
       o.strategy == "ps" ? fmt::format("{} / {}", !o.checkpoint_dir.empty(), o.checkpoint_every)
                          : std::string()},
      {"strategy",
       fmt::format("{} num-ps {} mode {} aggregate {} staleness {} average-every {}", o.strategy,
                   o.num_ps, o.ps_mode, o.replicas_to_aggregate, o.max_staleness, o.average_every)},
  };
}

// The chief finds the checkpoint to resume from (and proves the checkpoint directory is
// writable); every rank receives its verified bytes, or the chief's error. Collective.
std::optional<Checkpoint> resolve_checkpoint(Comm& comm, const Options& o) {
  const PhaseScope phase(comm.board(), "checkpoint broadcast");
  std::vector<uint8_t> payload;
  int64_t status = 0;  // > 0: a checkpoint of that many bytes; 0: none; < 0: an error message
  if (comm.rank() == 0) {
    try {
      std::optional<CheckpointDir> dir;
      if (!o.checkpoint_dir.empty()) {
        dir.emplace(o.checkpoint_dir, o.keep_checkpoints);
        dir->ensure_writable();
        // A chief that died mid-write left its temporary; nobody else writes here now.
        for (const std::string& stale : dir->remove_stale_temporaries())
          spdlog::info("removed {}, the temporary of an interrupted checkpoint write", stale);
      }
      if (o.resume != "auto" && o.resume != "never") {
        payload = read_file_bytes(o.resume);
        const Checkpoint checked = decode_checkpoint(payload, o.resume);
        // Later files of another run in the directory would carry the names of this run's
        // next checkpoints (a name must mean one state) and outrank them in the rotation.
        const std::vector<std::string> later =
            dir ? dir->later_than(checked.step) : std::vector<std::string>{};
        if (!later.empty()) {
          throw Error(fmt::format("--resume {} is at step {}, but --checkpoint-dir {} already "
                                  "holds a later checkpoint ({}), of another run: this run would "
                                  "write other states under its names; use an empty "
                                  "--checkpoint-dir, or --resume auto to continue that run",
                                  o.resume, checked.step, o.checkpoint_dir, later.front()),
                      ExitCode::kBadInput);
        }
        spdlog::info("resuming from {} (--resume): step {}", o.resume, checked.step);
      } else if (dir) {
        std::vector<std::string> skipped;
        std::optional<CheckpointDir::Loaded> newest = dir->load_newest_valid(skipped);
        for (const std::string& why : skipped) spdlog::warn("skipping a checkpoint: {}", why);
        if (newest && o.resume == "never") {
          throw Error(fmt::format("--checkpoint-dir {} holds checkpoints (newest {}) and --resume "
                                  "is never: continue that run with --resume auto, or choose an "
                                  "empty directory; nothing there was changed",
                                  o.checkpoint_dir, newest->path),
                      ExitCode::kBadInput);
        }
        if (!newest && !skipped.empty()) {
          throw Error(fmt::format("--checkpoint-dir {}: none of its {} checkpoint(s) is valid "
                                  "(see the warnings above); move them away to start afresh",
                                  o.checkpoint_dir, skipped.size()),
                      ExitCode::kBadInput);
        }
        // Whatever carries a later step's name now is not a valid checkpoint (the newest valid
        // one was chosen): keep its bytes, but free the names this run is about to write.
        for (const std::string& path : dir->later_than(newest ? newest->checkpoint.step : 0)) {
          spdlog::warn(
              "{} is not a valid checkpoint and this run will write that step again: "
              "set aside as {}",
              path, dir->set_aside(path));
        }
        if (newest) {
          spdlog::info("resuming from {}: step {}", newest->path, newest->checkpoint.step);
          payload = std::move(newest->bytes);
        }
      }
      status = static_cast<int64_t>(payload.size());
    } catch (const Error& error) {
      const std::string message = error.what();
      payload.assign(message.begin(), message.end());
      status = -static_cast<int64_t>(payload.size());
    }
  }
  comm.broadcast(&status, sizeof(status), 0);
  payload.resize(static_cast<size_t>(status < 0 ? -status : status));
  if (!payload.empty()) comm.broadcast(payload.data(), payload.size(), 0);
  if (status < 0) {
    throw Error(std::string(payload.begin(), payload.end()), ExitCode::kBadInput,
                /*on_every_rank=*/true);
  }
  if (status == 0) return std::nullopt;
  return decode_checkpoint(
      payload, o.resume != "auto" && o.resume != "never" ? o.resume : "(broadcast from rank 0)");
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

bool all_finite(std::span<const float> values) {
  bool finite = true;
  for (const float v : values) finite &= std::isfinite(v);  // branch-free: the loop vectorises
  return finite;
}

// The flags of the strategies, checked against each other before anything starts (every rank
// decides the same from the same flags).
void check_strategy_flags(Options& o, int ranks) {
  const auto usage = [](const std::string& message) {
    throw Error(message, ExitCode::kUsage, /*on_every_rank=*/true);
  };
  const bool ps = o.strategy == "ps", local_sgd = o.strategy == "local-sgd";
  for (const std::string& flag : o.flags_given) {
    if (!ps && (flag == "--num-ps" || flag == "--ps-mode" || flag == "--replicas-to-aggregate" ||
                flag == "--max-staleness"))
      usage(
          fmt::format("{} is a flag of --strategy ps (this run: --strategy {})", flag, o.strategy));
    if (!local_sgd && flag == "--average-every")
      usage(
          fmt::format("--average-every is a flag of --strategy local-sgd (this run: --strategy "
                      "{})",
                      o.strategy));
    if (ps && o.ps_mode != "sync" && flag == "--replicas-to-aggregate")
      usage("--replicas-to-aggregate is a flag of --ps-mode sync");
    if (ps && o.ps_mode != "async" && flag == "--max-staleness")
      usage("--max-staleness is a flag of --ps-mode async");
  }
  if (o.strategy == "ring") return;
  if (ps) {
    if (o.num_ps >= ranks)
      usage(
          fmt::format("--num-ps {} leaves no worker among the {} rank(s) of this job: start "
                      "more ranks (mpirun -np {}) or use fewer servers",
                      o.num_ps, ranks, o.num_ps + 1));
    const int workers = ranks - o.num_ps;
    if (o.replicas_to_aggregate > workers)
      usage(
          fmt::format("--replicas-to-aggregate {} is more than the {} worker(s) ({} ranks - "
                      "--num-ps {})",
                      o.replicas_to_aggregate, workers, ranks, o.num_ps));
    if (o.check_finite) usage("--check-finite is not supported with --strategy ps yet");
    if (o.checkpoint_secs > 0)
      usage("--checkpoint-secs is not supported with --strategy ps: use --checkpoint-every");
  }
  if (o.ema_decay > 0.0f)
    usage(fmt::format("--ema-decay needs --strategy ring (this run: --strategy {})", o.strategy));
  // Both strategies move host buffers (the servers' shards, the averaged parameters).
  if (o.device == "cuda")
    usage(fmt::format("--strategy {} runs on the CPU for now; use --device cpu", o.strategy));
  if (o.device == "auto")
    spdlog::info("--strategy {} runs on the CPU: --device auto means cpu here", o.strategy);
  o.device = "cpu";
}

int run(Options o, MpiComm& comm) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool ps = o.strategy == "ps";
  // Under --strategy ps the chief is worker 0: world rank --num-ps.
  const int chief = ps ? o.num_ps : 0;
  // Every rank logs warnings and errors; progress comes from the chief only.
  setup_logging(rank, o.log_level);
  if (rank != chief && spdlog::get_level() < spdlog::level::warn)
    spdlog::set_level(spdlog::level::warn);
  check_strategy_flags(o, ranks);
  // The ring's and local SGD's loops stop at an agreed step on a preemption signal; the
  // parameter-server loop does not (yet): there the signals keep their default action.
  if (o.strategy != "ps") {
    install_preemption_handlers();
  } else if (rank == chief) {
    spdlog::info(
        "--strategy ps: SIGTERM and SIGUSR1 end the job without a last checkpoint "
        "(resume from the last periodic one)");
  }
  // The watchdog and the transport's backstop deadline were set up by main(), with comm.
  set_cpu_threads(o.threads);
  Context ctx;
  // --device: this rank's GPU is given by its local rank. The GpuContext (streams, cuBLAS and
  // cuDNN handles) is declared before the model so that it outlives every device tensor.
  const DeviceChoice device = choose_device(o.device, comm.local_rank(), comm.local_size());
#ifdef RINGTRAIN_HAVE_GPU
  std::optional<GpuContext> gpu;
  if (device.device == Device::kCuda) {
    gpu.emplace(device.gpu);
    ctx = gpu->context();
    ctx.board = &comm.board();  // device steps post their stream waits for the watchdog
    spdlog::info("device: cuda ({}); {}", device.why, gpu->describe());
  } else {
    spdlog::info("device: cpu ({})", device.why);
  }
#else
  spdlog::info("device: cpu ({})", device.why);
#endif
  ctx.threads = o.threads;
  ctx.board = &comm.board();  // every layer's forward and backward is progress for the watchdog
  if (o.cuda_graphs) {
    // Said before anything is built: both are decided by flags and the machine alone.
    if (ranks > 1)
      throw Error(fmt::format("--cuda-graphs captures the one-rank step only ({} ranks here: the "
                              "multi-rank step's gradient averaging is not captured yet); run "
                              "without it",
                              ranks),
                  ExitCode::kUsage, /*on_every_rank=*/true);
    if (device.device != Device::kCuda)
      throw Error(
          fmt::format("--cuda-graphs needs a GPU, and this run trains on the cpu ({})", device.why),
          ExitCode::kUsage, /*on_every_rank=*/true);
  }
  ctx.conv_impl = parse_conv_impl(o.conv_impl);
  if (ctx.conv_impl != ConvImpl::kDirect && device.device != Device::kCuda)
    throw Error(fmt::format("--conv-impl {} needs a GPU, and this run trains on the cpu ({})",
                            o.conv_impl, device.why),
                ExitCode::kUsage, /*on_every_rank=*/true);
  if (o.data_on_gpu) {
    if (device.device != Device::kCuda)
      throw Error(
          fmt::format("--data-on-gpu needs a GPU, and this run trains on the cpu ({})", device.why),
          ExitCode::kUsage, /*on_every_rank=*/true);
    if (o.test_nan_rank >= 0)
      throw Error("--test-nan-rank writes its NaN into a host batch: run without --data-on-gpu",
                  ExitCode::kUsage, /*on_every_rank=*/true);
  }
  for (const auto& [flag, value] : {std::pair{"--test-fail-rank", o.test_fail_rank},
                                    std::pair{"--test-preempt-rank", o.test_preempt_rank},
                                    std::pair{"--test-stall-rank", o.test_stall_rank},
                                    std::pair{"--test-nan-rank", o.test_nan_rank},
                                    std::pair{"--test-perturb-rank", o.test_perturb_rank},
                                    std::pair{"--test-slow-rank", o.test_slow_rank}}) {
    if (value >= ranks)
      throw Error(fmt::format("{} {} names a rank outside the {} rank(s) of this job: it must be "
                              "in [-1, {}]",
                              flag, value, ranks, ranks - 1),
                  ExitCode::kUsage, /*on_every_rank=*/true);
  }

  const std::string data_dir = o.data_dir.empty() ? default_data_dir() : o.data_dir;
  spdlog::info("data: {}{}", data_dir,
               o.data_dir.empty() ? " (default; --data-dir to change)" : "");
  MnistData data;
  try {
    data = load_mnist_dir(data_dir);
  } catch (const Error& error) {
    throw Error(fmt::format("rank {}: {}", rank, error.what()), ExitCode::kBadInput);
  }
  spdlog::info("data: {} train, {} test images of {}x{}", data.train.count, data.test.count,
               data.train.rows, data.train.cols);

  ModelSpec spec{.name = o.model,
                 .hidden = o.hidden,
                 .height = data.train.rows,
                 .width = data.train.cols,
                 .classes = 10,
                 .device = ctx.device};
  std::unique_ptr<Model> model = make_model(spec);
  // --strategy ps: the job's communicator with the chief (worker 0, world rank --num-ps) first,
  // so that it is the one that reads checkpoints; a split communicator posts its waits on its
  // parent's board, which the watchdog reads.
  std::optional<MpiComm> job;
  if (ps) job.emplace(comm, 0, (rank - o.num_ps + ranks) % ranks);
  Comm& control = job ? static_cast<Comm&>(*job) : comm;
  // The ranks that share the global batch: the workers.
  const int data_ranks = ps ? ranks - o.num_ps : ranks;
  // The first collective: nothing that depends on the flags runs before the ranks agree on them.
  check_config_consistency(control, config_fields(o, *model, data, ctx.device));
  if (rank == chief && ranks > 1)
    spdlog::info("configuration check: all {} ranks agree ({})", ranks, RINGTRAIN_CODE_VERSION);

  const std::optional<Checkpoint> resumed = resolve_checkpoint(control, o);
  if (resumed) {
    // The global batch and the data order are the checkpoint's; the per-rank batch follows
    // the rank count.
    const int64_t global = resumed->global_batch;
    if (o.batch_size_given && o.batch_size * data_ranks != global)
      refuse(fmt::format(
          "the checkpoint at step {} trained with a global batch of {} ({} "
          "rank(s)); {} ranks x --batch-size {} = {} would change the training: "
          "pass --batch-size {} or leave it out",
          resumed->step, global, resumed->ranks, data_ranks, o.batch_size,
          o.batch_size * data_ranks, global % data_ranks == 0 ? global / data_ranks : 0));
    if (global % data_ranks != 0)
      refuse(
          fmt::format("the checkpoint at step {} trained with a global batch of {}, which {} "
                      "ranks cannot share evenly: resume on a rank count that divides {}",
                      resumed->step, global, data_ranks, global));
    if (resumed->ranks != data_ranks && rank == chief)
      spdlog::warn(
          "resuming a {}-rank checkpoint on {} ranks: --batch-size {} per rank keeps the "
          "global batch of {} and the data order (the sums run in another order, so "
          "the bits differ from a {}-rank run)",
          resumed->ranks, data_ranks, global / data_ranks, global, resumed->ranks);
    o.batch_size = global / data_ranks;
  }

  // --batch-size, --epochs and --warmup-epochs against this job (exit 2): nothing below
  // overflows, and an epoch has at least one step.
  check_derived_ranges(o, data_ranks, data.train.count);
  const int64_t global_batch = o.batch_size * data_ranks;
  const int64_t steps_per_epoch = data.train.count / global_batch;
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
  if (ps) {
    return run_parameter_servers(o, comm, *job,
                                 StrategySetup{.data = data,
                                               .data_dir = data_dir,
                                               .model = *model,
                                               .ctx = ctx,
                                               .schedule = schedule,
                                               .resumed = resumed,
                                               .start_step = resumed ? resumed->step : 0,
                                               .total_steps = total_steps,
                                               .steps_per_epoch = steps_per_epoch,
                                               .global_batch = global_batch});
  }
  std::unique_ptr<Optimizer> optimizer = make_optimizer(o.optimizer, model->num_params(), ctx);
  const bool on_gpu = ctx.device == Device::kCuda;
  // Host code reads and writes the parameters through this span only on the CPU; a device
  // model is copied explicitly (params_to_host / params_from_host).
  const std::span<float> params(on_gpu ? nullptr : model->params().data(),
                                on_gpu ? 0 : static_cast<size_t>(model->num_params()));
  std::optional<WeightEma> ema;
  int64_t start_step = 0;
  if (resumed) {
    const Checkpoint& c = *resumed;
    check_checkpoint_fits(c, o, *model, *optimizer, optimizer->state().size());
    if (rank == 0 && describe_schedule(c.schedule) != describe_schedule(schedule))
      spdlog::warn(
          "the checkpoint's learning-rate schedule ({}) differs from this run's ({}); "
          "continuing with this run's",
          describe_schedule(c.schedule), describe_schedule(schedule));
    // Every rank decoded the same verified bytes: the replicas start identical without a
    // broadcast.
    if (on_gpu) {
      model->params_from_host(c.params);
      state_from_host(*optimizer, c.optimizer_state);
    } else {
      std::copy(c.params.begin(), c.params.end(), params.begin());
      const auto state = optimizer->state();
      for (size_t b = 0; b < state.size(); ++b)
        std::copy(c.optimizer_state[b].begin(), c.optimizer_state[b].end(), state[b].begin());
    }
    optimizer->set_steps_taken(c.optimizer_steps);
    start_step = c.step;
  } else {
    // The chief initialises; everyone starts from its bits.
    if (rank == 0) model->init_params(o.seed);
    broadcast_params(comm, *model);
  }
  if (o.ema_decay > 0.0f) {
    // On a GPU the average is device memory, updated on the compute stream after each step.
    if (on_gpu) {
      ema.emplace(o.ema_decay, model->params().data(), model->num_params(), ctx.stream);
    } else {
      ema.emplace(o.ema_decay, std::span<const float>(params));
    }
    if (resumed && !resumed->ema_shadow.empty()) {
      ema->restore(resumed->ema_shadow, resumed->ema_updates);
    } else if (resumed && rank == 0) {
      spdlog::warn("the checkpoint keeps no weight average; the EMA starts from step {}",
                   start_step);
    }
  } else if (resumed && !resumed->ema_shadow.empty() && rank == 0) {
    spdlog::warn("the checkpoint keeps a weight average, but --ema-decay is 0: it is dropped");
  }
  spdlog::info("model {}:\n{}", o.model, model->summary());

  // Only the chief writes files; the others would write the same lines.
  MetricsWriter metrics = o.metrics_out.empty() || rank != 0
                              ? MetricsWriter()
                              : MetricsWriter(o.metrics_out, /*append=*/start_step > 0);
  const auto mb_to_elements = [](double mb) { return static_cast<int64_t>(mb * 1e6 / 4.0); };
  // Overlap needs a core to run on: on one node whose cores the ranks' compute threads already
  // fill, the communication thread's copies only take cycles from backward (measured slower
  // there: docs/benchmarks.md), while across nodes the wire, not the CPU, is the bottleneck.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const bool node_is_full = comm.local_size() * o.threads >= cores;
  // On a GPU the averaging runs on the communication stream, not on a CPU thread: overlap
  // costs backward nothing, so auto means on.
  const bool overlap = o.no_overlap ? false
                       : o.overlap == "auto"
                           ? on_gpu || !(node_is_full && comm.local_size() == comm.size())
                           : o.overlap == "on";
  const std::string overlap_reason =
      o.no_overlap || o.overlap != "auto" ? "set by flag"
      : on_gpu ? "--overlap auto: on a GPU the communication stream runs beside the compute stream"
               : fmt::format("--overlap auto: {} rank(s) x {} thread(s) on a node of {} cores{}",
                             comm.local_size(), o.threads, cores,
                             comm.local_size() < comm.size() ? ", ranks on several nodes" : "");
  RingScratch ring_scratch;
  // One rank has nothing to average: no bucketer, no communication thread.
  std::optional<GradBucketer> bucketer;
#ifdef RINGTRAIN_HAVE_GPU
  // GPU ranks average device gradients over NCCL on the communication stream, ordered by
  // events (device_bucketer.h); the MpiComm keeps the host-side collectives.
  std::optional<NcclComm> nccl;
  std::optional<DeviceRingScratch> device_ring_scratch;
  std::optional<DeviceGradBucketer> device_bucketer;
  std::optional<HostStaging> staging;
  if (on_gpu && ranks > 1) {
    // Collective: every rank makes the same choice. NCCL 2.28 refuses two ranks on one GPU,
    // so ranks that share GPUs average through host memory with the CPU ring instead
    // (staged_ring.h: it waits on the host once per bucket, so it overlaps less).
    const bool shared = ranks_share_a_gpu(comm, visible_gpus());
    if (!shared) {
      nccl.emplace(comm, NcclOptions{.stream = static_cast<cudaStream_t>(ctx.comm_stream),
                                     .device = ctx.gpu,
                                     .timeout_s = o.collective_timeout + 30.0});
    }
    std::vector<Bucket> buckets =
        assign_buckets(model->grad_ranges(), mb_to_elements(o.first_bucket_mb),
                       mb_to_elements(o.fusion_threshold_mb));
    int64_t largest = 0;
    for (const Bucket& b : buckets) largest = std::max(largest, b.size());
    DeviceGradBucketer::ReduceFn reduce;
    if (shared) {
      staging.emplace();
      staging->reserve(static_cast<size_t>(largest));  // no growth in a step
      const double timeout = o.collective_timeout + 30.0;
      reduce = [&comm, &ring_scratch, &staging, timeout](float* bucket, int64_t count,
                                                         void* stream) {
        comm.board().set_phase("gradient allreduce");
        staged_ring_allreduce(comm, bucket, static_cast<size_t>(count), ReduceOp::kAvg,
                              ring_scratch, *staging, static_cast<cudaStream_t>(stream), {},
                              StagedOptions{.timeout_s = timeout});
      };
    } else if (o.allreduce == "ring") {
      device_ring_scratch.emplace();
      device_ring_scratch->reserve(static_cast<size_t>(largest), ranks);  // no growth in a step
      reduce = [&comm, &nccl, &device_ring_scratch](float* bucket, int64_t count, void*) {
        comm.board().set_phase("gradient allreduce");
        ring_allreduce_device(*nccl, bucket, static_cast<size_t>(count), ReduceOp::kAvg,
                              *device_ring_scratch);
      };
    } else {
      reduce = [&comm, &nccl](float* bucket, int64_t count, void*) {
        comm.board().set_phase("gradient allreduce");
        nccl->allreduce_library(bucket, static_cast<size_t>(count), ReduceOp::kAvg);
      };
    }
    device_bucketer.emplace(ctx, model->grads().data(), std::move(buckets), std::move(reduce),
                            overlap);
  }
  const int64_t device_bucket_count =
      device_bucketer ? static_cast<int64_t>(device_bucketer->buckets().size()) : 0;
  const std::string transport =
      !device_bucketer ? std::string()
      : nccl           ? std::string(" over NCCL on the communication stream")
                       : std::string(
                             " (whatever --allreduce says: the CPU ring through pinned "
                                       "host memory, since ranks share a GPU, which NCCL refuses)");
#else
  const int64_t device_bucket_count = 0;
  const std::string transport;
#endif
  RINGTRAIN_CHECK(!on_gpu || o.test_comm_delay_ms == 0,
                  "--test-comm-delay-ms is a CPU-path test flag; use --device cpu");
  // local-sgd: no gradient averaging; the parameters are averaged every --average-every steps.
  const bool local_sgd = o.strategy == "local-sgd";
  if (!on_gpu && !local_sgd && (ranks > 1 || o.test_comm_delay_ms > 0)) {
    bucketer.emplace(model->grads().data(),
                     assign_buckets(model->grad_ranges(), mb_to_elements(o.first_bucket_mb),
                                    mb_to_elements(o.fusion_threshold_mb)),
                     make_bucket_reduce(comm, o.allreduce, ring_scratch, o.test_comm_delay_ms),
                     overlap);
  }
  const int64_t bucket_count =
      bucketer ? static_cast<int64_t>(bucketer->buckets().size()) : device_bucket_count;
  // The communication thread shares the cores with backward: it must not spin long while waiting.
  if (bucketer && overlap) comm.set_spin_before_sleep(std::chrono::microseconds(50));
  spdlog::info(
      "training: {} steps ({} per epoch){}, {} rank(s) x batch {} = global batch {}, {} "
      "lr {} ({}), {} thread(s) per rank, seed {}",
      total_steps, steps_per_epoch,
      start_step > 0 ? fmt::format(" from step {}", start_step) : std::string(), ranks,
      o.batch_size, global_batch, optimizer->name(), schedule.base_lr, schedule.kind, o.threads,
      o.seed);
  if (local_sgd && ranks > 1) {
    spdlog::info(
        "strategy local-sgd: each rank steps on its own batch; parameters and optimizer "
        "state are averaged by the ring every {} step(s) and at the end",
        o.average_every);
  }
  if (bucketer || bucket_count > 0) {
    spdlog::info("gradients: {} bucket(s) averaged by {}{} {} ({}); watchdog {:g} s", bucket_count,
                 o.allreduce, transport, overlap ? "while backward runs" : "after backward",
                 overlap_reason, o.collective_timeout);
  }

  std::optional<CheckpointDir> checkpoints;
  if (!o.checkpoint_dir.empty()) {
    checkpoints.emplace(o.checkpoint_dir, o.keep_checkpoints);
    // A long write is progress: the others wait for the chief in their next collective.
    checkpoints->set_progress([&comm] { comm.board().progress(); });
  }
  auto last_checkpoint_time = Clock::now();
  int64_t last_checkpoint_step = start_step;
  // The chief writes its replica: every replica holds the same bits.
  const auto write_checkpoint = [&](int64_t done) {
    if (!checkpoints || rank != 0) return;
    const auto start = Clock::now();
    Checkpoint c{.model = o.model,
                 .layers = model->signature(),
                 .num_params = model->num_params(),
                 .step = done,
                 .epoch = done / steps_per_epoch,
                 .step_in_epoch = done % steps_per_epoch,
                 .seed = o.seed,
                 .global_batch = global_batch,
                 .ranks = ranks,
                 .schedule = schedule,
                 .params = model->params_to_host(),  // explicit copies from either device
                 .optimizer = optimizer->name(),
                 .optimizer_steps = optimizer->steps_taken()};
    c.optimizer_state = state_to_host(*optimizer);
    if (ema) {
      c.ema_decay = ema->decay();
      c.ema_updates = ema->updates();
      c.ema_shadow = ema->shadow_to_host();
    }
    if (done == o.test_kill_in_checkpoint_step) {  // the crash-consistency test's kill
      checkpoints->set_fault_hook([&o](const char* point) {
        if (o.test_kill_in_checkpoint == point) std::raise(SIGKILL);
      });
    }
    std::string path;
    try {
      path = checkpoints->save(c);
    } catch (const Error& error) {
      if (error.code() != ExitCode::kNonFinite) throw;
      // Without --check-finite a NaN that appeared on another rank's batch reaches every
      // replica in the averaged gradients before that rank's own check ends the job.
      throw Error(fmt::format("the checkpoint of step {} was not written: {}; the checkpoints "
                              "already in {} are intact. Lower --lr, check the data, or pass "
                              "--check-finite",
                              done, error.what(), o.checkpoint_dir),
                  ExitCode::kNonFinite);
    }
    spdlog::info("checkpoint: step {} written to {} in {:.0f} ms", done, path,
                 std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    metrics.write("checkpoint", {{"step", done}, {"path", path}});
  };

  // --check-finite: every rank contributes whether its loss or the averaged gradients hold a
  // NaN or Inf; all see the same flags and so skip the same steps.
  int64_t bad_in_a_row = 0, skipped_steps = 0, current_step = start_step;
  BeforeUpdateFn guard;
  std::vector<uint8_t> finite_flags(static_cast<size_t>(ranks));  // reused: no per-step allocation
  if (o.check_finite) {
    guard = [&](const StepStats& stats, std::span<const float> grads) {
      // Bit 0: this rank's loss; bit 1: the averaged gradients (the same on every rank).
      // A device step counts the non-finite gradients on the GPU (grads is then empty).
      const bool grads_finite = stats.grads_finite ? *stats.grads_finite : all_finite(grads);
      const uint8_t bad =
          static_cast<uint8_t>((std::isfinite(stats.loss) ? 0 : 1) | (grads_finite ? 0 : 2));
      {
        const PhaseScope phase(comm.board(), "finite check");
        comm.allgather(&bad, finite_flags.data(), sizeof(bad));
      }
      const std::vector<uint8_t>& flags = finite_flags;
      std::string bad_ranks;
      bool any = false;
      for (int r = 0; r < ranks; ++r) {
        const uint8_t flag = flags[static_cast<size_t>(r)];
        any |= flag != 0;
        if (flag & 1) bad_ranks += fmt::format("{}{}", bad_ranks.empty() ? "" : ", ", r);
      }
      if (!any) {
        bad_in_a_row = 0;
        return true;
      }
      bad_ranks = bad_ranks.empty() ? "the averaged gradients"
                                    : fmt::format("the loss on rank(s) {}", bad_ranks);
      ++bad_in_a_row;
      ++skipped_steps;
      if (bad_in_a_row >= o.max_bad_steps) {
        throw Error(fmt::format("--check-finite: {} steps in a row (the last, step {}) had NaN "
                                "or Inf ({}); stopping. Lower --lr or check the data; the "
                                "checkpoints already written are unaffected",
                                bad_in_a_row, current_step, bad_ranks),
                    ExitCode::kNonFinite, /*on_every_rank=*/true);
      }
      if (rank == 0)
        spdlog::warn(
            "step {}: NaN or Inf in {}; the update is skipped on every rank ({} in a "
            "row; the job stops at {})",
            current_step, bad_ranks, bad_in_a_row, o.max_bad_steps);
      return false;
    };
  }

#ifdef RINGTRAIN_HAVE_GPU
  // On an error, abort the NCCL communicator before anything declared above is destroyed:
  // freeing device memory waits for the whole device, and a bucket's transfer whose peer will
  // never join would make that wait, and the job, hang. Declared here, so it is destroyed
  // first.
  struct AbortNcclOnError {
    std::optional<NcclComm>& nccl;
    int exceptions_at_start = std::uncaught_exceptions();
    ~AbortNcclOnError() {
      if (nccl && std::uncaught_exceptions() > exceptions_at_start) nccl->abort();
    }
  } abort_nccl_on_error{nccl};
#endif
  // Preemption: a stop requested by a signal on any rank is agreed on at a step boundary, the
  // same on every rank (preemption.h).
  StopAgreement stop_agreement(comm);
  int stop_signal = 0;        // agreed by every rank: a stop at the next step boundary
  int64_t preempted_at = -1;  // the step after which a requested stop ended the loop
  EpochSampler sampler(data.train.count, o.seed);
  Batch batch, eval_scratch;
  Batch next_batch;              // device steps: the next step's batch, made meanwhile
  int64_t next_batch_step = -1;  // the step whose batch next_batch holds (-1: none)
  Tensor ema_swap;  // --ema-decay on a GPU: the trained weights while the EMA ones are evaluated
#ifdef RINGTRAIN_HAVE_GPU
  // --data-on-gpu: the training set's bytes on the GPU, each batch gathered there.
  std::shared_ptr<const DeviceDataset> device_train;
  if (o.data_on_gpu) {
    device_train = upload_dataset(data.train, model->output_shape().numel());
    spdlog::info("data: the training set is on the GPU ({:.1f} MB); batches are gathered there",
                 static_cast<double>(device_dataset_bytes(*device_train)) / 1e6);
  }
#else
  const bool device_train = false;  // --data-on-gpu is refused without a GPU
#endif
  StepWorkspace workspace;
  workspace.cuda_graph = o.cuda_graphs;
  // A device step with host batches makes the next step's batch while the GPU runs the
  // current one: the same batch the top of the next iteration would make (the order is a
  // function of the epoch). Set once: nothing is allocated per step.
  if (on_gpu && !device_train) {
    workspace.while_device_runs = [&] {
      const int64_t next = current_step + 1;
      if (next >= total_steps) return;
      const auto next_indices = rank_batch(sampler.order(next / steps_per_epoch),
                                           next % steps_per_epoch, o.batch_size, rank, ranks);
      make_batch(data.train, next_indices, next_batch.images, next_batch.labels);
      next_batch_step = next;
    };
  }
  int64_t graph_steps = 0;  // --cuda-graphs: steps that replayed a captured graph
  ProgressBar progress(rank == 0 ? total_steps - std::min(start_step, total_steps) : 0);
  const bool show_progress = rank == 0 && progress.enabled();
  StepTimes times;
  double train_seconds = 0.0, window_loss = 0.0, last_loss = 0.0;
  int64_t window_correct = 0, window_samples = 0, window_steps = 0;
  int64_t averages = 0;             // local-sgd: parameter averages done
  bool pending_checkpoint = false;  // local-sgd: a checkpoint is due at the next average

  if (start_step >= total_steps && rank == 0)
    spdlog::info("the checkpoint is at step {}, the run ends at {}: nothing left to train",
                 start_step, total_steps);
  for (int64_t step = start_step; step < total_steps; ++step) {
    comm.board().set_step(step);
    current_step = step;
    inject_test_failures(o, rank, step);
    if (rank == o.test_preempt_rank && step == o.test_preempt_at_step) request_preemption(SIGTERM);
    stop_agreement.start(preemption_signal());
    const auto start = Clock::now();
    const int64_t epoch = step / steps_per_epoch;
    const auto indices =
        rank_batch(sampler.order(epoch), step % steps_per_epoch, o.batch_size, rank, ranks);
    if (device_train) {
      // gathered on the GPU from `indices`
    } else if (next_batch_step == step) {  // made while the GPU ran the previous step
      std::swap(batch, next_batch);
    } else {
      make_batch(data.train, indices, batch.images, batch.labels);
    }
    if (rank == o.test_nan_rank &&
        std::find(o.test_nan_steps.begin(), o.test_nan_steps.end(), step) != o.test_nan_steps.end())
      batch.images.data()[0] = std::nanf("");
    const float lr = learning_rate(schedule, step);
#ifdef RINGTRAIN_HAVE_GPU
    DeviceGradBucketer* const device_averaging = device_bucketer ? &*device_bucketer : nullptr;
    StepStats stats = device_train ? train_step_device(*model, *optimizer, *device_train, indices,
                                                       lr, workspace, ctx, device_averaging, guard)
                      : on_gpu ? train_step_device(*model, *optimizer, batch, lr, workspace, ctx,
                                                   device_averaging, guard)
                               : train_step(*model, *optimizer, batch, lr, workspace, ctx,
                                            bucketer ? &*bucketer : nullptr, guard);
#else
    StepStats stats = train_step(*model, *optimizer, batch, lr, workspace, ctx,
                                 bucketer ? &*bucketer : nullptr, guard);
#endif
    // local-sgd: every --average-every steps (and at the end) the ranks average their
    // parameters and optimizer state with the ring, so that they leave identical, and so that
    // a checkpoint of the chief's replica is the whole state.
    // Every rank learns here whether any rank asked to stop, so all stop after the same step:
    // this one, or under local-sgd the next parameter average (a step where the replicas, and
    // so the checkpoint, are the job's whole state: an extra average would change the result).
    if (const int agreed = stop_agreement.finish(); agreed != 0 && stop_signal == 0)
      stop_signal = agreed;
    const bool averaged =
        local_sgd && ranks > 1 && ((step + 1) % o.average_every == 0 || step + 1 == total_steps);
    if (averaged) {
      const PhaseScope phase(comm.board(), "parameter average");
      const auto average_start = Clock::now();
      ring_allreduce(comm, params.data(), params.size(), ReduceOp::kAvg, ring_scratch);
      for (const std::span<float> buffer : optimizer->state())
        ring_allreduce(comm, buffer.data(), buffer.size(), ReduceOp::kAvg, ring_scratch);
      stats.comm.comm_ms = stats.comm.exposed_ms =
          std::chrono::duration<double, std::milli>(Clock::now() - average_start).count();
      ++averages;
    }
    if (ema && stats.updated) {
      if (on_gpu) {
        const Tensor& device_params = model->params();
        ema->update({device_params.data(), static_cast<size_t>(device_params.numel())});
      } else {
        ema->update(params);
      }
    }
    const double step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    train_seconds += step_seconds;
    // A device step's time comes from CUDA events on the compute stream.
    times.add(stats.device_ms.value_or(step_seconds * 1000.0), stats.comm);
    if (stats.graph_replayed.value_or(false)) ++graph_steps;

    if (!o.check_finite && !std::isfinite(stats.loss))
      throw Error(fmt::format("rank {}: the loss became {} at step {}: lower --lr (now {}), check "
                              "the data, or pass --check-finite to skip such steps",
                              rank, stats.loss, step, lr),
                  ExitCode::kNonFinite);
    if (stats.updated) {
      window_loss += stats.loss;
      window_correct += stats.correct;
      window_samples += stats.samples;
      ++window_steps;
      last_loss = stats.loss;
    }
    const int64_t done = step + 1;
    if (done == 1 && rank == o.test_perturb_rank) {
      if (on_gpu) {
        std::vector<float> host = model->params_to_host();
        host.back() += 1e-3f;
        model->params_from_host(host);
      } else {
        params.back() += 1e-3f;
      }
    }
    // Between averages local-sgd replicas differ by design: they are checked after an average.
    const bool replicas_equal = !local_sgd || averaged || ranks == 1;
    const bool stopping = stop_signal != 0 && replicas_equal && done < total_steps;
    if (o.check_replicas > 0 && done % o.check_replicas == 0 && replicas_equal)
      check_replicas(comm, *model, done);
    if (show_progress) {
      progress.update(
          done - start_step,
          fmt::format("epoch {} loss {:.4f} {:.0f} img/s", epoch + 1, stats.loss,
                      static_cast<double>((done - start_step) * global_batch) / train_seconds));
    }
    if (o.log_every > 0 && (done % o.log_every == 0 || done == total_steps) && window_steps > 0) {
      const double mean_loss = window_loss / static_cast<double>(window_steps);
      const double accuracy =
          static_cast<double>(window_correct) / static_cast<double>(window_samples);
      if (!show_progress) {
        spdlog::info("step {}/{} epoch {} loss {:.4f} train acc {:.4f} lr {:.6g} {:.0f} img/s",
                     done, total_steps, epoch + 1, mean_loss, accuracy, lr,
                     static_cast<double>((done - start_step) * global_batch) / train_seconds);
      }
      metrics.write("train", {{"step", done},
                              {"epoch", epoch + 1},
                              {"loss", mean_loss},
                              {"train_accuracy", accuracy},
                              {"lr", static_cast<double>(lr)}});
      window_loss = 0.0;
      window_correct = window_samples = window_steps = 0;
    }
    if (o.eval_every > 0 && done % o.eval_every == 0 && done != total_steps && replicas_equal) {
      const EvalResult eval = evaluate_test(comm, *model, data.test, o, ema ? &*ema : nullptr,
                                            eval_scratch, ctx, ema_swap);
      if (!show_progress) {
        spdlog::info("step {} test accuracy {:.4f} loss {:.4f}", done, eval.accuracy(),
                     eval.mean_loss());
      }
      metrics.write("eval", {{"step", done},
                             {"test_accuracy", eval.accuracy()},
                             {"test_loss", eval.mean_loss()},
                             {"train_seconds", train_seconds}});
    }
    const bool by_count = o.checkpoint_every > 0 && done % o.checkpoint_every == 0;
    const bool by_time =
        o.checkpoint_secs > 0 &&
        std::chrono::duration<double>(Clock::now() - last_checkpoint_time).count() >=
            o.checkpoint_secs;
    // local-sgd puts a checkpoint off to the next average: the chief's replica is the job's
    // whole state only then.
    const bool due = by_count || by_time || pending_checkpoint;
    pending_checkpoint = due && !replicas_equal;
    // The state a preemption leaves is checked first: the next run starts from it.
    if (stopping) check_replicas(comm, *model, done);
    if (checkpoints && ((due && replicas_equal) || stopping) && done != total_steps) {
      write_checkpoint(done);
      last_checkpoint_time = Clock::now();
      last_checkpoint_step = done;
    }
    if (stopping) {
      preempted_at = done;
      break;
    }
  }
  if (show_progress) progress.finish();
  if (preempted_at >= 0) {
    const std::string saved =
        checkpoints ? fmt::format(
                          "the checkpoint of step {} is in {}; the same command resumes "
                          "from it (--resume auto)",
                          preempted_at, o.checkpoint_dir)
                    : std::string("nothing was saved (no --checkpoint-dir): a rerun starts over");
    if (rank == 0)
      spdlog::warn(
          "preempted: signal {} ({}) asked the job to stop; every rank stopped after step "
          "{} of {}; {} (exit code {})",
          stop_signal, strsignal(stop_signal), preempted_at, total_steps, saved,
          static_cast<int>(ExitCode::kPreempted));
    metrics.write("preempted", {{"step", preempted_at},
                                {"signal", int64_t{stop_signal}},
                                {"checkpoint", checkpoints.has_value()}});
    return static_cast<int>(ExitCode::kPreempted);
  }
  comm.board().set_step(total_steps);
  check_replicas(comm, *model, total_steps);  // always once: replicas must end identical
  if (checkpoints && last_checkpoint_step != total_steps) write_checkpoint(total_steps);

  const EvalResult eval =
      evaluate_test(comm, *model, data.test, o, ema ? &*ema : nullptr, eval_scratch, ctx, ema_swap);
  const int64_t trained_steps = std::max<int64_t>(0, total_steps - start_step);
  // Every rank waits for the slowest at each step, so rank 0's clock is the job's.
  const double images_per_sec =
      train_seconds > 0 ? static_cast<double>(trained_steps * global_batch) / train_seconds : 0.0;
  const double step_ms =
      trained_steps > 0 ? train_seconds * 1000.0 / static_cast<double>(trained_steps) : 0.0;
  spdlog::info(
      "summary: test accuracy {:.4f}{} ({} / {}), test loss {:.4f}, last batch loss {:.4f}",
      eval.accuracy(), ema ? " (EMA weights)" : "", eval.correct, eval.samples, eval.mean_loss(),
      last_loss);
  spdlog::info(
      "summary: {} steps{} in {:.2f} s: {:.0f} images/s, {:.3f} ms/step, peak RSS {:.0f} MB{}",
      trained_steps, start_step > 0 ? fmt::format(" (resumed at step {})", start_step) : "",
      train_seconds, images_per_sec, step_ms, peak_rss_mb(),
      skipped_steps > 0 ? fmt::format(", {} update(s) skipped (--check-finite)", skipped_steps)
                        : std::string());
#ifdef RINGTRAIN_HAVE_GPU
  const int64_t graph_captures = step_graph_captures(workspace);
#else
  const int64_t graph_captures = 0;
#endif
  if (o.cuda_graphs)
    spdlog::info("summary: CUDA graphs: {} of {} steps replayed a graph, {} capture(s)",
                 graph_steps, trained_steps, graph_captures);
  spdlog::info(
      "summary: per step {:.3f} ms compute, {:.3f} ms communication of which {:.3f} ms "
      "exposed: overlap efficiency {:.0f}% ({} ranks, {})",
      times.mean(times.compute_ms), times.mean(times.comm_ms), times.mean(times.exposed_ms),
      std::max(0.0, times.overlap_efficiency()) * 100.0, ranks,
      overlap ? "overlapped" : "not overlapped");
  metrics.write("summary", {{"test_accuracy", eval.accuracy()},
                            {"images_per_sec", images_per_sec},
                            {"step_ms", step_ms},
                            {"steps", total_steps},
                            {"start_step", start_step},
                            {"skipped_steps", skipped_steps},
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
                            {"strategy", o.strategy},
                            {"average_every", local_sgd ? o.average_every : int64_t{0}},
                            {"parameter_averages", averages},
                            {"buckets", bucket_count},
                            {"threads", int64_t{o.threads}},
                            {"device", std::string(to_string(ctx.device))},
                            {"cuda_graphs", o.cuda_graphs},
                            {"graph_steps", graph_steps},
                            {"graph_captures", graph_captures},
                            {"data_on_gpu", o.data_on_gpu},
                            {"conv_impl", o.conv_impl},
                            {"ema", ema.has_value()},
                            {"params", model->num_params()},
                            {"peak_rss_mb", peak_rss_mb()},
                            {"data_dir", data_dir}});
  if (!o.save_params.empty() && rank == 0) {
    save_params(o.save_params, model->params_to_host(), [&comm] { comm.board().progress(); });
    spdlog::info("saved {} parameters to {}", model->num_params(), o.save_params);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringtrain mnist_train: data-parallel MNIST training (mpirun -np N mnist_train)"};
  Options options;
  add_flags(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version exit 0; every flag error exits kUsage (CLI11's own codes vary).
    const int printed = app.exit(error);
    return printed == 0 ? 0 : static_cast<int>(ExitCode::kUsage);
  }
  options.batch_size_given = app.count("--batch-size") > 0;
  for (const char* flag :
       {"--num-ps", "--ps-mode", "--replicas-to-aggregate", "--max-staleness", "--average-every"}) {
    if (app.count(flag) > 0) options.flags_given.emplace_back(flag);
  }
  // THREAD_MULTIPLE: the overlap engine's communication thread calls MPI.
  MpiSession session(&argc, &argv);
  int rank = 0, ranks = 1;
  try {
    // Known before the first collective, so that a failure in it still ends the whole job.
    RINGTRAIN_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    RINGTRAIN_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &ranks));
    // The transport's own deadline is a backstop behind the watchdog, which reports more.
    MpiComm comm(options.collective_timeout + 30.0);
    comm.set_piece_delay_for_tests(options.test_slow_transport_ms);
    // Watched from here to the final barrier: set-up, training and the chief's last writes.
    std::optional<CollectiveWatchdog> watchdog;
    if (ranks > 1) watchdog.emplace(comm, options.collective_timeout);
    if (options.test_stall_at_setup) stall_for_test(options, rank, "in set-up");
    const int code = run(options, comm);
    if (options.test_stall_after_end) stall_for_test(options, rank, "after its last writes");
    if (watchdog) {
      // Every rank leaves together, after the chief's last writes, so that a rank that stalls
      // before here is ended by the watchdog instead of leaving the others blocked in
      // MPI_Finalize, where nothing watches them.
      const PhaseScope phase(comm.board(), "final barrier");
      comm.barrier();
    }
    return code;
  } catch (const Error& error) {
    const int code = static_cast<int>(error.code());
    // An error every rank raised together is told once and ends each rank normally.
    if (error.on_every_rank()) {
      if (rank == 0) spdlog::error("{}", error.what());
      return code;
    }
    spdlog::error("{}", error.what());
    if (ranks > 1) {
      spdlog::error("rank {} of {} failed; ending the whole job (exit code {})", rank, ranks, code);
      MpiSession::abort_job(code);  // so no other rank waits forever on this one
    }
    return code;
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    if (ranks > 1) {
      spdlog::error("rank {} of {} failed; ending the whole job", rank, ranks);
      MpiSession::abort_job(1);
    }
    return 1;
  }
}
