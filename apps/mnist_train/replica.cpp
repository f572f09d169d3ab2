// Starting and saving a replica (see replica.h).
#include "replica.h"

#include "resume.h"
#include "ringtrain/distributed.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

namespace {

// On a GPU the average is device memory, updated on the compute stream after each step.
std::optional<WeightEma> start_ema(const Options& o, const RunPlan& plan, int rank, Model& model,
                                   const Context& ctx, const std::optional<Checkpoint>& resumed) {
  std::optional<WeightEma> ema;
  if (o.ema_decay <= 0.0f) {
    if (resumed && !resumed->ema_shadow.empty() && rank == 0)
      spdlog::warn("the checkpoint keeps a weight average, but --ema-decay is 0: it is dropped");
    return ema;
  }
  if (model.device() == Device::kCuda) {
    ema.emplace(o.ema_decay, model.params().data(), model.num_params(), ctx.stream);
  } else {
    ema.emplace(o.ema_decay, std::span<const float>(model.params().data(),
                                                    static_cast<size_t>(model.num_params())));
  }
  if (resumed && !resumed->ema_shadow.empty()) {
    ema->restore(resumed->ema_shadow, resumed->ema_updates);
  } else if (resumed && rank == 0) {
    spdlog::warn("the checkpoint keeps no weight average; the EMA starts from step {}",
                 plan.start_step);
  }
  return ema;
}

}  // namespace

Replica start_replica(const Options& o, const RunPlan& plan, Comm& comm, Model& model,
                      const Context& ctx, const std::optional<Checkpoint>& resumed) {
  Replica replica;
  replica.optimizer = make_optimizer(o.optimizer, model.num_params(), ctx);
  Optimizer& optimizer = *replica.optimizer;
  if (resumed) {
    check_checkpoint_fits(*resumed, o, model, optimizer, optimizer.state().size());
    if (comm.rank() == 0 &&
        describe_schedule(resumed->schedule) != describe_schedule(plan.schedule))
      spdlog::warn(
          "the checkpoint's learning-rate schedule ({}) differs from this run's ({}); "
          "continuing with this run's",
          describe_schedule(resumed->schedule), describe_schedule(plan.schedule));
    load_checkpoint_state(*resumed, model, optimizer);
  } else {
    // The chief initialises; everyone starts from its bits.
    if (comm.rank() == 0) model.init_params(o.seed);
    broadcast_params(comm, model);
  }
  replica.ema = start_ema(o, plan, comm.rank(), model, ctx, resumed);
  return replica;
}

Checkpoint replica_checkpoint(const CheckpointHeader& header, int64_t step, const Model& model,
                              Replica& replica) {
  Checkpoint c = checkpoint_at(header, step);
  c.params = model.params_to_host();
  c.optimizer_steps = replica.optimizer->steps_taken();
  c.optimizer_state = state_to_host(*replica.optimizer);
  if (replica.ema) {
    c.ema_decay = replica.ema->decay();
    c.ema_updates = replica.ema->updates();
    c.ema_shadow = replica.ema->shadow_to_host();
  }
  return c;
}

}  // namespace ringtrain::app
