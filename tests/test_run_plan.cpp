// mnist_train's run plan (apps/mnist_train/run_plan.h): what a run derives from its flags and
// its job, rule by rule, without starting ranks.
#include <optional>

#include <catch2/catch.hpp>

#include "options.h"
#include "ringtrain/check.h"
#include "run_plan.h"

using namespace ringtrain;
using namespace ringtrain::app;

namespace {

JobShape one_node(int ranks, int cores = 64) {
  return JobShape{.ranks = ranks,
                  .data_ranks = ranks,
                  .local_size = ranks,
                  .cores = cores,
                  .device = Device::kCpu,
                  .train_images = 60000};
}

ExitCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.code();
  }
  FAIL("no error was thrown");
  return ExitCode::kOk;
}

}  // namespace

TEST_CASE("plan: the global batch is ranks x --batch-size; an epoch drops its last partial batch",
          "[run_plan]") {
  Options o;
  o.batch_size = 48;
  o.epochs = 2;
  const RunPlan plan = plan_run(o, one_node(3), std::nullopt);
  CHECK(plan.batch_size == 48);
  CHECK(plan.global_batch == 144);
  CHECK(plan.steps_per_epoch == 60000 / 144);
  CHECK(plan.total_steps == 2 * (60000 / 144));
  CHECK(plan.start_step == 0);
  CHECK(plan.resume_note.empty());
  o.steps = 7;  // --steps wins over --epochs
  CHECK(plan_run(o, one_node(3), std::nullopt).total_steps == 7);
}

TEST_CASE("plan: a resume keeps the checkpoint's global batch on another rank count",
          "[run_plan]") {
  Options o;
  const ResumePoint written_by_two{.step = 40, .global_batch = 96, .ranks = 2};
  const RunPlan on_four = plan_run(o, one_node(4), written_by_two);
  CHECK(on_four.batch_size == 24);
  CHECK(on_four.global_batch == 96);
  CHECK(on_four.start_step == 40);
  CHECK_THAT(on_four.resume_note, Catch::Contains("2-rank checkpoint on 4 ranks"));
  CHECK(plan_run(o, one_node(2), written_by_two).resume_note.empty());
  // A global batch that the ranks cannot share, or a --batch-size that changes it: refused on
  // every rank as bad input.
  CHECK(code_of([&] { plan_run(o, one_node(5), written_by_two); }) == ExitCode::kBadInput);
  o.batch_size = 32;
  o.batch_size_given = true;
  CHECK(code_of([&] { plan_run(o, one_node(2), written_by_two); }) == ExitCode::kBadInput);
  o.batch_size = 48;  // the same global batch, said explicitly
  CHECK(plan_run(o, one_node(2), written_by_two).batch_size == 48);
}

TEST_CASE("plan: ranges that only this job shows are usage errors", "[run_plan]") {
  Options o;
  o.batch_size = 40000;  // x 2 ranks > 60000 images
  CHECK(code_of([&] { plan_run(o, one_node(2), std::nullopt); }) == ExitCode::kUsage);
  o.batch_size = 30000;
  CHECK(plan_run(o, one_node(2), std::nullopt).steps_per_epoch == 1);
}

TEST_CASE("plan: the learning-rate schedule", "[run_plan]") {
  Options o;
  o.batch_size = 32;
  o.schedule.base_lr = 0.1f;
  SECTION("by default the reference batch is the global batch: no scaling") {
    const RunPlan plan = plan_run(o, one_node(4), std::nullopt);
    CHECK(plan.schedule.global_batch == 128);
    CHECK(plan.schedule.reference_batch == 128);
    CHECK(plan.schedule.kind == "constant");
  }
  SECTION("--lr-scaling linear ramps to --lr x ranks over --warmup-epochs") {
    o.lr_scaling = LrScaling::kLinear;
    o.warmup_epochs = 0.5;
    const RunPlan plan = plan_run(o, one_node(4), std::nullopt);
    CHECK(plan.schedule.kind == "linear-warmup");
    CHECK(plan.schedule.reference_batch == 32);
    CHECK(plan.schedule.warmup_steps == plan.steps_per_epoch / 2);
    CHECK(learning_rate(plan.schedule, plan.schedule.warmup_steps) == Approx(0.4f));
  }
  SECTION("--lr-scaling linear cannot be combined with a decaying schedule") {
    o.lr_scaling = LrScaling::kLinear;
    o.schedule.kind = "exponential";
    o.schedule.decay_steps = 10;
    CHECK_THROWS_WITH(plan_run(o, one_node(2), std::nullopt),
                      Catch::Contains("--lr-scaling linear"));
  }
}

TEST_CASE("plan: whether gradients are averaged, in what buckets, and whether they overlap",
          "[run_plan]") {
  Options o;
  o.first_bucket_mb = 0.25;
  o.fusion_threshold_mb = 4.0;
  SECTION("one rank averages nothing; several do, in buckets of the given sizes") {
    CHECK_FALSE(plan_run(o, one_node(1), std::nullopt).average_gradients);
    const RunPlan plan = plan_run(o, one_node(2), std::nullopt);
    CHECK(plan.average_gradients);
    CHECK(plan.grad_sync.first_bucket_elements == 62500);
    CHECK(plan.grad_sync.bucket_elements == 1000000);
  }
  SECTION("local SGD averages parameters, not gradients") {
    o.strategy = Strategy::kLocalSgd;
    CHECK_FALSE(plan_run(o, one_node(4), std::nullopt).average_gradients);
  }
  SECTION("a slowed host transport averages even on one rank (the overlap tests)") {
    o.test_comm_delay_ms = 5;
    CHECK(plan_run(o, one_node(1), std::nullopt).average_gradients);
  }
  SECTION("--overlap auto: off where the ranks' threads fill one node's cores, else on") {
    o.threads = 1;
    CHECK_FALSE(plan_run(o, one_node(2, /*cores=*/2), std::nullopt).grad_sync.overlap);
    CHECK(plan_run(o, one_node(2, /*cores=*/8), std::nullopt).grad_sync.overlap);
    JobShape two_nodes = one_node(4, /*cores=*/2);
    two_nodes.local_size = 2;
    CHECK(plan_run(o, two_nodes, std::nullopt).grad_sync.overlap);
    JobShape gpu = one_node(2, /*cores=*/2);
    gpu.device = Device::kCuda;
    const RunPlan on_gpu = plan_run(o, gpu, std::nullopt);
    CHECK(on_gpu.grad_sync.overlap);
    CHECK_THAT(on_gpu.overlap_reason, Catch::Contains("communication stream"));
  }
  SECTION("--overlap on and off are obeyed") {
    o.overlap = OverlapChoice::kOn;
    CHECK(plan_run(o, one_node(2, 2), std::nullopt).grad_sync.overlap);
    o.overlap = OverlapChoice::kOff;
    CHECK_FALSE(plan_run(o, one_node(2, 64), std::nullopt).grad_sync.overlap);
    CHECK(plan_run(o, one_node(2, 64), std::nullopt).overlap_reason == "set by flag");
  }
}

TEST_CASE("flag rules: strategy flags, test ranks and device needs", "[run_plan]") {
  Options o;
  o.flags_given = {"--average-every"};
  CHECK(code_of([&] { check_flag_combinations(o, 2); }) == ExitCode::kUsage);
  o.strategy = Strategy::kLocalSgd;
  check_flag_combinations(o, 2);
  CHECK(o.device == "cpu");  // local SGD runs on host buffers
  Options ps;
  ps.strategy = Strategy::kParameterServers;
  ps.num_ps = 2;
  CHECK(code_of([&] { check_flag_combinations(ps, 2); }) == ExitCode::kUsage);  // no worker
  ps.flags_given = {"--allreduce"};  // the servers average nothing: refused, not ignored
  CHECK(code_of([&] { check_flag_combinations(ps, 4); }) == ExitCode::kUsage);
  Options local = o;
  local.flags_given = {"--allreduce", "--average-every"};
  check_flag_combinations(local, 2);  // local SGD's parameter averages obey it
  Options test_rank;
  test_rank.test_fail_rank = 3;
  CHECK(code_of([&] { check_flag_combinations(test_rank, 3); }) == ExitCode::kUsage);
  Options graphs;
  graphs.cuda_graphs = true;
  const DeviceChoice cpu{.device = Device::kCpu, .gpu = -1, .why = "no GPU"};
  CHECK(code_of([&] { check_device_flags(graphs, 1, cpu); }) == ExitCode::kUsage);
  const DeviceChoice gpu{.device = Device::kCuda, .gpu = 0, .why = "asked"};
  CHECK(code_of([&] { check_device_flags(graphs, 2, gpu); }) == ExitCode::kUsage);
  check_device_flags(graphs, 1, gpu);
}

TEST_CASE("plan: --global-batch-size is shared by the ranks, and must be shareable", "[run_plan]") {
  Options o;
  o.global_batch_size = 96;
  for (const int ranks : {1, 2, 3, 4, 6}) {
    const RunPlan plan = plan_run(o, one_node(ranks), std::nullopt);
    CHECK(plan.batch_size == 96 / ranks);
    CHECK(plan.global_batch == 96);
    CHECK(plan.steps_per_epoch == 60000 / 96);  // the same epochs on any rank count
  }
  CHECK(code_of([&] { plan_run(o, one_node(5), std::nullopt); }) == ExitCode::kUsage);
  o.batch_size = 32;
  o.batch_size_given = true;  // 3 x 32 agrees; 2 x 32 does not
  CHECK(plan_run(o, one_node(3), std::nullopt).batch_size == 32);
  CHECK(code_of([&] { plan_run(o, one_node(2), std::nullopt); }) == ExitCode::kUsage);
}

TEST_CASE("plan: --reproducible shares whole micro-shards and always sums them exactly",
          "[run_plan]") {
  Options o;
  o.global_batch_size = 96;
  o.reproducible = true;
  o.micro_batch = 8;
  const RunPlan one = plan_run(o, one_node(1), std::nullopt);
  CHECK(one.micro_shards == 12);
  CHECK(one.local_micro_shards == 12);
  CHECK(one.average_gradients);  // one rank too: its micro-shards are summed exactly
  const RunPlan four = plan_run(o, one_node(4), std::nullopt);
  CHECK(four.local_micro_shards == 3);
  CHECK(four.batch_size == 24);
  CHECK(four.schedule.global_batch == one.schedule.global_batch);
  CHECK(four.steps_per_epoch == one.steps_per_epoch);
  o.global_batch_size = 64;  // 8 micro-shards: 3 ranks divide 64 / 8 no more than 64
  try {
    plan_run(o, one_node(3), std::nullopt);
    FAIL("3 ranks were given 8 micro-shards");
  } catch (const Error& error) {
    CHECK(error.code() == ExitCode::kUsage);
    CHECK_THAT(error.what(), Catch::Contains("run on 1, 2, 4, 8 rank(s)"));
  }
  // A resume on another rank count keeps the checkpoint's global batch; another one is refused.
  o.global_batch_size = 96;
  const ResumePoint at_20{.step = 20, .global_batch = 96, .ranks = 4, .micro_batch = 8};
  const RunPlan resumed = plan_run(o, one_node(3), at_20);
  CHECK(resumed.start_step == 20);
  CHECK(resumed.local_micro_shards == 4);
  CHECK_THAT(resumed.resume_note, Catch::Contains("the bits of an uninterrupted run"));
  const ResumePoint other{.step = 20, .global_batch = 128, .ranks = 4};
  CHECK(code_of([&] { plan_run(o, one_node(4), other); }) != ExitCode::kOk);
  // The checkpoint's --micro-batch must be kept: another one would change every later step.
  const ResumePoint& at_20_m8 = at_20;
  Options m16 = o;
  m16.micro_batch = 16;
  try {
    plan_run(m16, one_node(3), at_20_m8);
    FAIL("a resume changed --micro-batch 8 to 16");
  } catch (const Error& error) {
    CHECK(error.code() == ExitCode::kBadInput);
    CHECK_THAT(error.what(), Catch::Contains("pass --micro-batch 8"));
  }
  // Across modes the resume goes on, and says what the bits are.
  const ResumePoint default_mode{.step = 20, .global_batch = 96, .ranks = 2};
  const RunPlan from_default = plan_run(o, one_node(4), default_mode);
  CHECK_THAT(from_default.resume_note, Catch::Contains("written without --reproducible"));
  CHECK_THAT(from_default.resume_note, !Catch::Contains("the bits of an uninterrupted run"));
  Options plain;
  CHECK_THAT(plan_run(plain, one_node(4), at_20_m8).resume_note,
             Catch::Contains("written under --reproducible --micro-batch 8"));
  CHECK(plan_run(o, one_node(4), at_20_m8).resume_note.empty());
}

TEST_CASE("flag rules: what --reproducible refuses, and --device auto means cpu", "[run_plan]") {
  Options base;
  base.reproducible = true;
  base.global_batch_size = 96;
  Options ok = base;
  check_flag_combinations(ok, 4);
  CHECK(ok.device == "cpu");  // decided from the flags: every rank trains on the CPU alike
  const auto refused = [&](const std::function<void(Options&)>& change) {
    Options o = base;
    change(o);
    return code_of([&] { check_flag_combinations(o, 4); }) == ExitCode::kUsage;
  };
  CHECK(refused([](Options& o) { o.global_batch_size = 0; }));
  CHECK(refused([](Options& o) { o.micro_batch = 7; }));  // 96 is not whole micro-shards of 7
  CHECK(refused([](Options& o) { o.device = "cuda"; }));
  CHECK(refused([](Options& o) { o.threads = 2; }));
  CHECK(refused([](Options& o) { o.allreduce = AllreduceAlgorithm::kLibrary; }));
  CHECK(refused([](Options& o) { o.lr_scaling = LrScaling::kLinear; }));
  CHECK(refused([](Options& o) { o.strategy = Strategy::kLocalSgd; }));
  // Parameter servers: in sync mode with every worker's gradients only.
  Options ps = base;
  ps.strategy = Strategy::kParameterServers;
  ps.num_ps = 1;
  check_flag_combinations(ps, 4);
  CHECK(refused([](Options& o) {
    o.strategy = Strategy::kParameterServers;
    o.num_ps = 1;
    o.ps_mode = PsMode::kAsync;
  }));
  CHECK(refused([](Options& o) {
    o.strategy = Strategy::kParameterServers;
    o.num_ps = 1;
    o.replicas_to_aggregate = 2;  // of 3 workers
  }));
  Options plain;  // --micro-batch belongs to --reproducible
  plain.flags_given = {"--micro-batch"};
  CHECK(code_of([&] { check_flag_combinations(plain, 1); }) == ExitCode::kUsage);
}

TEST_CASE("plan: --accumulate-steps counts optimizer steps of K passes", "[run_plan][accumulate]") {
  Options o;
  o.batch_size = 32;
  o.accumulate_steps = 4;
  o.epochs = 1;
  const RunPlan plan = plan_run(o, one_node(2), std::nullopt);
  CHECK(plan.batch_size == 32);  // per rank and pass
  CHECK(plan.accumulate_steps == 4);
  CHECK(plan.global_batch == 2 * 32 * 4);
  CHECK(plan.steps_per_epoch == 60000 / 256);  // optimizer steps
  CHECK(plan.total_steps == plan.steps_per_epoch);
  CHECK(plan.schedule.global_batch == 256);
  o.lr_scaling = LrScaling::kLinear;  // scaled by the whole step's batch: ranks x passes
  const RunPlan scaled = plan_run(o, one_node(2), std::nullopt);
  CHECK(scaled.schedule.reference_batch == 32);
  // --global-batch-size is an optimizer step's: each rank's pass takes G / (ranks x passes).
  Options g;
  g.global_batch_size = 96;
  g.accumulate_steps = 2;
  CHECK(plan_run(g, one_node(3), std::nullopt).batch_size == 16);
  CHECK(code_of([&] { plan_run(g, one_node(5), std::nullopt); }) == ExitCode::kUsage);
  g.accumulate_steps = 5;  // 96 is not shared by 1 rank x 5 passes
  CHECK(code_of([&] { plan_run(g, one_node(1), std::nullopt); }) == ExitCode::kUsage);
  // A resume keeps the checkpoint's global batch whatever the passes: same samples per step.
  Options r;
  r.accumulate_steps = 3;
  const RunPlan resumed =
      plan_run(r, one_node(2), ResumePoint{.step = 10, .global_batch = 96, .ranks = 4});
  CHECK(resumed.batch_size == 16);
  CHECK(resumed.global_batch == 96);
  CHECK(code_of([&] {
          plan_run(r, one_node(5), ResumePoint{.step = 10, .global_batch = 96, .ranks = 4});
        }) != ExitCode::kOk);  // 5 ranks x 3 passes cannot share 96
  // Too large a step for the data.
  Options big;
  big.batch_size = 10000;
  big.accumulate_steps = 4;
  CHECK(code_of([&] { plan_run(big, one_node(2), std::nullopt); }) == ExitCode::kUsage);
}

TEST_CASE("plan: --reproducible with --accumulate-steps shares whole micro-shards per pass",
          "[run_plan][accumulate]") {
  Options o;
  o.reproducible = true;
  o.global_batch_size = 96;
  o.micro_batch = 8;
  o.accumulate_steps = 2;
  const RunPlan plan = plan_run(o, one_node(3), std::nullopt);
  CHECK(plan.micro_shards == 12);
  CHECK(plan.local_micro_shards == 4);  // two passes of two
  CHECK(plan.batch_size == 16);
  try {
    plan_run(o, one_node(4), std::nullopt);  // 12 micro-shards: 4 ranks x 2 passes cannot
    FAIL("4 ranks x 2 passes were given 12 micro-shards");
  } catch (const Error& error) {
    CHECK(error.code() == ExitCode::kUsage);
    CHECK_THAT(error.what(), Catch::Contains("run on 1, 2, 3, 6 rank(s)"));
  }
}

TEST_CASE("flag rules: --accumulate-steps runs on the CPU and not under --strategy ps",
          "[run_plan][accumulate]") {
  Options ps;
  ps.strategy = Strategy::kParameterServers;
  ps.accumulate_steps = 2;
  CHECK(code_of([&] { check_flag_combinations(ps, 3); }) == ExitCode::kUsage);
  Options local;
  local.strategy = Strategy::kLocalSgd;
  local.accumulate_steps = 2;
  check_flag_combinations(local, 2);
  Options ring;
  ring.accumulate_steps = 2;
  const DeviceChoice gpu{.device = Device::kCuda, .gpu = 0, .why = "asked"};
  CHECK(code_of([&] { check_device_flags(ring, 1, gpu); }) == ExitCode::kUsage);
  const DeviceChoice cpu{.device = Device::kCpu, .gpu = -1, .why = "no GPU"};
  check_device_flags(ring, 2, cpu);
}
