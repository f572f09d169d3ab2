// Exponential moving average of the weights, TensorFlow's ExponentialMovingAverage with
// num_updates: with t updates already applied, decay_t = min(decay, (1 + t) / (10 + t)), so
// the first updates (decay_t = 0.1, 0.18, 0.25, ...) pull the shadow quickly away from the
// initial weights, and the configured decay takes over once (1 + t) / (10 + t) exceeds it.
// WeightEma is declared in optim.h, next to the optimizers it follows.
#include "ringtrain/optim.h"

#include <algorithm>

#include "ringtrain/check.h"
#include "ringtrain/optim_math.h"

namespace ringtrain {

WeightEma::WeightEma(float decay, std::span<const float> params)
    : decay_(decay), shadow_(params.begin(), params.end()) {
  RINGTRAIN_CHECK(decay >= 0.0f && decay < 1.0f, "--ema-decay must be in [0, 1), got {}", decay);
}

void WeightEma::update(std::span<const float> params) {
  RINGTRAIN_CHECK(params.size() == shadow_.size(),
                  "EMA update: {} parameters, but the average was started with {}", params.size(),
                  shadow_.size());
  const auto [keep, take] = ema_factors(decay_, updates_);
  float* shadow = shadow_.data();  // [num_params]
  const float* w = params.data();  // [num_params]
  const int64_t n = static_cast<int64_t>(shadow_.size());
  for (int64_t i = 0; i < n; ++i) shadow[i] = keep * shadow[i] + take * w[i];
  ++updates_;
}

EmaFactors ema_factors(float decay, int64_t updates) {
  RINGTRAIN_CHECK(updates >= 0, "ema_factors: negative update count {}", updates);
  const double t = static_cast<double>(updates);
  const double decay_t = std::min(static_cast<double>(decay), (1.0 + t) / (10.0 + t));
  return EmaFactors{static_cast<float>(decay_t), static_cast<float>(1.0 - decay_t)};
}

void WeightEma::restore(std::span<const float> shadow, int64_t updates) {
  RINGTRAIN_CHECK(shadow.size() == shadow_.size(),
                  "EMA restore: {} values, but the average holds {}", shadow.size(),
                  shadow_.size());
  RINGTRAIN_CHECK(updates >= 0, "EMA restore: negative update count {}", updates);
  std::copy(shadow.begin(), shadow.end(), shadow_.begin());
  updates_ = updates;
}

}  // namespace ringtrain
