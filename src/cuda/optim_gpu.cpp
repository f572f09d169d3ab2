// The device optimizers: the CPU optimizers' arithmetic (optim.cpp) as kernels on the compute
// stream (kernels.h: sgd_update, adam_update), state in device memory with the same layout.
// step() queues the update and returns; it never waits on the device.
#include <cmath>

#include "kernels.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/optim.h"
#include "ringtrain/tensor.h"

namespace ringtrain::detail {

namespace {

void check_device_step(std::span<float> params, std::span<const float> grads, float lr,
                       int64_t num_params) {
  RINGTRAIN_CHECK(static_cast<int64_t>(params.size()) == num_params &&
                      static_cast<int64_t>(grads.size()) == num_params,
                  "optimizer step: {} parameters and {} gradients, but the optimizer was built "
                  "for {}",
                  params.size(), grads.size(), num_params);
  RINGTRAIN_CHECK(std::isfinite(lr) && lr >= 0.0f,
                  "optimizer step: the learning rate must be finite and >= 0, got {}", lr);
}

class DeviceSgd final : public Optimizer {
 public:
  DeviceSgd(const OptimizerConfig& config, int64_t num_params, StreamHandle stream)
      : config_(config),
        num_params_(num_params),
        stream_(static_cast<cudaStream_t>(stream)),
        velocity_(config.momentum > 0.0f ? Shape{num_params} : Shape{}, Device::kCuda) {}
  std::string name() const override { return "sgd"; }
  Device device() const override { return Device::kCuda; }
  void step(std::span<float> params, std::span<const float> grads, float lr) override {
    check_device_step(params, grads, lr, num_params_);
    gpu::sgd_update(params.data(), grads.data(),
                    config_.momentum > 0.0f ? velocity_.data() : nullptr, num_params_, lr,
                    config_.weight_decay, config_.momentum, config_.nesterov, stream_);
    ++steps_;
  }
  std::vector<std::span<float>> state() override {
    if (config_.momentum == 0.0f) return {};
    return {std::span<float>(velocity_.data(), static_cast<size_t>(num_params_))};
  }
  int64_t steps_taken() const override { return steps_; }
  void set_steps_taken(int64_t steps) override { steps_ = steps; }

 private:
  OptimizerConfig config_;
  int64_t num_params_;
  cudaStream_t stream_;
  int64_t steps_ = 0;
  Tensor velocity_;  // device [num_params] when momentum > 0
};

class DeviceAdam final : public Optimizer {
 public:
  DeviceAdam(const OptimizerConfig& config, int64_t num_params, StreamHandle stream)
      : config_(config),
        num_params_(num_params),
        stream_(static_cast<cudaStream_t>(stream)),
        m_(Shape{num_params}, Device::kCuda),
        v_(Shape{num_params}, Device::kCuda) {}
  std::string name() const override { return "adam"; }
  Device device() const override { return Device::kCuda; }
  void step(std::span<float> params, std::span<const float> grads, float lr) override {
    check_device_step(params, grads, lr, num_params_);
    ++steps_;
    // The per-step constants from the helper the CPU Adam calls too (optim_math.h).
    const gpu::AdamConstants c = gpu::adam_constants(lr, config_.beta1, config_.beta2,
                                                     config_.epsilon, config_.weight_decay, steps_);
    gpu::adam_update(params.data(), grads.data(), m_.data(), v_.data(), num_params_, c, stream_);
  }
  std::vector<std::span<float>> state() override {
    return {std::span<float>(m_.data(), static_cast<size_t>(num_params_)),
            std::span<float>(v_.data(), static_cast<size_t>(num_params_))};
  }
  int64_t steps_taken() const override { return steps_; }
  void set_steps_taken(int64_t steps) override { steps_ = steps; }

 private:
  OptimizerConfig config_;
  int64_t num_params_;
  cudaStream_t stream_;
  int64_t steps_ = 0;
  Tensor m_, v_;  // device [num_params] first and second moments
};

}  // namespace

std::unique_ptr<Optimizer> make_device_optimizer(const OptimizerConfig& config, int64_t num_params,
                                                 StreamHandle stream) {
  RINGTRAIN_CHECK(stream != nullptr, "a device optimizer needs the compute stream");
  if (config.kind == "sgd") return std::make_unique<DeviceSgd>(config, num_params, stream);
  return std::make_unique<DeviceAdam>(config, num_params, stream);
}

}  // namespace ringtrain::detail
