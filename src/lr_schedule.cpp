// Learning-rate schedules: a pure function of (schedule, step), computed in double and
// returned as float, so every rank derives the same rate from the same step count and a
// resumed run continues the curve from its checkpointed step.
//   constant       base_lr
//   exponential    base_lr * decay_rate ^ (step / decay_steps), the exponent floor()ed when
//                  staircase (TensorFlow's exponential_decay)
//   linear-warmup  from base_lr at step 0 straight up to base_lr * global_batch /
//                  reference_batch at warmup_steps, flat afterwards (Goyal et al., 2017)
// validate() and learning_rate() are declared in optim.h, next to the optimizers.
#include "ringtrain/optim.h"

#include <cmath>

#include "ringtrain/check.h"

namespace ringtrain {

void validate(const LrSchedule& schedule) {
  RINGTRAIN_CHECK(schedule.kind == "constant" || schedule.kind == "exponential" ||
                      schedule.kind == "linear-warmup",
                  "--lr-schedule must be one of constant, exponential, linear-warmup; got '{}'",
                  schedule.kind);
  RINGTRAIN_CHECK(std::isfinite(schedule.base_lr) && schedule.base_lr >= 0.0f,
                  "--lr must be finite and >= 0, got {}", schedule.base_lr);
  // Only the fields the chosen kind reads are checked: the others keep harmless defaults.
  if (schedule.kind == "exponential") {
    RINGTRAIN_CHECK(std::isfinite(schedule.decay_steps) && schedule.decay_steps > 0.0,
                    "--lr-decay-steps must be finite and > 0 for --lr-schedule exponential, got {}",
                    schedule.decay_steps);
    RINGTRAIN_CHECK(schedule.decay_rate > 0.0f && schedule.decay_rate <= 1.0f,
                    "--lr-decay-rate must be in (0, 1] for --lr-schedule exponential, got {}",
                    schedule.decay_rate);
  } else if (schedule.kind == "linear-warmup") {
    RINGTRAIN_CHECK(schedule.warmup_steps >= 0,
                    "--warmup-steps must be >= 0 for --lr-schedule linear-warmup, got {}",
                    schedule.warmup_steps);
    RINGTRAIN_CHECK(schedule.reference_batch > 0,
                    "--reference-batch must be > 0 for --lr-schedule linear-warmup, got {}",
                    schedule.reference_batch);
    RINGTRAIN_CHECK(schedule.global_batch > 0,
                    "--lr-schedule linear-warmup needs the global batch (--batch-size times the "
                    "number of ranks) > 0, got {}",
                    schedule.global_batch);
  }
}

float learning_rate(const LrSchedule& schedule, int64_t step) {
  // A handful of comparisons per step, next to a forward and backward pass: cheap enough to
  // keep a schedule built by hand (a test, a tool) from producing a silent NaN.
  validate(schedule);
  RINGTRAIN_CHECK(step >= 0, "learning_rate: the step must be >= 0, got {}", step);
  const double base = schedule.base_lr;
  if (schedule.kind == "exponential") {
    double exponent = static_cast<double>(step) / schedule.decay_steps;
    if (schedule.staircase) exponent = std::floor(exponent);
    return static_cast<float>(base * std::pow(static_cast<double>(schedule.decay_rate), exponent));
  }
  if (schedule.kind == "linear-warmup") {
    const double target = base * static_cast<double>(schedule.global_batch) /
                          static_cast<double>(schedule.reference_batch);
    if (step >= schedule.warmup_steps) return static_cast<float>(target);  // also warmup 0
    const double progress = static_cast<double>(step) / static_cast<double>(schedule.warmup_steps);
    return static_cast<float>(base + (target - base) * progress);
  }
  return schedule.base_lr;  // constant
}

}  // namespace ringtrain
