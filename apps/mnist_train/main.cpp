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
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "averaging.h"
#include "batch_feed.h"
#include "checkpoint_writer.h"
#include "config_file.h"
#include "evaluation.h"
#include "finite_guard.h"
#include "job_config.h"
#include "local_sgd.h"
#include "lost_scaling.h"
#include "model_export.h"
#include "options.h"
#include "ps_strategy.h"
#include "replica.h"
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
#include "timeline_recording.h"

namespace {

using namespace ringtrain;
using namespace ringtrain::app;
using Clock = std::chrono::steady_clock;

// What the ring's and local SGD's loop trains with, built by run().
struct Job {
  const Options& o;
  MpiComm& comm;
  const MnistData& data;
  const std::string& data_dir;
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
  double reference_ms = 0.0;  // Averaging::reference_ms
  Allreduce::Tally wire;      // what the averaging sent (bytes_sent -1: not counted)
};

// The summary's account of the wire: bytes this rank sent per step (the ring's payload and,
// on fp16, the bound exchange) and what the fp16 scale cost.
double wire_bytes_per_step(const RingTotals& t) {
  if (t.wire.bytes_sent < 0) return -1.0;
  return t.run.trained_steps > 0
             ? static_cast<double>(t.wire.bytes_sent) / static_cast<double>(t.run.trained_steps)
             : 0.0;
}

// The lost-scaling lines of the summary, and their metrics fields (lost_scaling.h).
void report_lost_scaling(const Job& job, const LostScaling& lost, const RingTotals& t,
                         std::vector<JsonField>& record) {
  const int ranks = job.comm.size();
  const double busbw = lost.achieved_busbw_gbps();
  const double reference_busbw = bus_bandwidth_gbps(
      job.model.grads().numel() * static_cast<int64_t>(sizeof(float)), ranks, t.reference_ms);
  if (ranks > 1 && lost.steps() > 0)
    spdlog::info(
        "summary: lost scaling per step (rank 0): {:.3f} ms waiting for the slowest rank (rank {} "
        "was the last to hand in its gradients in {:.0f}% of {} steps), {:.3f} ms exposed "
        "communication",
        lost.mean_wait_ms(), lost.slowest_rank(), lost.slowest_share() * 100.0, lost.steps(),
        lost.mean_exposed_ms());
  if (ranks > 1 && busbw > 0)
    spdlog::info(
        "summary: communication {:.3f} ms per step less the wait: {:.2f} GB/s bus bandwidth{}",
        lost.mean_comm_ms(), busbw,
        reference_busbw > 0
            ? fmt::format(", {:.0f}% of the {:.2f} GB/s the same allreduce reaches alone on "
                          "these bucket sizes",
                          busbw / reference_busbw * 100.0, reference_busbw)
            : std::string());
  record.insert(record.end(), {{"slowest_wait_ms", lost.mean_wait_ms()},
                               {"exposed_wire_ms", lost.mean_exposed_ms()},
                               {"slowest_rank", int64_t{lost.slowest_rank()}},
                               {"slowest_share", lost.slowest_share()},
                               {"comm_busbw_gbps", busbw},
                               {"reference_busbw_gbps", reference_busbw},
                               {"reference_comm_ms", t.reference_ms}});
}

void report_ring_run(const Job& job, const RingTotals& t, const LostScaling& lost,
                     MetricsWriter& metrics) {
  const Options& o = job.o;
  const int ranks = job.comm.size();
  std::string extra;
  if (job.plan.accumulate_steps > 1)
    extra += fmt::format(", optimizer steps of {} passes each (--accumulate-steps)",
                         job.plan.accumulate_steps);
  if (t.skipped_steps > 0)
    extra += fmt::format(", {} update(s) skipped (--check-finite)", t.skipped_steps);
  log_summary(t.eval, t.ema ? " (EMA weights)" : "", t.last_loss, t.run, extra);
  if (o.cuda_graphs)
    spdlog::info("summary: CUDA graphs: {} of {} steps replayed a graph, {} capture(s)",
                 t.graph_steps, t.run.trained_steps, t.graph_captures);
  spdlog::info(
      "summary: per step {:.3f} ms compute, {:.3f} ms communication of which {:.3f} ms "
      "exposed: overlap efficiency {:.0f}% ({} ranks, {})",
      t.times.mean(t.times.compute_ms), t.times.mean(t.times.comm_ms),
      t.times.mean(t.times.exposed_ms), std::max(0.0, t.times.overlap_efficiency()) * 100.0, ranks,
      t.overlap ? "overlapped" : "not overlapped");
  const double steps = static_cast<double>(std::max<int64_t>(1, t.run.trained_steps));
  if (t.wire.bytes_sent >= 0 && ranks > 1)
    spdlog::info(
        "summary: {} wire: {:.3f} MB sent per step by this rank{}", to_string(o.grad_wire),
        wire_bytes_per_step(t) / 1e6,
        o.grad_wire == GradWire::kFp16
            ? fmt::format(" (bucket bounds: {:.3f} ms per step to scan, {:.3f} ms to allgather, "
                          "waiting for the slowest rank included; {} bucket(s) sent as fp32 for "
                          "a NaN or an infinity)",
                          t.wire.bound_scan_ms / steps, t.wire.bound_exchange_ms / steps,
                          t.wire.fp32_fallbacks)
            : std::string());
  const bool local_sgd = o.strategy == Strategy::kLocalSgd;
  std::vector<JsonField> record = {{"test_accuracy", t.eval.accuracy()},
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
                                   {"accumulate_steps", job.plan.accumulate_steps},
                                   {"global_batch", job.plan.global_batch},
                                   {"reproducible", o.reproducible},
                                   {"micro_batch", o.reproducible ? o.micro_batch : int64_t{0}},
                                   {"world_size", int64_t{ranks}},
                                   {"ranks", int64_t{ranks}},
                                   {"compute_ms", t.times.mean(t.times.compute_ms)},
                                   {"comm_ms", t.times.mean(t.times.comm_ms)},
                                   {"exposed_comm_ms", t.times.mean(t.times.exposed_ms)},
                                   {"overlap_efficiency", t.times.overlap_efficiency()},
                                   {"overlap", t.overlap},
                                   {"allreduce", std::string(to_string(o.allreduce))},
                                   {"grad_wire", std::string(to_string(o.grad_wire))},
                                   {"wire_bytes_per_step", wire_bytes_per_step(t)},
                                   {"bound_scan_ms", t.wire.bound_scan_ms / steps},
                                   {"bound_exchange_ms", t.wire.bound_exchange_ms / steps},
                                   {"fp32_fallbacks", t.wire.fp32_fallbacks},
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
                                   {"data_dir", job.data_dir}};
  report_lost_scaling(job, lost, t, record);
  metrics.write("summary", record);
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
  metrics.write("preempted", {{"step", step}, {"signal", int64_t{signal}}, {"checkpoint", saved}});
  return static_cast<int>(ExitCode::kPreempted);
}

// --test-perturb-rank: one parameter nudged, so that the replica check must catch it.
void perturb_for_test(Model& model) {
  std::vector<float> host = model.params_to_host();
  host.back() += 1e-3f;
  model.params_from_host(host);
}

// The ring's (and local SGD's) training, from the replica's start to the summary.
int train(const Job& job) {
  const Options& o = job.o;
  MpiComm& comm = job.comm;
  Model& model = job.model;
  const RunPlan& plan = job.plan;
  const int rank = comm.rank(), ranks = comm.size();
  Replica replica = start_replica(o, plan, comm, model, job.ctx, job.resumed);
  Optimizer& optimizer = *replica.optimizer;
  WeightEma* const ema = replica.ema ? &*replica.ema : nullptr;
  spdlog::info("model {}:\n{}", o.model, model.summary());
  // Only the chief writes files; the others would write the same lines.
  MetricsWriter metrics = o.metrics_out.empty() || rank != 0
                              ? MetricsWriter()
                              : MetricsWriter(o.metrics_out, /*append=*/plan.start_step > 0);
  write_config_record(metrics, o);
  spdlog::info(
      "training: {} steps ({} per epoch){}, {} rank(s) x batch {}{} = global batch {}, {} "
      "lr {} ({}), {} thread(s) per rank, seed {}",
      plan.total_steps, plan.steps_per_epoch,
      plan.start_step > 0 ? fmt::format(" from step {}", plan.start_step) : std::string(), ranks,
      plan.batch_size,
      plan.accumulate_steps > 1
          ? fmt::format(" x {} passes (--accumulate-steps: a step, and every count of steps, "
                        "is an optimizer step)",
                        plan.accumulate_steps)
          : std::string(),
      plan.global_batch, optimizer.name(), plan.schedule.base_lr, plan.schedule.kind, o.threads,
      o.seed);
  // --timeline; declared before the GradSync that records into it, so that it outlives it.
  TimelineRecording timeline(o, comm);
  Averaging averaging = make_averaging(o, plan, comm, model, job.ctx);
  GradSync* const grad_sync = averaging.grad_sync.get();
  LocalSgd local_sgd(o.strategy == Strategy::kLocalSgd ? averaging.allreduce.get() : nullptr,
                     o.average_every, plan.total_steps);
  CheckpointWriter checkpoints(o, metrics, comm.board());
  const CheckpointHeader header = checkpoint_header(o, model, plan, ranks, optimizer.name());
  FiniteGuard guard(o, comm);
  const BeforeUpdateFn before_update = guard.hook();
  // Preemption: a stop requested by a signal on any rank is agreed on at a step boundary, the
  // same on every rank (preemption.h).
  StopAgreement stop_agreement(comm);
  int stop_signal = 0;  // agreed by every rank: a stop at the next step boundary
  BatchFeed feed(o, plan, job.data.train, model, rank, ranks);
  StepWorkspace workspace;
  workspace.cuda_graph = o.cuda_graphs;
  workspace.board = &comm.board();  // computing and device waits are progress for the watchdog
  workspace.exact_sum = averaging.exact_sum.get();
  feed.attach(workspace);
  timeline.attach(model, grad_sync, workspace, feed);
  Batch eval_scratch;
  Tensor ema_swap;  // --ema-decay on a GPU: the trained weights while the EMA ones are evaluated
  RingTotals totals{.run = {.start_step = plan.start_step, .global_batch = plan.global_batch},
                    .buckets = grad_sync ? static_cast<int64_t>(grad_sync->buckets().size()) : 0,
                    .ema = ema != nullptr,
                    .overlap = plan.grad_sync.overlap,
                    .reference_ms = averaging.reference_ms};
  // Each step's figures reach the other ranks with the next step's stop agreement.
  LostScaling lost(rank, ranks, model.grads().numel() * static_cast<int64_t>(sizeof(float)));
  struct StepFigures {
    double compute_ms = 0, exposed_ms = 0, comm_ms = 0;
  };
  std::optional<StepFigures> previous;
  // When the last step's train_step returned: the ranks' clocks pass that moment together
  // (its last allreduce ends everywhere at once), so the time from there to the end of the
  // next backward is what each rank took, whatever it did (data, a checkpoint, a stall).
  std::optional<Clock::time_point> last_step_end;
  // After the exchange that carried `sent`'s compute time: the account of that step.
  const auto account = [&](const std::optional<StepFigures>& sent) {
    if (sent) lost.add(stop_agreement.figures(), sent->exposed_ms, sent->comm_ms);
  };
  ProgressBar progress(rank == 0 ? plan.total_steps - std::min(plan.start_step, plan.total_steps)
                                 : 0);
  const bool show_progress = rank == 0 && progress.enabled();
  TrainWindow window;
  // What the Allreduce had counted before training (the communication reference's runs).
  const Allreduce::Tally wire_at_start =
      averaging.allreduce ? averaging.allreduce->tally() : Allreduce::Tally{.bytes_sent = 0};
  int64_t wire_bytes_sent = wire_at_start.bytes_sent;  // the count at the end of the last step
  double& train_seconds = totals.run.train_seconds;
  CheckpointSchedule schedule(o, plan.start_step);
  // On an error, abort NCCL before anything declared above is destroyed: freeing device
  // memory waits for the whole device, and a bucket's transfer whose peer will never join
  // would make that wait, and the job, hang. Declared last, so it is destroyed first.
  const AbortAllreduceOnError abort_on_error(averaging.allreduce.get());

  if (plan.start_step >= plan.total_steps && rank == 0)
    spdlog::info("the checkpoint is at step {}, the run ends at {}: nothing left to train",
                 plan.start_step, plan.total_steps);
  for (int64_t step = plan.start_step; step < plan.total_steps; ++step) {
    comm.board().set_step(step);
    guard.set_step(step);
    timeline.set_step(step);
    inject_test_failures(o, rank, step);
    if (rank == o.test_preempt_rank && step == o.test_preempt_at_step) request_preemption(SIGTERM);
    const std::optional<StepFigures> sent_figures = previous;
    stop_agreement.start(preemption_signal(), sent_figures ? sent_figures->compute_ms : 0.0);
    const auto start = Clock::now();
    const int64_t epoch = step / plan.steps_per_epoch;
    const float lr = learning_rate(plan.schedule, step);
    StepStats stats = train_step(model, optimizer, feed.inputs(step), lr, workspace, job.ctx,
                                 grad_sync, before_update);
    const auto step_end = Clock::now();
    if (last_step_end)
      previous = StepFigures{
          .compute_ms =
              std::chrono::duration<double, std::milli>(step_end - *last_step_end).count() -
              stats.comm.exposed_ms,
          .exposed_ms = stats.comm.exposed_ms,
          .comm_ms = stats.comm.comm_ms};
    last_step_end = step_end;
    if (grad_sync != nullptr) {
      const int64_t sent = averaging.allreduce->tally().bytes_sent;
      if (sent >= 0) window.add_wire_bytes(sent - std::exchange(wire_bytes_sent, sent));
    }
    // Every rank learns here whether any rank asked to stop, so all stop after the same step:
    // this one, or under local-sgd the next parameter average (a step where the replicas, and
    // so the checkpoint, are the job's whole state: an extra average would change the result).
    if (const int agreed = stop_agreement.finish(); agreed != 0 && stop_signal == 0)
      stop_signal = agreed;
    account(sent_figures);
    const bool averaged = local_sgd.due(step);
    if (averaged) {
      const PhaseScope phase(comm.board(), "parameter average");
      const TraceScope span(timeline.get(), TraceKind::kParamAverage);
      stats.comm.comm_ms = stats.comm.exposed_ms = local_sgd.average(model, optimizer);
    }
    if (ema && stats.updated) {
      const Tensor& params = model.params();
      ema->update({params.data(), static_cast<size_t>(params.numel())});
    }
    const double step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    train_seconds += step_seconds;
    timeline.record_step(start);
    // A device step's time comes from CUDA events on the compute stream.
    const double step_ms = stats.device_ms.value_or(step_seconds * 1000.0);
    totals.times.add(step_ms, stats.comm);
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
    if (done == 1 && rank == o.test_perturb_rank) perturb_for_test(model);
    // Between averages local-sgd replicas differ by design: they are checked after an average.
    const bool replicas_equal = !local_sgd.active() || averaged;
    const bool stopping = stop_signal != 0 && replicas_equal && done < plan.total_steps;
    if (o.check_replicas > 0 && done % o.check_replicas == 0 && replicas_equal)
      check_replicas(comm, model, done);
    const double images_per_sec =
        static_cast<double>((done - plan.start_step) * plan.global_batch) / train_seconds;
    if (show_progress)
      progress.update(done - plan.start_step, fmt::format("epoch {} loss {:.4f} {:.0f} img/s",
                                                          epoch + 1, stats.loss, images_per_sec));
    if (o.log_every > 0 && (done % o.log_every == 0 || done == plan.total_steps) &&
        !window.empty()) {
      window.report(done, plan.total_steps, epoch + 1, lr, images_per_sec, train_seconds,
                    !show_progress, metrics);
      // The steps accounted so far (the last one's figures come with the next exchange).
      const LostScaling::Window scaling = lost.take_window();
      if (scaling.steps > 0)
        metrics.write("scaling", {{"step", done},
                                  {"steps", scaling.steps},
                                  {"slowest_wait_ms", scaling.wait_ms},
                                  {"exposed_wire_ms", scaling.exposed_ms},
                                  {"slowest_rank", int64_t{scaling.slowest_rank}}});
    }
    if (o.eval_every > 0 && done % o.eval_every == 0 && done != plan.total_steps &&
        replicas_equal) {
      const TraceScope span(timeline.get(), TraceKind::kEvaluation);
      const EvalResult eval = evaluate_test(comm, model, job.data.test, o.eval_batch, ema,
                                            eval_scratch, job.ctx, ema_swap);
      report_eval(done, eval, train_seconds, !show_progress, metrics);
    }
    // Checked before a write: the next run starts from it.
    const bool write = schedule.due(done, replicas_equal) || stopping;
    if (stopping) check_replicas(comm, model, done);
    if (checkpoints.enabled() && write && done != plan.total_steps) {
      // The chief writes its replica: every replica holds the same bits.
      const TraceScope span(timeline.get(), TraceKind::kCheckpoint);
      if (rank == 0) checkpoints.save(replica_checkpoint(header, done, model, replica));
      schedule.written(done);
    }
    if (stopping) {
      if (show_progress) progress.finish();
      timeline.write(comm);
      return report_preemption(job, stop_signal, done, checkpoints.enabled(), metrics);
    }
  }
  if (show_progress) progress.finish();
  comm.board().set_step(plan.total_steps);
  if (previous) {  // the last step's figures: one more exchange, on every rank alike
    stop_agreement.start(0, previous->compute_ms);
    stop_agreement.finish();
    account(previous);
  }
  check_replicas(comm, model, plan.total_steps);  // always once: replicas must end identical
  if (checkpoints.enabled() && schedule.last_written() != plan.total_steps && rank == 0) {
    const TraceScope span(timeline.get(), TraceKind::kCheckpoint);
    checkpoints.save(replica_checkpoint(header, plan.total_steps, model, replica));
  }
  {
    const TraceScope span(timeline.get(), TraceKind::kEvaluation);
    totals.eval = evaluate_test(comm, model, job.data.test, o.eval_batch, ema, eval_scratch,
                                job.ctx, ema_swap);
  }
  timeline.write(comm);
  totals.run.trained_steps = std::max<int64_t>(0, plan.total_steps - plan.start_step);
  totals.skipped_steps = guard.skipped_steps();
  totals.graph_captures = step_graph_captures(workspace);
  totals.averages = local_sgd.averages();
  // One rank sends nothing.
  totals.wire =  // training's share only
      (averaging.allreduce ? averaging.allreduce->tally() : Allreduce::Tally{.bytes_sent = 0})
          .since(wire_at_start);
  report_ring_run(job, totals, lost, metrics);
  if (rank == 0) {
    save_final_params(o, model, comm.board());
    export_final_model(o, model, ema, job.data.test, job.ctx);
  }
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
  if (o.reproducible) fix_cpu_gemm_blocking();
  // --device: this rank's GPU is given by its local rank. The session (streams, cuBLAS and
  // cuDNN handles) is declared before the model so that it outlives every device tensor.
  const DeviceChoice device = choose_device(o.device, comm.local_rank(), comm.local_size());
  check_device_flags(o, ranks, device);
  DeviceSession session(device);
  Context& ctx = session.context();
  spdlog::info("device: {} ({}){}", to_string(device.device), device.why,
               device.device == Device::kCuda ? "; " + session.description() : std::string());
  ctx.threads = o.threads;
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
  check_export_flags(o, *model, rank == chief);
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
  const RunPlan plan = plan_run(
      o, shape,
      resumed ? std::optional<ResumePoint>(ResumePoint{.step = resumed->step,
                                                       .global_batch = resumed->global_batch,
                                                       .ranks = resumed->ranks,
                                                       .micro_batch = resumed->micro_batch})
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
                   .data_dir = data_dir,
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
  ConfigFlags config_flags;
  add_config_flags(app, config_flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // A bad key or value in --config's file is told with the file and the key, which CLI11's
    // own message does not name.
    const std::string problem = error.get_exit_code() == 0 ? "" : check_config_file(app);
    if (!problem.empty()) {
      fmt::print(stderr, "{}\n", problem);
      return static_cast<int>(ExitCode::kUsage);
    }
    // --help and --version exit 0; every flag error exits kUsage (CLI11's own codes vary).
    const int printed = app.exit(error);
    if (printed != 0 && !config_path(app).empty())
      fmt::print(stderr, "(the flags in --config {} count as given, as on the command line)\n",
                 config_path(app));
    return printed == 0 ? 0 : static_cast<int>(ExitCode::kUsage);
  }
  // Even a value the command line overrides must be valid in the file.
  if (const std::string problem = check_config_file(app); !problem.empty()) {
    fmt::print(stderr, "{}\n", problem);
    return static_cast<int>(ExitCode::kUsage);
  }
  options.effective_config = effective_config(app);
  if (config_flags.print_config) {
    fmt::print("{}", options.effective_config);
    return 0;
  }
  options.batch_size_given = app.count("--batch-size") > 0;
  for (const char* flag : {"--num-ps", "--ps-mode", "--replicas-to-aggregate", "--max-staleness",
                           "--average-every", "--allreduce", "--micro-batch"}) {
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
