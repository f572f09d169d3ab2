// Every rule of mnist_train that combines flags, or flags with the job (see options.h). The
// single flags' ranges are checked as they are parsed (flags.cpp); check_derived_ranges, which
// needs the data, is there too.
#include <string>
#include <utility>

#include <fmt/format.h>

#include "options.h"
#include "ringtrain/check.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

void refuse_usage(const std::string& message) {
  throw Error(message, ExitCode::kUsage, /*on_every_rank=*/true);
}

namespace {

// --reproducible: what its guarantee needs of the other flags.
void check_reproducible_flags(Options& o) {
  if (!o.reproducible) return;
  if (o.strategy == Strategy::kLocalSgd)
    refuse_usage(
        "--reproducible runs with --strategy ring or ps; local SGD's parameter averages are "
        "not exact yet");
  // Which gradients an update takes must not depend on timing: every worker's, every step.
  if (o.strategy == Strategy::kParameterServers && o.ps_mode != PsMode::kSync)
    refuse_usage(
        "--reproducible with --strategy ps needs --ps-mode sync: an asynchronous "
        "server applies gradients in the order they arrive");
  if (o.global_batch_size == 0)
    refuse_usage(
        "--reproducible needs --global-batch-size: the result is the same for any rank count "
        "only while the global batch is");
  if (o.global_batch_size % o.micro_batch != 0)
    refuse_usage(
        fmt::format("--global-batch-size {} is not a whole number of --micro-batch {} "
                    "micro-shards",
                    o.global_batch_size, o.micro_batch));
  if (o.device == "cuda")
    refuse_usage(
        "--reproducible runs on the CPU for now (the GPU's exact sum is not built); "
        "use --device cpu");
  // Decided here, from the flags alone, so that every rank trains on the CPU alike.
  if (o.device == "auto") spdlog::info("--reproducible runs on the CPU: --device auto means cpu");
  o.device = "cpu";
  if (o.lr_scaling == LrScaling::kLinear)
    refuse_usage(
        "--lr-scaling linear scales by the per-rank batch, which changes with the rank "
        "count: with --reproducible give the --lr of the global batch");
  if (o.allreduce != AllreduceAlgorithm::kRing)
    refuse_usage("--reproducible sums over its own integer ring: leave out --allreduce mpi");
  if (o.threads != 1)
    refuse_usage(
        fmt::format("--reproducible needs --threads 1 (this run: {}): Eigen's threaded "
                    "GEMM is not shown to keep its order of summation",
                    o.threads));
}

// --grad-wire bf16|fp16: what the 16-bit wire runs on (the host ring's gradient averaging).
void check_grad_wire_flags(const Options& o) {
  if (o.grad_wire == GradWire::kFp32) return;
  const char* const wire = to_string(o.grad_wire);
  if (o.strategy != Strategy::kRing)
    refuse_usage(fmt::format(
        "--grad-wire {} chooses what the ring's gradient averaging sends, and --strategy {} "
        "has none ({}): leave out --grad-wire",
        wire, to_string(o.strategy),
        o.strategy == Strategy::kLocalSgd ? "it averages parameters, which stay fp32"
                                          : "the workers push their gradients to the servers"));
  if (o.reproducible)
    refuse_usage(fmt::format(
        "--reproducible sums over its own exact fixed-point ring: leave out --grad-wire {}", wire));
  if (o.allreduce != AllreduceAlgorithm::kRing)
    refuse_usage(
        fmt::format("--grad-wire {} is a wire of our ring, and --allreduce mpi runs the library's "
                    "collective, which moves fp32: use --allreduce ring or leave out --grad-wire",
                    wire));
  if (o.device == "cuda")
    refuse_usage("the device ring moves fp32 only; --grad-wire needs --device cpu");
}

}  // namespace

// The flags of the strategies, checked against each other before anything starts (every rank
// decides the same from the same flags).
void check_flag_combinations(Options& o, int ranks) {
  const bool ps = o.strategy == Strategy::kParameterServers;
  const bool local_sgd = o.strategy == Strategy::kLocalSgd;
  const char* const strategy = to_string(o.strategy);
  for (const std::string& flag : o.flags_given) {
    if (!ps && (flag == "--num-ps" || flag == "--ps-mode" || flag == "--replicas-to-aggregate" ||
                flag == "--max-staleness"))
      refuse_usage(
          fmt::format("{} is a flag of --strategy ps (this run: --strategy {})", flag, strategy));
    if (ps && flag == "--allreduce")
      refuse_usage(
          "--allreduce chooses how the ring and local SGD average; --strategy ps averages "
          "nothing (the workers push their gradients to the servers)");
    if (!local_sgd && flag == "--average-every")
      refuse_usage(
          fmt::format("--average-every is a flag of --strategy local-sgd (this run: --strategy "
                      "{})",
                      strategy));
    if (ps && o.ps_mode != PsMode::kSync && flag == "--replicas-to-aggregate")
      refuse_usage("--replicas-to-aggregate is a flag of --ps-mode sync");
    if (ps && o.ps_mode != PsMode::kAsync && flag == "--max-staleness")
      refuse_usage("--max-staleness is a flag of --ps-mode async");
    if (!o.reproducible && flag == "--micro-batch")
      refuse_usage("--micro-batch is a flag of --reproducible");
  }
  check_reproducible_flags(o);
  if (ps && o.accumulate_steps > 1)
    refuse_usage(
        "--accumulate-steps is a flag of --strategy ring and local-sgd: the parameter-server "
        "workers push each batch's gradients (use a larger --batch-size)");
  check_grad_wire_flags(o);
  for (const auto& [flag, value] : {std::pair{"--test-fail-rank", o.test_fail_rank},
                                    std::pair{"--test-preempt-rank", o.test_preempt_rank},
                                    std::pair{"--test-stall-rank", o.test_stall_rank},
                                    std::pair{"--test-nan-rank", o.test_nan_rank},
                                    std::pair{"--test-perturb-rank", o.test_perturb_rank},
                                    std::pair{"--test-slow-rank", o.test_slow_rank}}) {
    if (value >= ranks)
      refuse_usage(
          fmt::format("{} {} names a rank outside the {} rank(s) of this job: it must be "
                      "in [-1, {}]",
                      flag, value, ranks, ranks - 1));
  }
  if (o.strategy == Strategy::kRing) return;
  if (ps) {
    if (o.num_ps >= ranks)
      refuse_usage(
          fmt::format("--num-ps {} leaves no worker among the {} rank(s) of this job: start "
                      "more ranks (mpirun -np {}) or use fewer servers",
                      o.num_ps, ranks, o.num_ps + 1));
    const int workers = ranks - o.num_ps;
    if (o.replicas_to_aggregate > workers)
      refuse_usage(
          fmt::format("--replicas-to-aggregate {} is more than the {} worker(s) ({} ranks - "
                      "--num-ps {})",
                      o.replicas_to_aggregate, workers, ranks, o.num_ps));
    if (o.reproducible && o.replicas_to_aggregate > 0 && o.replicas_to_aggregate != workers)
      refuse_usage(fmt::format(
          "--reproducible: --replicas-to-aggregate {} would leave out the gradients of the "
          "slowest {} worker(s), whichever they are: leave it out (every worker's, {})",
          o.replicas_to_aggregate, workers - o.replicas_to_aggregate, workers));
    if (o.check_finite) refuse_usage("--check-finite is not supported with --strategy ps yet");
    if (!o.timeline.empty())
      refuse_usage(
          "--timeline records the ring's and local SGD's steps; --strategy ps does not record "
          "one yet: run without --timeline, or with --strategy ring");
    if (o.checkpoint_secs > 0)
      refuse_usage("--checkpoint-secs is not supported with --strategy ps: use --checkpoint-every");
  }
  if (o.ema_decay > 0.0f)
    refuse_usage(
        fmt::format("--ema-decay needs --strategy ring (this run: --strategy {})", strategy));
  // Both strategies move host buffers (the servers' shards, the averaged parameters).
  if (o.device == "cuda")
    refuse_usage(fmt::format("--strategy {} runs on the CPU for now; use --device cpu", strategy));
  if (o.device == "auto")
    spdlog::info("--strategy {} runs on the CPU: --device auto means cpu here", strategy);
  o.device = "cpu";
}

void check_device_flags(const Options& o, int ranks, const DeviceChoice& device) {
  if (o.cuda_graphs) {
    // Said before anything is built: both are decided by flags and the machine alone.
    if (ranks > 1)
      refuse_usage(
          fmt::format("--cuda-graphs captures the one-rank step only ({} ranks here: the "
                      "multi-rank step's gradient averaging is not captured yet); run "
                      "without it",
                      ranks));
    if (device.device != Device::kCuda)
      refuse_usage(fmt::format("--cuda-graphs needs a GPU, and this run trains on the cpu ({})",
                               device.why));
  }
  if (o.conv_impl != ConvImpl::kDirect && device.device != Device::kCuda)
    refuse_usage(fmt::format("--conv-impl {} needs a GPU, and this run trains on the cpu ({})",
                             to_string(o.conv_impl), device.why));
  if (o.data_on_gpu) {
    if (device.device != Device::kCuda)
      refuse_usage(fmt::format("--data-on-gpu needs a GPU, and this run trains on the cpu ({})",
                               device.why));
    if (o.test_nan_rank >= 0)
      refuse_usage("--test-nan-rank writes its NaN into a host batch: run without --data-on-gpu");
  }
  if (device.device == Device::kCuda && o.reproducible)
    refuse_usage(
        fmt::format("--reproducible runs on the CPU for now, and this run would train "
                    "on the GPU ({}): pass --device cpu",
                    device.why));
  if (device.device == Device::kCuda && o.accumulate_steps > 1)
    refuse_usage(
        fmt::format("--accumulate-steps runs on the CPU for now (the device step takes one "
                    "pass), and this run would train on the GPU ({}): pass --device cpu",
                    device.why));
  if (device.device == Device::kCuda && o.grad_wire != GradWire::kFp32)
    refuse_usage(fmt::format(
        "the device ring moves fp32 only; --grad-wire needs --device cpu (this run would "
        "train on the GPU: {})",
        device.why));
  if (device.device == Device::kCuda && o.test_comm_delay_ms > 0)
    refuse_usage("--test-comm-delay-ms is a CPU-path test flag; use --device cpu");
}

}  // namespace ringtrain::app
