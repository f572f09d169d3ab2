// The configuration check's fields (see job_config.h).
#include "job_config.h"

#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "resume.h"
#include "ringtrain/checkpoint.h"

namespace ringtrain::app {

namespace {

std::string describe_optimizer(const OptimizerConfig& c) {
  return fmt::format("{} momentum {} nesterov {} wd {} betas {} {} eps {}", c.kind, c.momentum,
                     c.nesterov, c.weight_decay, c.beta1, c.beta2, c.epsilon);
}

template <typename T>
std::string join(const std::vector<T>& values) {
  return fmt::format("{}", fmt::join(values, ","));
}

}  // namespace

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
      {"--global-batch-size/--reproducible/--micro-batch",
       fmt::format("{} / {} / {}", o.global_batch_size, o.reproducible, o.micro_batch)},
      {"--accumulate-steps", std::to_string(o.accumulate_steps)},
      {"--steps/--epochs", fmt::format("{} / {}", o.steps, o.epochs)},
      {"--seed", std::to_string(o.seed)},
      {"optimizer", describe_optimizer(o.optimizer)},
      {"lr schedule",
       describe_schedule(o.schedule) +
           fmt::format(" warmup-epochs {} scaling {}", o.warmup_epochs, to_string(o.lr_scaling))},
      {"--ema-decay", fmt::format("{}", o.ema_decay)},
      {"training data", data_hash(data.train)},
      {"test data", data_hash(data.test)},
      {"--allreduce", to_string(o.allreduce)},
      {"--grad-wire", to_string(o.grad_wire)},
      // The transport follows the device (MPI for host gradients, NCCL for device ones): all
      // ranks must train on the same kind of device.
      {"device", to_string(device)},
      {"--conv-impl", to_string(o.conv_impl)},
      {"buckets", fmt::format("first {} MB, then {} MB", o.first_bucket_mb, o.fusion_threshold_mb)},
      {"--check-replicas", std::to_string(o.check_replicas)},
      {"--eval-every/--eval-batch", fmt::format("{} / {}", o.eval_every, o.eval_batch)},
      {"--check-finite", fmt::format("{} (max {} bad steps)", o.check_finite, o.max_bad_steps)},
      {"--resume", o.resume},
      // The servers send the chief snapshots only when they know it writes checkpoints.
      {"--checkpoint-dir/--checkpoint-every (ps)",
       o.strategy == Strategy::kParameterServers
           ? fmt::format("{} / {}", !o.checkpoint_dir.empty(), o.checkpoint_every)
           : std::string()},
      {"strategy", fmt::format("{} num-ps {} mode {} aggregate {} staleness {} average-every {}",
                               to_string(o.strategy), o.num_ps, to_string(o.ps_mode),
                               o.replicas_to_aggregate, o.max_staleness, o.average_every)},
  };
}

}  // namespace ringtrain::app
