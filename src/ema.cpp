// Exponential moving average of the weights, TensorFlow's ExponentialMovingAverage with
// num_updates: with t updates already applied, decay_t = min(decay, (1 + t) / (10 + t)), so
// the first updates (decay_t = 0.1, 0.18, 0.25, ...) pull the shadow quickly away from the
// initial weights, and the configured decay takes over once (1 + t) / (10 + t) exceeds it.
// WeightEma is declared in optim.h, next to the optimizers it follows.
#include "ringtrain/optim.h"

#include <algorithm>

#include "ringtrain/check.h"
#include "ringtrain/optim_math.h"

#ifdef RINGTRAIN_HAVE_GPU
#include "kernels.h"
#endif

namespace ringtrain {

namespace {
void check_decay(float decay) {
  RINGTRAIN_CHECK(decay >= 0.0f && decay < 1.0f, "--ema-decay must be in [0, 1), got {}", decay);
}
}  // namespace

WeightEma::WeightEma(float decay, std::span<const float> params)
    : decay_(decay), shadow_(Shape{static_cast<int64_t>(params.size())}) {
  check_decay(decay);
  std::copy(params.begin(), params.end(), shadow_.data());
}

WeightEma::WeightEma(float decay, const float* device_params, int64_t n, StreamHandle stream)
    : decay_(decay), shadow_(Device::kCuda), stream_(stream) {
  check_decay(decay);
  RINGTRAIN_CHECK(n >= 0, "EMA of {} parameters", n);
  shadow_.resize(Shape{n});
  // Queued on the stream the updates use: ordered after whatever last wrote the parameters.
  copy_floats_async(shadow_.data(), Device::kCuda, device_params, Device::kCuda, n, stream);
}

std::span<const float> WeightEma::shadow() const {
  RINGTRAIN_CHECK(device() == Device::kCpu,
                  "the weight average lives on the GPU: read it with shadow_to_host()");
  return {shadow_.data(), static_cast<size_t>(shadow_.numel())};
}

std::vector<float> WeightEma::shadow_to_host() const {
  return shadow_.to_host();
}

void WeightEma::update(std::span<const float> params) {
  RINGTRAIN_CHECK(static_cast<int64_t>(params.size()) == shadow_.numel(),
                  "EMA update: {} parameters, but the average was started with {}", params.size(),
                  shadow_.numel());
  const auto [keep, take] = ema_factors(decay_, updates_);
  float* shadow = shadow_.data();  // [num_params]
  const float* w = params.data();  // [num_params]
  const int64_t n = shadow_.numel();
  if (device() == Device::kCuda) {
#ifdef RINGTRAIN_HAVE_GPU
    gpu::ema_update(shadow, w, n, keep, take, static_cast<cudaStream_t>(stream_));
#endif
  } else {
    for (int64_t i = 0; i < n; ++i) shadow[i] = keep * shadow[i] + take * w[i];
  }
  ++updates_;
}

EmaFactors ema_factors(float decay, int64_t updates) {
  RINGTRAIN_CHECK(updates >= 0, "ema_factors: negative update count {}", updates);
  const double t = static_cast<double>(updates);
  const double decay_t = std::min(static_cast<double>(decay), (1.0 + t) / (10.0 + t));
  return EmaFactors{static_cast<float>(decay_t), static_cast<float>(1.0 - decay_t)};
}

void WeightEma::restore(std::span<const float> shadow, int64_t updates) {
  RINGTRAIN_CHECK(static_cast<int64_t>(shadow.size()) == shadow_.numel(),
                  "EMA restore: {} values, but the average holds {}", shadow.size(),
                  shadow_.numel());
  RINGTRAIN_CHECK(updates >= 0, "EMA restore: negative update count {}", updates);
  shadow_.copy_from_host(shadow);
  updates_ = updates;
}

}  // namespace ringtrain
