// The per-step constants of Adam and of the weight EMA, computed once on the host for both
// twins: the CPU loops (optim.cpp, ema.cpp) and the CUDA kernels (kernels/optim.cu) take the
// same values, so the GPU update cannot drift from the CPU one by a differently rounded
// constant. Plain C++17 (the .cu files include it through kernels.h).
#pragma once

#include <cstdint>

namespace ringtrain {

// Adam's loop is w -= step_size * m / (sqrt(v) * inv_sqrt_bias2 + eps), which is
// lr * mhat / (sqrt(vhat) + eps) with mhat = m / (1 - beta1^t), vhat = v / (1 - beta2^t): the
// bias corrections are folded into the constants (in double, then rounded to float).
struct AdamConstants {
  float weight_decay;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;       // lr / (1 - beta1^t)
  float inv_sqrt_bias2;  // 1 / sqrt(1 - beta2^t)
  float epsilon;
};
// For step t, counting from 1 (throws for t < 1).
AdamConstants adam_constants(float lr, float beta1, float beta2, float epsilon, float weight_decay,
                             int64_t step);

// shadow = keep * shadow + take * w, with keep = decay_t = min(decay, (1 + t) / (10 + t)) and
// take = 1 - decay_t, for an update with t updates already applied (TensorFlow's
// ExponentialMovingAverage with num_updates).
struct EmaFactors {
  float keep;
  float take;
};
EmaFactors ema_factors(float decay, int64_t updates);  // throws for updates < 0

}  // namespace ringtrain
