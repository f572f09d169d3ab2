// mnist_train --strategy ps: the parameter-server strategy of the source documents (ps.h).
// run() in main.cpp has loaded the data, built the model, checked the ranks'
// configurations and found the checkpoint; here each rank becomes a server or a worker.
//
// A server serves its shard until every worker is done. A worker runs the loop: its share of
// the step's global batch, forward and backward, push the gradients and pull the parameters
// (one round trip per server), log, evaluate, checkpoint. The chief (worker 0) also assembles
// the servers' snapshots into checkpoints and reports for the whole job at the end.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint_writer.h"
#include "config_file.h"
#include "model_export.h"
#include "ps_strategy.h"
#include "reporting.h"
#include "resume.h"
#include "ringtrain/check.h"
#include "ringtrain/dense_terms.h"
#include "ringtrain/distributed.h"
#include "ringtrain/exact_sum.h"
#include "ringtrain/log.h"
#include "ringtrain/ps_mpi.h"
#include "ringtrain/report.h"
#include "ringtrain/train.h"
#include "test_faults.h"

namespace ringtrain::app {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A worker whose gradients are refused this many times in a row cannot keep up under
// --max-staleness: stop with advice instead of recomputing forever.
constexpr int64_t kMaxConsecutiveRejections = 200;

// What each rank reports at the end; fixed size, so that one allgather collects the job's.
struct RankReport {
  int32_t is_server = 0;
  int32_t index = 0;  // server or worker index
  PsServerStats server;
  int64_t rounds = 0;    // worker: push rounds
  int64_t accepted = 0;  // worker: steps every server took the gradients of
  int64_t dropped = 0;   // worker, sync: steps some server dropped as stale
  int64_t retries = 0;   // worker, async: recomputations after a rejection
  int64_t bytes_sent = 0, bytes_received = 0;
  double compute_ms = 0.0, wait_ms = 0.0;
};

struct WorkerResult {
  EvalResult eval;
  double train_seconds = 0.0;
  double last_loss = 0.0;
};

struct PsPlan {
  PsMode mode = PsMode::kSync;
  int aggregate = 1;
  int64_t max_staleness = 0;
  int64_t versions_per_step = 1;  // sync: one update per step; async: one per worker's step
  PsLayout layout;
  std::string optimizer_name;
};

// True when `value` passed a multiple of `every` going from `before` (exclusive) to it: a
// sync worker's step can jump when its gradients are dropped.
bool crossed(int64_t before, int64_t value, int64_t every) {
  return every > 0 && value / every > before / every;
}

// A worker's side of one step's exchange with the servers, and what it keeps between steps.
struct Exchange {
  PsClient& client;
  std::span<const float> grads;
  std::span<float> params;
  std::vector<int64_t>& versions;
  std::vector<uint8_t>& push;
  std::vector<uint8_t>& accepted;
  RankReport& report;
  // --reproducible: the micro-shards' fixed-point sums are pushed instead of `grads`.
  const ExactGradSum* exact = nullptr;
  std::span<const int> shifts;
};

// Sync: every server gets the gradients for the oldest version this worker holds, the step it
// just trained (ps.h). Its answers say where each server is now; the next step (returned) is
// the oldest of them, so a worker whose gradients came too late moves on to the current step.
int64_t exchange_sync(Exchange& x, float lr, int64_t step) {
  std::fill(x.versions.begin(), x.versions.end(), step);
  const auto start = Clock::now();
  if (x.exact != nullptr) {
    x.client.push_pull_exact(x.exact->sums(), x.shifts, x.params, x.versions, x.push, x.accepted,
                             lr, step);
  } else {
    x.client.push_pull(x.grads, x.params, x.versions, x.push, x.accepted, lr, step);
  }
  x.report.wait_ms += ms_since(start);
  ++x.report.rounds;
  const bool all_taken =
      std::all_of(x.accepted.begin(), x.accepted.end(), [](uint8_t a) { return a != 0; });
  ++(all_taken ? x.report.accepted : x.report.dropped);
  return *std::min_element(x.versions.begin(), x.versions.end());
}

// Async: pushes until every server took the gradients. A server that found them too stale
// sent back its parameters: recompute() on those, and push again to those servers only.
void exchange_async(Exchange& x, const PsPlan& plan, float lr, int64_t step,
                    int64_t& rejections_in_a_row, int worker, int rank,
                    const std::function<void()>& recompute) {
  std::fill(x.push.begin(), x.push.end(), 1);
  for (;;) {
    auto start = Clock::now();
    x.client.push_pull(x.grads, x.params, x.versions, x.push, x.accepted, lr, step);
    x.report.wait_ms += ms_since(start);
    ++x.report.rounds;
    bool refused = false;
    for (size_t s = 0; s < x.push.size(); ++s) {
      x.push[s] = x.accepted[s] ? 0 : 1;
      refused |= x.push[s] != 0;
    }
    if (!refused) break;
    ++x.report.retries;
    if (++rejections_in_a_row >= kMaxConsecutiveRejections)
      throw Error(fmt::format("worker {} (rank {}): its gradients were more than "
                              "--max-staleness {} updates old {} times in a row at step {}: "
                              "it is too slow for this bound; raise --max-staleness or use "
                              "--ps-mode sync",
                              worker, rank, plan.max_staleness, rejections_in_a_row, step),
                  ExitCode::kError);
    start = Clock::now();
    recompute();
    x.report.compute_ms += ms_since(start);
  }
  rejections_in_a_row = 0;
  ++x.report.accepted;
}

WorkerResult run_worker(const Options& o, const StrategySetup& setup, const PsPlan& plan,
                        PsChannel& channel, MpiComm& world, MpiComm& job, MpiComm& workers_comm,
                        RankReport& report) {
  const int worker = job.rank(), workers = plan.layout.workers;
  const auto servers = static_cast<size_t>(plan.layout.servers);
  const bool chief = worker == 0;
  Model& model = setup.model;
  Context& ctx = setup.ctx;
  const auto n = static_cast<size_t>(model.num_params());
  const std::span<float> params(model.params().data(), n);
  const std::span<const float> grads(model.grads().data(), n);
  std::vector<int64_t> versions(servers, setup.plan.start_step * plan.versions_per_step);
  std::vector<uint8_t> push(servers, 1), accepted(servers, 0);
  PsClient client(channel, plan.layout, worker);

  MetricsWriter metrics = o.metrics_out.empty() || !chief
                              ? MetricsWriter()
                              : MetricsWriter(o.metrics_out, /*append=*/setup.plan.start_step > 0);
  write_config_record(metrics, o);
  std::optional<CheckpointWriter> checkpoints;
  if (chief && !o.checkpoint_dir.empty()) checkpoints.emplace(o, metrics, world.board());
  const CheckpointHeader header =
      checkpoint_header(o, model, setup.plan, workers, plan.optimizer_name);
  // The chief writes the snapshots the servers sent: the shards of one version, assembled.
  int64_t last_written = -1;
  const auto write_checkpoints = [&](std::vector<PsSnapshot> snapshots) {
    for (PsSnapshot& snapshot : snapshots) {
      Checkpoint c = checkpoint_at(header, snapshot.step);
      c.params = std::move(snapshot.params);
      c.optimizer_steps = snapshot.optimizer_steps;
      c.optimizer_state = std::move(snapshot.state);
      checkpoints->save(c, fmt::format(" (assembled from {} server(s))", servers));
      last_written = c.step;
    }
  };

  EpochSampler sampler(setup.data.train.count, o.seed);
  Batch batch, eval_scratch;
  StepWorkspace workspace;
  workspace.board = &world.board();
  // --reproducible: micro-shards summed exactly; the scales are agreed among the workers and
  // the servers add the sums as integers (ps.h).
  std::optional<ExactGradSum> exact;
  std::vector<int> shifts;
  if (o.reproducible) {
    exact.emplace(workers_comm, model.grads().data(), model.grad_ranges(), setup.plan.micro_shards,
                  setup.plan.local_micro_shards, RingOptions{},
                  DenseShardTerms::make_for(model, o.micro_batch, setup.plan.local_micro_shards));
    workspace.exact_sum = &*exact;
    workspace.exact_sum_by_caller = true;
    shifts.resize(exact->segments().size());
  }
  WorkerResult result;
  TrainWindow window;
  int64_t rejections_in_a_row = 0;
  const int64_t total = setup.plan.total_steps;
  const auto train_start = Clock::now();
  // The chief's evaluations and checkpoint writes are not training time (as under the ring),
  // though in sync mode the other workers wait for the chief's gradients meanwhile.
  double untimed_seconds = 0.0;
  const auto training_seconds = [&] {
    return std::chrono::duration<double>(Clock::now() - train_start).count() - untimed_seconds;
  };
  // step: the global batch whose slice this worker trains next. job_step: how far the job is,
  // in global batches: sync, the same as step; async, the first server's updates / workers
  // (every worker runs until the servers have applied workers x steps updates, so fast workers
  // do more of them than slow ones, as in TensorFlow's async training).
  int64_t step = setup.plan.start_step, job_step = setup.plan.start_step;
  while (job_step < total) {
    world.board().set_step(job_step);
    world.board().set_phase("gradient computation");
    inject_test_failures(o, world.rank(), job_step);
    const auto indices =
        rank_batch(sampler.order(step / setup.plan.steps_per_epoch),
                   step % setup.plan.steps_per_epoch, o.batch_size, worker, workers);
    make_batch(setup.data.train, indices, batch.images, batch.labels);
    // --test-nan-rank: a NaN in this worker's batch, as BatchFeed puts one under the ring.
    if (world.rank() == o.test_nan_rank &&
        std::find(o.test_nan_steps.begin(), o.test_nan_steps.end(), step) != o.test_nan_steps.end())
      batch.images.data()[0] = std::nanf("");
    const float lr = learning_rate(setup.plan.schedule, job_step);
    auto start = Clock::now();
    const StepStats stats = compute_gradients(model, batch, workspace, ctx);
    // --test-long-compute-ms: a compute step longer than the servers' wait may last, but
    // moving: more forward passes, each posted as progress as a step's is, until that long
    // has passed.
    while (ms_since(start) < o.test_long_compute_ms) {
      model.forward(batch.images, ctx);
      world.board().progress();
    }
    // Collective over the workers, before anything that one worker alone may throw for. Each
    // worker then fails as one rank does (the servers, which wait for its push, are ended with
    // the job).
    if (exact && !exact->local_sums(shifts))
      throw Error(fmt::format("worker {} (rank {}): step {}: a gradient became NaN or infinite "
                              "on some worker: lower --lr (now {}) or check the data",
                              worker, world.rank(), step, lr),
                  ExitCode::kNonFinite);
    report.compute_ms += ms_since(start);
    if (!std::isfinite(stats.loss))
      throw Error(fmt::format("worker {} (rank {}): the loss became {} at step {}: lower --lr "
                              "(now {}) or check the data",
                              worker, world.rank(), stats.loss, step, lr),
                  ExitCode::kNonFinite);
    const int64_t before = job_step;
    world.board().set_phase(kPsPhase);
    Exchange exchange{.client = client,
                      .grads = grads,
                      .params = params,
                      .versions = versions,
                      .push = push,
                      .accepted = accepted,
                      .report = report,
                      .exact = exact ? &*exact : nullptr,
                      .shifts = shifts};
    if (plan.mode == PsMode::kSync) {
      step = job_step = exchange_sync(exchange, lr, step);
    } else {
      exchange_async(exchange, plan, lr, step, rejections_in_a_row, worker, world.rank(),
                     [&] { compute_gradients(model, batch, workspace, ctx); });
      ++step;
      job_step = versions[0] / plan.versions_per_step;
    }
    window.add(stats);
    result.last_loss = stats.loss;
    if (!chief) continue;
    const double seconds = training_seconds();
    if (checkpoints) {
      const auto write_start = Clock::now();
      write_checkpoints(client.collect_snapshots());
      untimed_seconds += std::chrono::duration<double>(Clock::now() - write_start).count();
    }
    if ((crossed(before, job_step, o.log_every) || job_step >= total) && o.log_every > 0) {
      // The job's rate: global batches of the servers' progress.
      window.report(
          job_step, total, job_step / setup.plan.steps_per_epoch + 1, lr,
          static_cast<double>((job_step - setup.plan.start_step) * setup.plan.global_batch) /
              seconds,
          seconds, /*print=*/true, metrics);
    }
    if (crossed(before, job_step, o.eval_every) && job_step < total) {
      // The chief's copy: the parameters its last answers brought.
      const auto eval_start = Clock::now();
      const EvalResult eval = evaluate(model, setup.data.test, 0, setup.data.test.count,
                                       o.eval_batch, eval_scratch, ctx, &world.board());
      untimed_seconds += std::chrono::duration<double>(Clock::now() - eval_start).count();
      report_eval(job_step, eval, seconds, /*print=*/true, metrics);
    }
  }
  // Done: every worker gets the final parameters once all are done.
  world.board().set_step(total);
  client.finish(params, versions);
  result.train_seconds = training_seconds();
  // The servers' last snapshot is of the final step (unless one of that step came already).
  if (checkpoints && setup.plan.start_step < total) {
    write_checkpoints(client.collect_snapshots(last_written == total ? -1 : total));
  }
  report.bytes_sent = client.bytes_sent();
  report.bytes_received = client.bytes_received();
  check_replicas(workers_comm, model, total);  // the final answers are the same bits for all
  result.eval =
      evaluate_sharded(workers_comm, model, setup.data.test, o.eval_batch, eval_scratch, ctx);
  if (chief) {
    metrics.write("eval", {{"step", total},
                           {"test_accuracy", result.eval.accuracy()},
                           {"test_loss", result.eval.mean_loss()},
                           {"train_seconds", result.train_seconds}});
  }
  return result;
}

void serve(const Options& o, const StrategySetup& setup, const PsPlan& plan, PsChannel& channel,
           MpiComm& job, RankReport& report) {
  const int server = job.rank() - plan.layout.workers;
  const ShardRange range = plan.layout.shards[static_cast<size_t>(server)];
  ShardServer shard({.mode = plan.mode,
                     .workers = plan.layout.workers,
                     .replicas_to_aggregate = plan.aggregate,
                     .max_staleness = plan.max_staleness,
                     .exact_pieces = plan.layout.exact_pieces.empty()
                                         ? std::vector<SegmentPiece>{}
                                         : plan.layout.exact_pieces[static_cast<size_t>(server)],
                     .exact_micro_shards = setup.plan.micro_shards},
                    range, make_optimizer(o.optimizer, range.size()));
  std::vector<std::vector<float>> state;
  int64_t optimizer_steps = 0;
  if (setup.resumed) {
    for (const std::vector<float>& buffer : setup.resumed->optimizer_state)
      state.emplace_back(buffer.begin() + range.begin, buffer.begin() + range.end);
    optimizer_steps = setup.resumed->optimizer_steps;
  }
  shard.start({setup.model.params().data() + range.begin, static_cast<size_t>(range.size())}, state,
              optimizer_steps, setup.plan.start_step * plan.versions_per_step);
  const bool checkpointing = !o.checkpoint_dir.empty();
  report.is_server = 1;
  report.index = server;
  report.server = serve_shard(
      channel, plan.layout, server, shard,
      {.snapshot_every = checkpointing ? o.checkpoint_every : 0,
       .final_snapshot = checkpointing && setup.plan.start_step < setup.plan.total_steps,
       .versions_per_step = plan.versions_per_step});
}

std::string megabytes(int64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

void report_job(const Options& o, const StrategySetup& setup, const PsPlan& plan,
                const std::vector<RankReport>& reports, const WorkerResult& result) {
  const int workers = plan.layout.workers, servers = plan.layout.servers;
  PsServerStats all;  // the servers' figures, summed (staleness: merged)
  std::vector<std::string> per_server, taken;
  for (const RankReport& r : reports) {
    if (!r.is_server) continue;
    const PsServerStats& s = r.server;
    all.updates += s.updates;
    all.gradients += s.gradients;
    all.dropped_stale += s.dropped_stale;
    all.rejected_stale += s.rejected_stale;
    all.max_staleness = std::max(all.max_staleness, s.max_staleness);
    all.bytes_received += s.bytes_received;
    all.bytes_sent += s.bytes_sent;
    for (int b = 0; b < kStalenessBins; ++b) all.staleness[b] += s.staleness[b];
    const ShardRange& range = plan.layout.shards[static_cast<size_t>(r.index)];
    per_server.push_back(fmt::format("server {}: {} params, {} updates, in {}, out {}", r.index,
                                     range.size(), s.updates, megabytes(s.bytes_received),
                                     megabytes(s.bytes_sent)));
  }
  int64_t rounds = 0, accepted = 0, dropped = 0, retries = 0;
  double compute_ms = 0.0, wait_ms = 0.0;
  for (const RankReport& r : reports) {
    if (r.is_server) continue;
    rounds += r.rounds;
    accepted += r.accepted;
    dropped += r.dropped;
    retries += r.retries;
    compute_ms += r.compute_ms;
    wait_ms += r.wait_ms;
    taken.push_back(std::to_string(r.accepted));
  }
  const int64_t trained = std::max<int64_t>(0, setup.plan.total_steps - setup.plan.start_step);
  const double images_per_sec =
      result.train_seconds > 0
          ? static_cast<double>(trained * setup.plan.global_batch) / result.train_seconds
          : 0.0;
  const double step_ms =
      trained > 0 ? result.train_seconds * 1000.0 / static_cast<double>(trained) : 0.0;
  const double mean_compute = rounds ? compute_ms / static_cast<double>(rounds) : 0.0;
  const double mean_wait = rounds ? wait_ms / static_cast<double>(rounds) : 0.0;
  const std::string mode =
      plan.mode == PsMode::kSync
          ? fmt::format("sync, {} of {} gradients per update", plan.aggregate, workers)
          : fmt::format("async, staleness at most {}", plan.max_staleness);
  log_summary(result.eval, "", result.last_loss,
              RunTotals{.trained_steps = trained,
                        .start_step = setup.plan.start_step,
                        .train_seconds = result.train_seconds,
                        .global_batch = setup.plan.global_batch},
              "");
  spdlog::info(
      "summary: strategy ps ({} server(s), {} worker(s), {}); per worker round {:.3f} ms "
      "computing, {:.3f} ms waiting for the servers",
      servers, workers, mode, mean_compute, mean_wait);
  spdlog::info("summary: steps whose gradients every server took, per worker: {}",
               fmt::join(taken, ", "));
  if (plan.mode == PsMode::kSync) {
    spdlog::info("summary: gradients dropped as stale: {} at the servers ({} worker steps)",
                 all.dropped_stale, dropped);
  } else {
    spdlog::info(
        "summary: staleness of the applied gradients (updates behind): {}; {} refused as "
        "over {} and recomputed ({} worker recomputations)",
        describe_staleness(all), all.rejected_stale, plan.max_staleness, retries);
  }
  spdlog::info("summary: server traffic: {} in, {} out ({} per step); {}",
               megabytes(all.bytes_received), megabytes(all.bytes_sent),
               megabytes(trained > 0 ? (all.bytes_received + all.bytes_sent) / trained : 0),
               fmt::join(per_server, "; "));
  if (!o.metrics_out.empty()) {
    MetricsWriter metrics(o.metrics_out, /*append=*/true);
    std::string histogram;
    for (int b = 0; b < kStalenessBins; ++b)
      if (all.staleness[b] > 0)
        histogram += fmt::format("{}{}:{}", histogram.empty() ? "" : ",", b, all.staleness[b]);
    metrics.write("summary", {{"test_accuracy", result.eval.accuracy()},
                              {"test_loss", result.eval.mean_loss()},
                              {"last_loss", result.last_loss},
                              {"images_per_sec", images_per_sec},
                              {"step_ms", step_ms},
                              {"steps", setup.plan.total_steps},
                              {"start_step", setup.plan.start_step},
                              {"train_seconds", result.train_seconds},
                              {"model", o.model},
                              {"batch_size", o.batch_size},
                              {"global_batch", setup.plan.global_batch},
                              {"strategy", std::string("ps")},
                              {"ps_mode", std::string(to_string(plan.mode))},
                              {"num_ps", int64_t{servers}},
                              {"workers", int64_t{workers}},
                              {"ranks", int64_t{servers + workers}},
                              {"replicas_to_aggregate", int64_t{plan.aggregate}},
                              {"max_staleness", plan.max_staleness},
                              {"server_updates", all.updates},
                              {"gradients", all.gradients},
                              {"dropped_stale", all.dropped_stale},
                              {"rejected_stale", all.rejected_stale},
                              {"staleness_max", all.max_staleness},
                              {"staleness_histogram", histogram},
                              {"worker_steps_taken", fmt::format("{}", fmt::join(taken, ","))},
                              {"worker_retries", retries},
                              {"compute_ms", mean_compute},
                              {"wait_ms", mean_wait},
                              // The ring's names for the same: a push waits after backward,
                              // so all of the exchange is exposed.
                              {"comm_ms", mean_wait},
                              {"exposed_comm_ms", mean_wait},
                              {"world_size", int64_t{servers + workers}},
                              {"server_bytes_received", all.bytes_received},
                              {"server_bytes_sent", all.bytes_sent},
                              {"params", setup.model.num_params()},
                              {"peak_rss_mb", peak_rss_mb()},
                              {"data_dir", setup.data_dir}});
  }
}

}  // namespace

int run_parameter_servers(const Options& o, MpiComm& world, MpiComm& job,
                          const StrategySetup& setup) {
  const int servers = o.num_ps, workers = job.size() - servers;
  const bool is_server = job.rank() >= workers;
  Model& model = setup.model;
  PsPlan plan;
  plan.mode = o.ps_mode;
  plan.aggregate = o.replicas_to_aggregate > 0 ? o.replicas_to_aggregate : workers;
  plan.max_staleness = o.max_staleness >= 0 ? o.max_staleness : 2 * int64_t{workers};
  plan.versions_per_step = plan.mode == PsMode::kSync ? 1 : workers;
  // A one-parameter optimizer of the same settings: its name and its number of state buffers.
  const std::unique_ptr<Optimizer> probe = make_optimizer(o.optimizer, 1);
  plan.optimizer_name = probe->name();
  plan.layout = PsLayout{.workers = workers,
                         .servers = servers,
                         .shards = {},
                         .optimizer_buffers = static_cast<int>(probe->state().size())};
  RINGTRAIN_CHECK(!o.reproducible || plan.aggregate == workers,
                  "--reproducible aggregates every worker's gradients (check_flag_combinations)");
  try {
    plan.layout.shards = plan_shards(tensor_sizes(model), servers);
    if (o.reproducible)
      plan.layout.exact_pieces =
          split_segments(plan.layout.shards, segments_in_buffer_order(model.grad_ranges()));
  } catch (const Error& error) {  // every rank has the same model and flags: tell it once
    throw Error(error.what(), ExitCode::kUsage, /*on_every_rank=*/true);
  }
  if (setup.resumed) {
    // Every rank decoded the same verified bytes.
    check_checkpoint_fits(*setup.resumed, o, model, *probe, probe->state().size());
    model.params_from_host(setup.resumed->params);
  } else {
    if (job.rank() == 0) model.init_params(o.seed);  // the chief initialises
    broadcast_params(job, model, 0);
  }
  // The workers' own communicator: the final replica check and the evaluation. Its split and
  // the channel's duplicate are watched like any collective (mpi_comm.h).
  world.board().set_phase("parameter-server set-up");
  MpiComm workers_comm(job, is_server ? 1 : 0, job.rank());
  PsChannel channel(job, o.collective_timeout + 30.0);
  if (job.rank() == 0) {
    std::vector<std::string> shards;
    for (int s = 0; s < servers; ++s) {
      const ShardRange& r = plan.layout.shards[static_cast<size_t>(s)];
      shards.push_back(fmt::format(
          "server {} (rank {}): [{}, {}) {:.1f}%", s, s, r.begin, r.end,
          100.0 * static_cast<double>(r.size()) / static_cast<double>(model.num_params())));
    }
    spdlog::info(
        "strategy ps: {} server(s), {} worker(s) (ranks {}-{}; the chief is rank {}), "
        "{}; {} steps{} x global batch {} ({} per worker)",
        servers, workers, servers, servers + workers - 1, servers,
        plan.mode == PsMode::kSync
            ? fmt::format("sync, {} of {} gradients per update", plan.aggregate, workers)
            : fmt::format("async, staleness at most {}", plan.max_staleness),
        setup.plan.total_steps,
        setup.plan.start_step > 0 ? fmt::format(" from step {}", setup.plan.start_step) : "",
        setup.plan.global_batch, o.batch_size);
    spdlog::info("parameters: {} in {} tensors, sharded {}", model.num_params(),
                 model.param_views().size(), fmt::join(shards, "; "));
  }

  RankReport report;
  WorkerResult result;
  if (is_server) {
    serve(o, setup, plan, channel, job, report);
  } else {
    report.index = job.rank();
    result = run_worker(o, setup, plan, channel, world, job, workers_comm, report);
  }
  const std::vector<RankReport> reports = allgather_value(job, report);
  if (job.rank() == 0) {
    report_job(o, setup, plan, reports, result);
    save_final_params(o, model, world.board());
    export_final_model(o, model, /*ema=*/nullptr, setup.data.test, setup.ctx);
  }
  return 0;
}

}  // namespace ringtrain::app
