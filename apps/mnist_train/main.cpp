// mnist_train: trains the source documents' MNIST models (mlp, cnn), data-parallel over the
// ranks of `mpirun -np N` (or on one process without mpirun). The loop lives here, in plain
// sight: take this rank's share of the global batch, step (the GradSync averages the gradients
// while backward runs), log, evaluate, checkpoint, summarise. Everything the loop uses is a
// named part of this folder (options, the run plan, resume, the NaN guard, local SGD, the
// checkpoint writer, reporting) or of the library.
//
// Before training, the ranks compare their configurations (a mismatch would hang or diverge)
// and resume from the newest valid checkpoint; during training a watchdog ends the job when a
// collective stops making progress. Failures and exit codes: docs/failures.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "averaging.h"
#include "checkpoint_writer.h"
#include "evaluation.h"
#include "finite_guard.h"
#include "job_config.h"
#include "local_sgd.h"
#include "options.h"
#include "ps_strategy.h"
#include "reporting.h"
#include "resume.h"
#include "ringtrain/check.h"
#include "ringtrain/data.h"
#include "ringtrain/device_session.h"
#include "ringtrain/distributed.h"
#include "ringtrain/log.h"
#include "ringtrain/mpi_comm.h"
#include "ringtrain/preemption.h"
#include "ringtrain/train.h"
#include "ringtrain/watchdog.h"
#include "run_plan.h"
#include "test_faults.h"

namespace {

using namespace ringtrain;
using namespace ringtrain::app;
using Clock = std::chrono::steady_clock;

// What the ring's and local SGD's loop trains with, built by run().
struct Job {
  const Options& o;
  MpiComm& comm;
  const MnistData& data;
  Model& model;
  Context& ctx;
  const RunPlan& plan;
  const std::optional<Checkpoint>& resumed;
};

// The summary's lines beyond the common two, and the run's metrics record.
struct RingTotals {
  RunTotals run;
  StepTimes times;
  EvalResult eval;
  double last_loss = 0.0;
  int64_t skipped_steps = 0, graph_steps = 0, graph_captures = 0, averages = 0, buckets = 0;
  bool ema = false, overlap = false;
};

void report_ring_run(const Job& job, const RingTotals& t, MetricsWriter& metrics) {
  const Options& o = job.o;
  const int ranks = job.comm.size();
  log_summary(t.eval, t.ema ? " (EMA weights)" : "", t.last_loss, t.run,
              t.skipped_steps > 0
                  ? fmt::format(", {} update(s) skipped (--check-finite)", t.skipped_steps)
                  : std::string());
  if (o.cuda_graphs)
    spdlog::info("summary: CUDA graphs: {} of {} steps replayed a graph, {} capture(s)",
                 t.graph_steps, t.run.trained_steps, t.graph_captures);
  spdlog::info(
      "summary: per step {:.3f} ms compute, {:.3f} ms communication of which {:.3f} ms "
      "exposed: overlap efficiency {:.0f}% ({} ranks, {})",
      t.times.mean(t.times.compute_ms), t.times.mean(t.times.comm_ms),
      t.times.mean(t.times.exposed_ms), std::max(0.0, t.times.overlap_efficiency()) * 100.0,
      ranks, t.overlap ? "overlapped" : "not overlapped");
  const bool local_sgd = o.strategy == Strategy::kLocalSgd;
  metrics.write("summary",
                {{"test_accuracy", t.eval.accuracy()},
                 {"images_per_sec", t.run.images_per_sec()},
                 {"step_ms", t.run.step_ms()},
                 {"steps", job.plan.total_steps},
                 {"start_step", job.plan.start_step},
                 {"skipped_steps", t.skipped_steps},
                 {"epochs", static_cast<double>(job.plan.total_steps) /
                                static_cast<double>(job.plan.steps_per_epoch)},
                 {"test_loss", t.eval.mean_loss()},
                 {"last_loss", t.last_loss},
                 {"model", o.model},
                 {"batch_size", job.plan.batch_size},
                 {"global_batch", job.plan.global_batch},
                 {"world_size", int64_t{ranks}},
                 {"ranks", int64_t{ranks}},
                 {"compute_ms", t.times.mean(t.times.compute_ms)},
                 {"comm_ms", t.times.mean(t.times.comm_ms)},
                 {"exposed_comm_ms", t.times.mean(t.times.exposed_ms)},
                 {"overlap_efficiency", t.times.overlap_efficiency()},
                 {"overlap", t.overlap},
                 {"allreduce", std::string(to_string(o.allreduce))},
                 {"strategy", std::string(to_string(o.strategy))},
                 {"average_every", local_sgd ? o.average_every : int64_t{0}},
                 {"parameter_averages", t.averages},
                 {"buckets", t.buckets},
                 {"threads", int64_t{o.threads}},
                 {"device", std::string(to_string(job.ctx.device))},
                 {"cuda_graphs", o.cuda_graphs},
                 {"graph_steps", t.graph_steps},
                 {"graph_captures", t.graph_captures},
                 {"data_on_gpu", o.data_on_gpu},
                 {"conv_impl", std::string(to_string(o.conv_impl))},
                 {"ema", t.ema},
                 {"params", job.model.num_params()},
                 {"peak_rss_mb", peak_rss_mb()},
                 {"data_dir", o.data_dir.empty() ? default_data_dir() : o.data_dir}});
}

// The chief's word on a preempted run; returns the "preempted" exit code.
int report_preemption(const Job& job, int signal, int64_t step, bool saved,
                      MetricsWriter& metrics) {
  const std::string what =
      saved ? fmt::format(
                  "the checkpoint of step {} is in {}; the same command resumes "
                  "from it (--resume auto)",
                  step, job.o.checkpoint_dir)
            : std::string("nothing was saved (no --checkpoint-dir): a rerun starts over");
  if (job.comm.rank() == 0)
    spdlog::warn(
        "preempted: signal {} ({}) asked the job to stop; every rank stopped after step "
        "{} of {}; {} (exit code {})",
        signal, strsignal(signal), step, job.plan.total_steps, what,
        static_cast<int>(ExitCode::kPreempted));
  metrics.write("preempted",
                {{"step", step}, {"signal", int64_t{signal}}, {"checkpoint", saved}});
  return static_cast<int>(ExitCode::kPreempted);
}

// The ring's (and local SGD's) training, from the optimizer to the summary.
int train(const Job& job) {
  const Options& o = job.o;
  MpiComm& comm = job.comm;
  Model& model = job.model;
  Context& ctx = job.ctx;
  const RunPlan& plan = job.plan;
  const int rank = comm.rank(), ranks = comm.size();
  const bool on_gpu = ctx.device == Device::kCuda;
  std::unique_ptr<Optimizer> optimizer = make_optimizer(o.optimizer, model.num_params(), ctx);
  if (job.resumed) {
    check_checkpoint_fits(*job.resumed, o, model, *optimizer, optimizer->state().size());
    if (rank == 0 &&
        describe_schedule(job.resumed->schedule) != describe_schedule(plan.schedule))
      spdlog::warn(
          "the checkpoint's learning-rate schedule ({}) differs from this run's ({}); "
          "continuing with this run's",
          describe_schedule(job.resumed->schedule), describe_schedule(plan.schedule));
    load_checkpoint_state(*job.resumed, model, *optimizer);
  } else {
    // The chief initialises; everyone starts from its bits.
    if (rank == 0) model.init_params(o.seed);
    broadcast_params(comm, model);
  }
  std::optional<WeightEma> ema;
  if (o.ema_decay > 0.0f) {
    // On a GPU the average is device memory, updated on the compute stream after each step.
    if (on_gpu) {
      ema.emplace(o.ema_decay, model.params().data(), model.num_params(), ctx.stream);
    } else {
      ema.emplace(o.ema_decay,
                  std::span<const float>(model.params().data(),
                                         static_cast<size_t>(model.num_params())));
    }
    if (job.resumed && !job.resumed->ema_shadow.empty()) {
      ema->restore(job.resumed->ema_shadow, job.resumed->ema_updates);
    } else if (job.resumed && rank == 0) {
      spdlog::warn("the checkpoint keeps no weight average; the EMA starts from step {}",
                   plan.start_step);
    }
  } else if (job.resumed && !job.resumed->ema_shadow.empty() && rank == 0) {
    spdlog::warn("the checkpoint keeps a weight average, but --ema-decay is 0: it is dropped");
  }
  spdlog::info("model {}:\n{}", o.model, model.summary());

  // Only the chief writes files; the others would write the same lines.
  MetricsWriter metrics = o.metrics_out.empty() || rank != 0
                              ? MetricsWriter()
                              : MetricsWriter(o.metrics_out, /*append=*/plan.start_step > 0);
  spdlog::info(
      "training: {} steps ({} per epoch){}, {} rank(s) x batch {} = global batch {}, {} "
      "lr {} ({}), {} thread(s) per rank, seed {}",
      plan.total_steps, plan.steps_per_epoch,
      plan.start_step > 0 ? fmt::format(" from step {}", plan.start_step) : std::string(), ranks,
      plan.batch_size, plan.global_batch, optimizer->name(), plan.schedule.base_lr,
      plan.schedule.kind, o.threads, o.seed);
  Averaging averaging = make_averaging(o, plan, comm, model, ctx);
  GradSync* const grad_sync = averaging.grad_sync.get();
  LocalSgd local_sgd(o.strategy == Strategy::kLocalSgd ? averaging.allreduce.get() : nullptr,
                     o.average_every, plan.total_steps);
  const bool parameter_averages = o.strategy == Strategy::kLocalSgd && ranks > 1;

  CheckpointWriter checkpoints(o, metrics, comm.board());
  const CheckpointHeader header{.model = o.model,
                                .layers = model.signature(),
                                .num_params = model.num_params(),
                                .steps_per_epoch = plan.steps_per_epoch,
                                .seed = o.seed,
                                .global_batch = plan.global_batch,
                                .ranks = ranks,
                                .schedule = plan.schedule,
                                .optimizer = optimizer->name()};
  // The chief writes its replica: every replica holds the same bits.
  const auto write_checkpoint = [&](int64_t done) {
    if (!checkpoints.enabled() || rank != 0) return;
    Checkpoint c = checkpoint_at(header, done);
    c.params = model.params_to_host();  // explicit copies from either device
    c.optimizer_steps = optimizer->steps_taken();
    c.optimizer_state = state_to_host(*optimizer);
    if (ema) {
      c.ema_decay = ema->decay();
      c.ema_updates = ema->updates();
      c.ema_shadow = ema->shadow_to_host();
    }
    checkpoints.save(c);
  };
  FiniteGuard guard(o, comm);
  const BeforeUpdateFn before_update = guard.hook();
  // On an error, abort NCCL before anything declared above is destroyed: freeing device
  // memory waits for the whole device, and a bucket's transfer whose peer will never join
  // would make that wait, and the job, hang. Declared here, so it is destroyed first.
  const AbortAllreduceOnError abort_on_error(averaging.allreduce.get());
  // Preemption: a stop requested by a signal on any rank is agreed on at a step boundary, the
  // same on every rank (preemption.h).
  StopAgreement stop_agreement(comm);
  int stop_signal = 0;        // agreed by every rank: a stop at the next step boundary
  int64_t preempted_at = -1;  // the step after which a requested stop ended the loop
  EpochSampler sampler(job.data.train.count, o.seed);
  Batch batch, eval_scratch;
  Batch next_batch;              // device steps: the next step's batch, made meanwhile
  int64_t next_batch_step = -1;  // the step whose batch next_batch holds (-1: none)
  Tensor ema_swap;  // --ema-decay on a GPU: the trained weights while the EMA ones are evaluated
  // --data-on-gpu: the training set's bytes on the GPU, each batch gathered there.
  std::shared_ptr<const DeviceDataset> device_train;
  if (o.data_on_gpu) {
    device_train = upload_dataset(job.data.train, model.output_shape().numel());
    spdlog::info("data: the training set is on the GPU ({:.1f} MB); batches are gathered there",
                 static_cast<double>(device_dataset_bytes(*device_train)) / 1e6);
  }
  int64_t current_step = plan.start_step;
  const auto batch_of = [&](int64_t step) {
    return rank_batch(sampler.order(step / plan.steps_per_epoch), step % plan.steps_per_epoch,
                      plan.batch_size, rank, ranks);
  };
  StepWorkspace workspace;
  workspace.cuda_graph = o.cuda_graphs;
  // A device step with host batches makes the next step's batch while the GPU runs the
  // current one: the same batch the top of the next iteration would make (the order is a
  // function of the epoch). Set once: nothing is allocated per step.
  if (on_gpu && !device_train) {
    workspace.while_device_runs = [&] {
      const int64_t next = current_step + 1;
      if (next >= plan.total_steps) return;
      make_batch(job.data.train, batch_of(next), next_batch.images, next_batch.labels);
      next_batch_step = next;
    };
  }
  RingTotals totals{.run = {.start_step = plan.start_step, .global_batch = plan.global_batch},
                    .buckets = grad_sync ? static_cast<int64_t>(grad_sync->buckets().size()) : 0,
                    .ema = ema.has_value(),
                    .overlap = plan.grad_sync.overlap};
  ProgressBar progress(rank == 0 ? plan.total_steps - std::min(plan.start_step, plan.total_steps)
                                 : 0);
  const bool show_progress = rank == 0 && progress.enabled();
  TrainWindow window;
  double& train_seconds = totals.run.train_seconds;
  auto last_checkpoint_time = Clock::now();
  int64_t last_checkpoint_step = plan.start_step;
  bool pending_checkpoint = false;  // local-sgd: a checkpoint is due at the next average

  if (plan.start_step >= plan.total_steps && rank == 0)
    spdlog::info("the checkpoint is at step {}, the run ends at {}: nothing left to train",
                 plan.start_step, plan.total_steps);
  for (int64_t step = plan.start_step; step < plan.total_steps; ++step) {
    comm.board().set_step(step);
    current_step = step;
    guard.set_step(step);
    inject_test_failures(o, rank, step);
    if (rank == o.test_preempt_rank && step == o.test_preempt_at_step) request_preemption(SIGTERM);
    stop_agreement.start(preemption_signal());
    const auto start = Clock::now();
    const int64_t epoch = step / plan.steps_per_epoch;
    const auto indices = batch_of(step);
    if (device_train) {
      // gathered on the GPU from `indices`
    } else if (next_batch_step == step) {  // made while the GPU ran the previous step
      std::swap(batch, next_batch);
    } else {
      make_batch(job.data.train, indices, batch.images, batch.labels);
    }
    if (rank == o.test_nan_rank &&
        std::find(o.test_nan_steps.begin(), o.test_nan_steps.end(), step) != o.test_nan_steps.end())
      batch.images.data()[0] = std::nanf("");
    const float lr = learning_rate(plan.schedule, step);
    const StepInput input = device_train ? StepInput(*device_train, indices) : StepInput(batch);
    StepStats stats =
        train_step(model, *optimizer, input, lr, workspace, ctx, grad_sync, before_update);
    // Every rank learns here whether any rank asked to stop, so all stop after the same step:
    // this one, or under local-sgd the next parameter average (a step where the replicas, and
    // so the checkpoint, are the job's whole state: an extra average would change the result).
    if (const int agreed = stop_agreement.finish(); agreed != 0 && stop_signal == 0)
      stop_signal = agreed;
    const bool averaged = local_sgd.due(step);
    if (averaged) {
      const PhaseScope phase(comm.board(), "parameter average");
      stats.comm.comm_ms = stats.comm.exposed_ms = local_sgd.average(model, *optimizer);
    }
    if (ema && stats.updated) {
      const Tensor& params = model.params();
      ema->update({params.data(), static_cast<size_t>(params.numel())});
    }
    const double step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    train_seconds += step_seconds;
    // A device step's time comes from CUDA events on the compute stream.
    totals.times.add(stats.device_ms.value_or(step_seconds * 1000.0), stats.comm);
    if (stats.graph_replayed.value_or(false)) ++totals.graph_steps;

    if (!o.check_finite && !std::isfinite(stats.loss))
      throw Error(fmt::format("rank {}: the loss became {} at step {}: lower --lr (now {}), check "
                              "the data, or pass --check-finite to skip such steps",
                              rank, stats.loss, step, lr),
                  ExitCode::kNonFinite);
    if (stats.updated) {
      window.add(stats);
      totals.last_loss = stats.loss;
    }
    const int64_t done = step + 1;
    if (done == 1 && rank == o.test_perturb_rank) {
      std::vector<float> host = model.params_to_host();
      host.back() += 1e-3f;
      model.params_from_host(host);
    }
    // Between averages local-sgd replicas differ by design: they are checked after an average.
    const bool replicas_equal = !parameter_averages || averaged;
    const bool stopping = stop_signal != 0 && replicas_equal && done < plan.total_steps;
    if (o.check_replicas > 0 && done % o.check_replicas == 0 && replicas_equal)
      check_replicas(comm, model, done);
    const double images_per_sec =
        static_cast<double>((done - plan.start_step) * plan.global_batch) / train_seconds;
    if (show_progress)
      progress.update(done - plan.start_step,
                      fmt::format("epoch {} loss {:.4f} {:.0f} img/s", epoch + 1, stats.loss,
                                  images_per_sec));
    if (o.log_every > 0 && (done % o.log_every == 0 || done == plan.total_steps) &&
        !window.empty())
      window.report(done, plan.total_steps, epoch + 1, lr, images_per_sec, !show_progress,
                    metrics);
    if (o.eval_every > 0 && done % o.eval_every == 0 && done != plan.total_steps &&
        replicas_equal) {
      const EvalResult eval = evaluate_test(comm, model, job.data.test, o.eval_batch,
                                            ema ? &*ema : nullptr, eval_scratch, ctx, ema_swap);
      report_eval(done, eval, train_seconds, !show_progress, metrics);
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
    if (stopping) check_replicas(comm, model, done);
    if (checkpoints.enabled() && ((due && replicas_equal) || stopping) &&
        done != plan.total_steps) {
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
  if (preempted_at >= 0)
    return report_preemption(job, stop_signal, preempted_at, checkpoints.enabled(), metrics);
  comm.board().set_step(plan.total_steps);
  check_replicas(comm, model, plan.total_steps);  // always once: replicas must end identical
  if (checkpoints.enabled() && last_checkpoint_step != plan.total_steps)
    write_checkpoint(plan.total_steps);

  totals.eval = evaluate_test(comm, model, job.data.test, o.eval_batch, ema ? &*ema : nullptr,
                              eval_scratch, ctx, ema_swap);
  totals.run.trained_steps = std::max<int64_t>(0, plan.total_steps - plan.start_step);
  totals.skipped_steps = guard.skipped_steps();
  totals.graph_captures = step_graph_captures(workspace);
  totals.averages = local_sgd.averages();
  report_ring_run(job, totals, metrics);
  if (rank == 0) save_final_params(o, model, comm.board());
  return 0;
}

int run(Options o, MpiComm& comm) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool ps = o.strategy == Strategy::kParameterServers;
  // Under --strategy ps the chief is worker 0: world rank --num-ps.
  const int chief = ps ? o.num_ps : 0;
  // Every rank logs warnings and errors; progress comes from the chief only.
  setup_logging(rank, o.log_level);
  if (rank != chief && spdlog::get_level() < spdlog::level::warn)
    spdlog::set_level(spdlog::level::warn);
  check_flag_combinations(o, ranks);
  // The ring's and local SGD's loops stop at an agreed step on a preemption signal; the
  // parameter-server loop does not (yet): there the signals keep their default action.
  if (!ps) {
    install_preemption_handlers();
  } else if (rank == chief) {
    spdlog::info(
        "--strategy ps: SIGTERM and SIGUSR1 end the job without a last checkpoint "
        "(resume from the last periodic one)");
  }
  // The watchdog and the transport's backstop deadline were set up by main(), with comm.
  set_cpu_threads(o.threads);
  // --device: this rank's GPU is given by its local rank. The session (streams, cuBLAS and
  // cuDNN handles) is declared before the model so that it outlives every device tensor.
  const DeviceChoice device = choose_device(o.device, comm.local_rank(), comm.local_size());
  check_device_flags(o, ranks, device);
  DeviceSession session(device);
  Context& ctx = session.context();
  spdlog::info("device: {} ({}){}", to_string(device.device), device.why,
               device.device == Device::kCuda ? "; " + session.description() : std::string());
  ctx.threads = o.threads;
  ctx.board = &comm.board();  // every layer and device wait is progress for the watchdog
  ctx.conv_impl = o.conv_impl;

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

  std::unique_ptr<Model> model = make_model({.name = o.model,
                                             .hidden = o.hidden,
                                             .height = data.train.rows,
                                             .width = data.train.cols,
                                             .classes = 10,
                                             .device = ctx.device});
  // --strategy ps: the job's communicator with the chief (worker 0, world rank --num-ps) first,
  // so that it is the one that reads checkpoints; a split communicator posts its waits on its
  // parent's board, which the watchdog reads.
  std::optional<MpiComm> job;
  if (ps) job.emplace(comm, 0, (rank - o.num_ps + ranks) % ranks);
  Comm& control = job ? static_cast<Comm&>(*job) : comm;
  // The first collective: nothing that depends on the flags runs before the ranks agree on them.
  check_config_consistency(control, config_fields(o, *model, data, ctx.device));
  if (rank == chief && ranks > 1)
    spdlog::info("configuration check: all {} ranks agree ({})", ranks, RINGTRAIN_CODE_VERSION);

  const std::optional<Checkpoint> resumed = resolve_checkpoint(control, o);
  const JobShape shape{.ranks = ranks,
                       .data_ranks = ps ? ranks - o.num_ps : ranks,
                       .local_size = comm.local_size(),
                       .cores = static_cast<int>(std::thread::hardware_concurrency()),
                       .device = ctx.device,
                       .train_images = data.train.count};
  const RunPlan plan =
      plan_run(o, shape,
               resumed ? std::optional<ResumePoint>(ResumePoint{.step = resumed->step,
                                                                .global_batch = resumed->global_batch,
                                                                .ranks = resumed->ranks})
                       : std::nullopt);
  if (!plan.resume_note.empty() && rank == chief) spdlog::warn("{}", plan.resume_note);
  o.batch_size = plan.batch_size;
  if (ps) {
    return run_parameter_servers(o, comm, *job,
                                 StrategySetup{.data = data,
                                               .data_dir = data_dir,
                                               .model = *model,
                                               .ctx = ctx,
                                               .plan = plan,
                                               .resumed = resumed});
  }
  return train(Job{.o = o,
                   .comm = comm,
                   .data = data,
                   .model = *model,
                   .ctx = ctx,
                   .plan = plan,
                   .resumed = resumed});
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
