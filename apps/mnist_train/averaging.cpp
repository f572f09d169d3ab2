// How this run averages (see averaging.h).
#include "averaging.h"

#include <chrono>
#include <string>

#include "lost_scaling.h"
#include "ringtrain/dense_terms.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

Averaging make_averaging(const Options& o, const RunPlan& plan, MpiComm& comm, Model& model,
                         const Context& ctx) {
  Averaging averaging;
  const bool local_sgd = o.strategy == Strategy::kLocalSgd && comm.size() > 1;
  if (!plan.average_gradients && !local_sgd) return averaging;
  if (o.reproducible) {
    averaging.exact_sum = std::make_unique<ExactGradSum>(
        comm, model.grads().data(), model.grad_ranges(), plan.micro_shards, plan.local_micro_shards,
        RingOptions{}, DenseShardTerms::make_for(model, o.micro_batch, plan.local_micro_shards));
    averaging.allreduce = make_exact_allreduce(*averaging.exact_sum);
    spdlog::info(
        "--reproducible: the global batch of {} is {} micro-shards of {} rows, {} on each rank; "
        "their gradients are summed exactly (fixed point, one scale per gradient segment; "
        "gradient segments: {}); {:.1f} MB per rank kept of {}",
        plan.global_batch, plan.micro_shards, o.micro_batch, plan.local_micro_shards,
        model.grad_ranges().size(), static_cast<double>(averaging.exact_sum->kept_bytes()) / 1e6,
        averaging.exact_sum->dense_terms() != nullptr
            ? "the dense layers' rows (the micro-shards stacked, their gradients computed from "
              "the rows as the ring sends them)"
            : "micro-shard gradients (one micro-shard after another)");
  } else {
    // The device transport's deadline is a backstop behind the watchdog, as the host one is.
    averaging.allreduce =
        make_allreduce(comm,
                       AllreduceConfig{.algorithm = o.allreduce,
                                       .device = ctx.device,
                                       .wire = local_sgd ? GradWire::kFp32 : o.grad_wire,
                                       .timeout_s = o.collective_timeout + 30.0,
                                       .phase = local_sgd ? nullptr : "gradient allreduce",
                                       .test_delay_ms = local_sgd ? 0.0 : o.test_comm_delay_ms},
                       ctx);
  }
  Allreduce& allreduce = *averaging.allreduce;
  if (local_sgd) {
    spdlog::info(
        "strategy local-sgd: each rank steps on its own batch; parameters and optimizer "
        "state are averaged by the {} every {} step(s) and at the end",
        to_string(allreduce.kind()), o.average_every);
    return averaging;
  }
  averaging.grad_sync =
      make_grad_sync(model.grads().data(), model.grad_ranges(), allreduce, plan.grad_sync, ctx);
  const GradSync& sync = *averaging.grad_sync;
  // The communication thread shares the cores with backward: it must not spin long while
  // waiting.
  if (sync.device() == Device::kCpu && sync.overlap())
    comm.set_spin_before_sleep(std::chrono::microseconds(50));
  const char* const why =
      allreduce.kind() == AllreduceKind::kStagedRing && o.allreduce != AllreduceAlgorithm::kRing
          ? " (whatever --allreduce says: ranks share a GPU, which NCCL refuses)"
          : "";
  const std::string wire =
      allreduce.wire() == GradWire::kFp32
          ? std::string()
          : fmt::format(" on a {} wire (fp32 partial sums{})", to_string(allreduce.wire()),
                        allreduce.wire() == GradWire::kFp16 ? ", a scale agreed per bucket" : "");
  spdlog::info("gradients: {} bucket(s) averaged by the {}{}{} {} ({}); watchdog {:g} s",
               sync.buckets().size(), to_string(allreduce.kind()), wire, why,
               sync.overlap() ? "while backward runs" : "after backward", plan.overlap_reason,
               o.collective_timeout);
  if (comm.size() > 1) {
    averaging.reference_ms = time_buckets_alone(comm, allreduce, sync.buckets());
    if (averaging.reference_ms > 0)
      spdlog::info(
          "communication reference: the {} alone averages one step's buckets in {:.3f} ms "
          "({:.2f} GB/s bus bandwidth), timed as allreduce_bench times",
          to_string(allreduce.kind()), averaging.reference_ms,
          bus_bandwidth_gbps(model.grads().numel() * static_cast<int64_t>(sizeof(float)),
                             comm.size(), averaging.reference_ms));
  }
  return averaging;
}

}  // namespace ringtrain::app
