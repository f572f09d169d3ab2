// Optimizers, learning-rate schedules and the weight EMA, all on flat buffers: one loop over
// the whole parameter buffer per step, the same arithmetic in the same order on every rank,
// so replicas that start equal and see the same averaged gradient stay bitwise equal.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/context.h"
#include "ringtrain/tensor.h"

namespace ringtrain {

struct OptimizerConfig {
  std::string kind = "sgd";   // "sgd" or "adam"
  float momentum = 0.0f;      // sgd: v = momentum * v + g; w -= lr * v   (PyTorch's form)
  float weight_decay = 0.0f;  // both: g += weight_decay * w before the update (L2 penalty)
  bool nesterov = false;      // sgd only
  float beta1 = 0.9f;         // adam
  float beta2 = 0.999f;       // adam
  float epsilon = 1e-8f;      // adam
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update of params from grads (same length as at construction) with learning rate lr.
  // A device optimizer takes device pointers and queues the update on its stream (the compute
  // stream), returning at once.
  virtual void step(std::span<float> params, std::span<const float> grads, float lr) = 0;
  // The state buffers (momentum; Adam's m and v) for checkpoints, in a fixed order; device
  // memory for a device optimizer: use state_to_host / state_from_host below to read or write.
  virtual std::vector<std::span<float>> state() = 0;
  // Where params, grads and state() live.
  virtual Device device() const { return Device::kCpu; }
  virtual int64_t steps_taken() const = 0;
  // Restores the step count (Adam's bias correction) from a checkpoint; the state buffers are
  // restored by copying into state().
  virtual void set_steps_taken(int64_t steps) = 0;
};

// Throws ringtrain::Error for an unknown kind or an invalid setting (negative momentum,
// beta outside [0,1), ...), naming the flag.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t num_params);
// The same, on ctx.device: for kCuda the state is device memory and step() runs the update
// kernels (gpu::sgd_update / gpu::adam_update, the CPU loops' arithmetic) on ctx.stream. The
// same state() layout as on the CPU, so checkpoints do not depend on the device.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t num_params,
                                          const Context& ctx);
// Explicit, synchronous copies of the state buffers (checkpoints), on either device.
std::vector<std::vector<float>> state_to_host(Optimizer& optimizer);
// Throws unless the buffers match state() in count and sizes.
void state_from_host(Optimizer& optimizer, const std::vector<std::vector<float>>& buffers);

namespace detail {
// The device optimizers (src/cuda/optim_gpu.cpp; the CPU-only build throws). config is valid.
std::unique_ptr<Optimizer> make_device_optimizer(const OptimizerConfig& config, int64_t num_params,
                                                 StreamHandle stream);
}  // namespace detail

struct LrSchedule {
  std::string kind = "constant";  // "constant", "exponential", "linear-warmup"
  float base_lr = 0.01f;
  // exponential: lr = base_lr * decay_rate ^ (step / decay_steps), floor()ed when staircase.
  float decay_rate = 0.99f;
  double decay_steps = 60000.0 / 128.0;
  bool staircase = false;
  // linear-warmup (Goyal et al.): target = base_lr * global_batch / reference_batch; the rate
  // grows linearly from base_lr at step 0 to target at warmup_steps, then stays at target.
  int64_t warmup_steps = 0;
  int64_t global_batch = 0;
  int64_t reference_batch = 0;
};
// Throws for an unknown kind or invalid parameters, naming the flag.
void validate(const LrSchedule& schedule);
float learning_rate(const LrSchedule& schedule, int64_t step);

// Exponential moving average of the weights (TensorFlow's ExponentialMovingAverage with
// num_updates): decay_t = min(decay, (1 + t) / (10 + t)); shadow = decay_t * shadow +
// (1 - decay_t) * params. The shadow starts as a copy of the parameters.
//
// It lives where the parameters do. On a GPU (the second constructor, GPU build) the shadow is
// device memory updated by gpu::ema_update on the given stream, queued after the step's
// optimizer: no download per step, and the same float operations as the host loop, so both
// give the same bits.
class WeightEma {
 public:
  WeightEma(float decay, std::span<const float> params);
  // device_params: n floats of device memory (a device model's flat parameter buffer).
  WeightEma(float decay, const float* device_params, int64_t n, StreamHandle stream);
  // params: host memory for a host average, device memory for a device one.
  void update(std::span<const float> params);
  Device device() const { return shadow_.device(); }
  int64_t size() const { return shadow_.numel(); }
  // The host shadow (a host average only; a device one throws: use shadow_to_host).
  std::span<const float> shadow() const;
  // The shadow's device or host memory, where device() says.
  const float* shadow_data() const { return shadow_.data(); }
  // An explicit copy, from either device (a device copy waits for the queued updates).
  std::vector<float> shadow_to_host() const;
  int64_t updates() const { return updates_; }
  float decay() const { return decay_; }
  // Restores a checkpoint's shadow (host memory, the parameters' length) and update count.
  void restore(std::span<const float> shadow, int64_t updates);

 private:
  float decay_;
  int64_t updates_ = 0;
  Tensor shadow_;                  // [num_params], on the parameters' device
  StreamHandle stream_ = nullptr;  // the stream of a device average's updates
};

}  // namespace ringtrain
