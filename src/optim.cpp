// Optimizers on the flat parameter buffer: SGD (PyTorch's momentum and Nesterov forms) and
// Adam (PyTorch's L2 form, not AdamW). Each update is one branch-free loop over raw pointers
// that the compiler vectorises; the choice between variants is made once per step, outside
// the loop, and the optimizer allocates its state once, at construction. There are no
// reductions and no threads, so every rank computes the same bits from the same inputs.
//
// Adam's loop calls std::sqrt: GCC and Clang vectorise it only under -fno-math-errno (with
// errno on, each call keeps a scalar branch to libm for negative inputs).
#include "ringtrain/optim.h"
#include "ringtrain/optim_math.h"

#include <cmath>

#include "ringtrain/check.h"
#include "ringtrain/tensor.h"

namespace ringtrain {

namespace {

// ---- the update loops: w [n], grad [n], state buffers [n] ----

// g = grad + wd * w; w -= lr * g
void sgd_update(float* w, const float* grad, int64_t n, float lr, float wd) {
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * (grad[i] + wd * w[i]);
}

// g = grad + wd * w; v = momentum * v + g; w -= lr * v
void sgd_momentum_update(float* w, const float* grad, float* v, int64_t n, float lr, float wd,
                         float momentum) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * w[i];
    const float vi = momentum * v[i] + g;
    v[i] = vi;
    w[i] -= lr * vi;
  }
}

// g = grad + wd * w; v = momentum * v + g; w -= lr * (g + momentum * v)
void sgd_nesterov_update(float* w, const float* grad, float* v, int64_t n, float lr, float wd,
                         float momentum) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * w[i];
    const float vi = momentum * v[i] + g;
    v[i] = vi;
    w[i] -= lr * (g + momentum * vi);
  }
}

void adam_update(float* w, const float* grad, float* m, float* v, int64_t n,
                 const AdamConstants& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + s.weight_decay * w[i];
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    w[i] -= s.step_size * mi / (std::sqrt(vi) * s.inv_sqrt_bias2 + s.epsilon);
  }
}

// The checks every step() makes before touching memory.
void check_step(std::span<float> params, std::span<const float> grads, float lr,
                int64_t num_params) {
  RINGTRAIN_CHECK(static_cast<int64_t>(params.size()) == num_params,
                  "optimizer step: {} parameters, but the optimizer was built for {}",
                  params.size(), num_params);
  RINGTRAIN_CHECK(static_cast<int64_t>(grads.size()) == num_params,
                  "optimizer step: {} gradients, but the optimizer was built for {} parameters",
                  grads.size(), num_params);
  RINGTRAIN_CHECK(std::isfinite(lr) && lr >= 0.0f,
                  "optimizer step: the learning rate must be finite and >= 0, got {}", lr);
}

// ---- the optimizers ----

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& config, int64_t num_params)
      : momentum_(config.momentum),
        weight_decay_(config.weight_decay),
        nesterov_(config.nesterov),
        num_params_(num_params),
        velocity_(momentum_ > 0.0f ? static_cast<size_t>(num_params) : 0, 0.0f) {}

  std::string name() const override { return "sgd"; }

  void step(std::span<float> params, std::span<const float> grads, float lr) override {
    check_step(params, grads, lr, num_params_);
    if (momentum_ == 0.0f) {
      sgd_update(params.data(), grads.data(), num_params_, lr, weight_decay_);
    } else if (nesterov_) {
      sgd_nesterov_update(params.data(), grads.data(), velocity_.data(), num_params_, lr,
                          weight_decay_, momentum_);
    } else {
      sgd_momentum_update(params.data(), grads.data(), velocity_.data(), num_params_, lr,
                          weight_decay_, momentum_);
    }
    ++steps_;
  }

  // The velocity when there is momentum, nothing otherwise (decided by the config alone, so
  // a checkpoint's layout does not depend on the model's size).
  std::vector<std::span<float>> state() override {
    if (momentum_ == 0.0f) return {};
    return {std::span<float>(velocity_)};
  }

  int64_t steps_taken() const override { return steps_; }
  void set_steps_taken(int64_t steps) override { steps_ = steps; }

 private:
  float momentum_;
  float weight_decay_;
  bool nesterov_;
  int64_t num_params_;
  int64_t steps_ = 0;
  std::vector<float> velocity_;  // [num_params] when momentum > 0, else empty
};

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerConfig& config, int64_t num_params)
      : config_(config),
        num_params_(num_params),
        m_(static_cast<size_t>(num_params), 0.0f),
        v_(static_cast<size_t>(num_params), 0.0f) {}

  std::string name() const override { return "adam"; }

  void step(std::span<float> params, std::span<const float> grads, float lr) override {
    check_step(params, grads, lr, num_params_);
    ++steps_;  // t counts from 1
    const AdamConstants s = adam_constants(lr, config_.beta1, config_.beta2, config_.epsilon,
                                           config_.weight_decay, steps_);
    adam_update(params.data(), grads.data(), m_.data(), v_.data(), num_params_, s);
  }

  // First moment, then second moment.
  std::vector<std::span<float>> state() override {
    return {std::span<float>(m_), std::span<float>(v_)};
  }

  int64_t steps_taken() const override { return steps_; }
  void set_steps_taken(int64_t steps) override { steps_ = steps; }

 private:
  OptimizerConfig config_;
  int64_t num_params_;
  int64_t steps_ = 0;
  std::vector<float> m_;  // [num_params] first moment
  std::vector<float> v_;  // [num_params] second moment
};

// True for x in [0, 1); false for NaN.
bool in_unit_interval(float x) {
  return x >= 0.0f && x < 1.0f;
}

}  // namespace

namespace {
void validate_config(const OptimizerConfig& config, int64_t num_params) {
  RINGTRAIN_CHECK(config.kind == "sgd" || config.kind == "adam",
                  "--optimizer must be one of sgd, adam; got '{}'", config.kind);
  RINGTRAIN_CHECK(num_params >= 0, "an optimizer needs num_params >= 0, got {}", num_params);
  RINGTRAIN_CHECK(in_unit_interval(config.momentum), "--momentum must be in [0, 1), got {}",
                  config.momentum);
  RINGTRAIN_CHECK(std::isfinite(config.weight_decay) && config.weight_decay >= 0.0f,
                  "--weight-decay must be finite and >= 0, got {}", config.weight_decay);
  RINGTRAIN_CHECK(in_unit_interval(config.beta1), "--adam-beta1 must be in [0, 1), got {}",
                  config.beta1);
  RINGTRAIN_CHECK(in_unit_interval(config.beta2), "--adam-beta2 must be in [0, 1), got {}",
                  config.beta2);
  RINGTRAIN_CHECK(std::isfinite(config.epsilon) && config.epsilon > 0.0f,
                  "--adam-epsilon must be finite and > 0, got {}", config.epsilon);
  if (config.nesterov) {
    // Adam has no Nesterov form here; ignoring the flag silently would hide a typo'd command.
    RINGTRAIN_CHECK(config.kind == "sgd", "--nesterov applies to --optimizer sgd only, not {}",
                    config.kind);
    RINGTRAIN_CHECK(config.momentum > 0.0f, "--nesterov needs --momentum > 0, got {}",
                    config.momentum);
  }
}
}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t num_params) {
  validate_config(config, num_params);
  if (config.kind == "sgd") return std::make_unique<Sgd>(config, num_params);
  return std::make_unique<Adam>(config, num_params);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t num_params,
                                          const Context& ctx) {
  if (ctx.device == Device::kCpu) return make_optimizer(config, num_params);
  validate_config(config, num_params);
  return detail::make_device_optimizer(config, num_params, ctx.stream);
}

std::vector<std::vector<float>> state_to_host(Optimizer& optimizer) {
  std::vector<std::vector<float>> buffers;
  for (const std::span<float> buffer : optimizer.state()) {
    buffers.emplace_back(buffer.size());
    copy_floats(buffers.back().data(), Device::kCpu, buffer.data(), optimizer.device(),
                static_cast<int64_t>(buffer.size()));
  }
  return buffers;
}

void state_from_host(Optimizer& optimizer, const std::vector<std::vector<float>>& buffers) {
  const auto state = optimizer.state();
  RINGTRAIN_CHECK(state.size() == buffers.size(), "{} state: {} buffers given, {} needed",
                  optimizer.name(), buffers.size(), state.size());
  for (size_t b = 0; b < state.size(); ++b) {
    RINGTRAIN_CHECK(state[b].size() == buffers[b].size(),
                    "{} state buffer {}: {} values given, {} needed", optimizer.name(), b,
                    buffers[b].size(), state[b].size());
    copy_floats(state[b].data(), optimizer.device(), buffers[b].data(), Device::kCpu,
                static_cast<int64_t>(buffers[b].size()));
  }
}

AdamConstants adam_constants(float lr, float beta1, float beta2, float epsilon, float weight_decay,
                             int64_t step) {
  RINGTRAIN_CHECK(step >= 1, "adam_constants: Adam's step count starts at 1, got {}", step);
  const double t = static_cast<double>(step);
  const double bias1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bias2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  return AdamConstants{
      .weight_decay = weight_decay,
      .beta1 = beta1,
      .one_minus_beta1 = 1.0f - beta1,
      .beta2 = beta2,
      .one_minus_beta2 = 1.0f - beta2,
      .step_size = static_cast<float>(static_cast<double>(lr) / bias1),
      .inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2)),
      .epsilon = epsilon,
  };
}

}  // namespace ringtrain
