// The run plan (see run_plan.h).
#include "run_plan.h"

#include <fmt/format.h>

#include "resume.h"
#include "ringtrain/check.h"

namespace ringtrain::app {

namespace {

int64_t mb_to_elements(double mb) {
  return static_cast<int64_t>(mb * 1e6 / 4.0);
}

// " x --accumulate-steps K" when there are several passes, for the messages.
std::string passes_factor(const Options& o) {
  return o.accumulate_steps > 1 ? fmt::format(" x --accumulate-steps {}", o.accumulate_steps)
                                : std::string();
}

// The checkpoint's global batch and data order are kept; the per-rank batch follows the ranks
// (and the passes: an optimizer step's samples are the same whatever --accumulate-steps is).
int64_t resumed_batch_size(const Options& o, const ResumePoint& resumed, int data_ranks) {
  const int64_t global = resumed.global_batch;
  const int64_t shares = data_ranks * o.accumulate_steps;
  if (o.batch_size_given && o.batch_size * shares != global)
    refuse(
        fmt::format("the checkpoint at step {} trained with a global batch of {} ({} "
                    "rank(s)); {} ranks{} x --batch-size {} = {} would change the training: "
                    "pass --batch-size {} or leave it out",
                    resumed.step, global, resumed.ranks, data_ranks, passes_factor(o), o.batch_size,
                    o.batch_size * shares, global % shares == 0 ? global / shares : 0));
  if (global % shares != 0)
    refuse(fmt::format(
        "the checkpoint at step {} trained with a global batch of {}, which {} "
        "ranks{} cannot share evenly: resume on a rank count (x passes) that divides {}",
        resumed.step, global, data_ranks, passes_factor(o), global));
  return global / shares;
}

// A micro-shard's gradient depends on its row count, so only a resume with the checkpoint's
// --micro-batch continues the uninterrupted run's bits: another one is refused. A checkpoint
// of the default mode (or of a build that did not record m) resumes under --reproducible, and
// one of --reproducible resumes in the default mode; the log says what that run's bits are.
void check_resumed_micro_batch(const Options& o, const ResumePoint& resumed) {
  if (o.reproducible && resumed.micro_batch > 0 && resumed.micro_batch != o.micro_batch)
    refuse(
        fmt::format("the checkpoint at step {} trained under --reproducible with "
                    "--micro-batch {}; --micro-batch {} would change the bits of every later "
                    "step: pass --micro-batch {}",
                    resumed.step, resumed.micro_batch, o.micro_batch, resumed.micro_batch));
}

// What a resume across modes means for the bits, or "" when the mode is the checkpoint's.
std::string resumed_mode_note(const Options& o, const ResumePoint& resumed) {
  if (o.reproducible && resumed.micro_batch == 0)
    return fmt::format(
        "the checkpoint at step {} was written without --reproducible: the steps "
        "from here on do not depend on the rank count, the {} before did",
        resumed.step, resumed.step);
  if (!o.reproducible && resumed.micro_batch > 0)
    return fmt::format(
        "the checkpoint at step {} was written under --reproducible "
        "--micro-batch {}; without it, this run's bits depend on the rank count",
        resumed.step, resumed.micro_batch);
  return {};
}

// --global-batch-size: each data rank's share of each pass, refused (exit 2) when the ranks
// and passes cannot share it evenly or --batch-size says otherwise.
int64_t shared_batch_size(const Options& o, int data_ranks) {
  const int64_t global = o.global_batch_size;
  const int64_t shares = data_ranks * o.accumulate_steps;
  if (o.batch_size_given && o.batch_size * shares != global)
    refuse_usage(
        fmt::format("--batch-size {} x {} rank(s){} is not --global-batch-size {}: pass "
                    "one of the two",
                    o.batch_size, data_ranks, passes_factor(o), global));
  if (global % shares != 0)
    refuse_usage(fmt::format(
        "--global-batch-size {} cannot be shared evenly by {} rank(s){}: use "
        "a rank count{} that divides it",
        global, data_ranks, passes_factor(o), o.accumulate_steps > 1 ? " (x passes)" : ""));
  return global / shares;
}

// The rank counts that can share `micro_shards` whole micro-shards, for a refusal.
std::string divisors(int64_t micro_shards) {
  std::string list;
  for (int64_t n = 1; n <= micro_shards; ++n)
    if (micro_shards % n == 0) list += fmt::format("{}{}", list.empty() ? "" : ", ", n);
  return list;
}

}  // namespace

RunPlan plan_run(const Options& options, const JobShape& job,
                 const std::optional<ResumePoint>& resumed) {
  Options o = options;  // the batch size a resume sets is checked as if it had been given
  RunPlan plan;
  if (o.reproducible) {
    RINGTRAIN_CHECK(
        o.global_batch_size > 0 && o.micro_batch > 0 && o.global_batch_size % o.micro_batch == 0,
        "--reproducible with --global-batch-size {} and --micro-batch {}: "
        "check_flag_combinations refuses these",
        o.global_batch_size, o.micro_batch);
    plan.micro_shards = o.global_batch_size / o.micro_batch;
    // Each pass of each rank computes whole micro-shards.
    const int64_t shares = job.data_ranks * o.accumulate_steps;
    if (plan.micro_shards % shares != 0) {
      const int64_t per_pass = plan.micro_shards / o.accumulate_steps;
      refuse_usage(fmt::format(
          "--reproducible: the global batch of {} is {} micro-shards of --micro-batch {}, "
          "which {} rank(s){} cannot share; {} or change --micro-batch",
          o.global_batch_size, plan.micro_shards, o.micro_batch, job.data_ranks, passes_factor(o),
          plan.micro_shards % o.accumulate_steps == 0
              ? fmt::format("run on {} rank(s)", divisors(per_pass))
              : fmt::format("use an --accumulate-steps that divides {}", plan.micro_shards)));
    }
    plan.local_micro_shards = plan.micro_shards / job.data_ranks;
  }
  if (o.global_batch_size > 0) {
    if (resumed && resumed->global_batch != o.global_batch_size)
      refuse(
          fmt::format("the checkpoint at step {} trained with a global batch of {}; "
                      "--global-batch-size {} would change the training: pass {}{}",
                      resumed->step, resumed->global_batch, o.global_batch_size,
                      resumed->global_batch, o.reproducible ? "" : " or leave it out"));
    o.batch_size = shared_batch_size(o, job.data_ranks);
    o.batch_size_given = true;
  }
  if (resumed) {
    check_resumed_micro_batch(o, *resumed);
    o.batch_size = resumed_batch_size(o, *resumed, job.data_ranks);
    plan.start_step = resumed->step;
    if (resumed->ranks != job.data_ranks)
      plan.resume_note = fmt::format(
          "resuming a {}-rank checkpoint on {} ranks: --batch-size {} per rank keeps the "
          "global batch of {} and the data order {}",
          resumed->ranks, job.data_ranks, o.batch_size, resumed->global_batch,
          o.reproducible && resumed->micro_batch == o.micro_batch
              ? "(--reproducible: and the bits of an uninterrupted run)"
              : fmt::format("(the sums run in another order, so the bits differ "
                            "from a {}-rank run)",
                            resumed->ranks));
    const std::string mode_note = resumed_mode_note(o, *resumed);
    if (!mode_note.empty()) plan.resume_note += (plan.resume_note.empty() ? "" : "; ") + mode_note;
  }
  // --batch-size, --epochs and --warmup-epochs against this job (exit 2): nothing below
  // overflows, and an epoch has at least one step.
  check_derived_ranges(o, job.data_ranks, job.train_images);
  plan.batch_size = o.batch_size;
  plan.accumulate_steps = o.accumulate_steps;
  plan.global_batch = o.batch_size * job.data_ranks * o.accumulate_steps;
  plan.steps_per_epoch = job.train_images / plan.global_batch;
  plan.total_steps = o.steps > 0 ? o.steps : o.epochs * plan.steps_per_epoch;

  LrSchedule& schedule = plan.schedule;
  schedule = o.schedule;
  if (o.lr_scaling == LrScaling::kLinear) {
    RINGTRAIN_CHECK(schedule.kind == "constant" || schedule.kind == "linear-warmup",
                    "--lr-scaling linear ramps the rate itself; it cannot be combined with "
                    "--lr-schedule {}",
                    schedule.kind);
    schedule.kind = "linear-warmup";
    schedule.reference_batch = o.batch_size;  // the target is --lr x ranks x passes
  }
  schedule.global_batch = plan.global_batch;
  if (schedule.reference_batch == 0) schedule.reference_batch = plan.global_batch;
  if (o.warmup_epochs > 0) {
    schedule.warmup_steps =
        static_cast<int64_t>(o.warmup_epochs * static_cast<double>(plan.steps_per_epoch));
  }
  validate(schedule);

  // local-sgd averages parameters, not gradients; a device job averages on the GPU whenever
  // there is more than one rank; a host one also with a slowed transport (the overlap tests).
  const bool on_gpu = job.device == Device::kCuda;
  plan.average_gradients = o.strategy == Strategy::kRing && (job.ranks > 1 || o.reproducible ||
                                                             (!on_gpu && o.test_comm_delay_ms > 0));
  // Overlap needs a core to run on: on one node whose cores the ranks' compute threads already
  // fill, the communication thread's copies only take cycles from backward (measured slower
  // there: docs/benchmarks.md), while across nodes the wire, not the CPU, is the bottleneck.
  // On a GPU the averaging runs on the communication stream, not on a CPU thread: overlap
  // costs backward nothing, so auto means on.
  const bool node_is_full = job.local_size * o.threads >= job.cores;
  const bool one_node = job.local_size == job.ranks;
  bool overlap = o.overlap == OverlapChoice::kOn;
  if (o.overlap == OverlapChoice::kAuto) {
    overlap = on_gpu || !(node_is_full && one_node);
    plan.overlap_reason =
        on_gpu ? "--overlap auto: on a GPU the communication stream runs beside the compute stream"
               : fmt::format("--overlap auto: {} rank(s) x {} thread(s) on a node of {} cores{}",
                             job.local_size, o.threads, job.cores,
                             one_node ? "" : ", ranks on several nodes");
  } else {
    plan.overlap_reason = "set by flag";
  }
  plan.grad_sync = GradSyncConfig{.first_bucket_elements = mb_to_elements(o.first_bucket_mb),
                                  .bucket_elements = mb_to_elements(o.fusion_threshold_mb),
                                  .overlap = overlap};
  return plan;
}

}  // namespace ringtrain::app
