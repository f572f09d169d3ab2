// The test-set evaluation (see evaluation.h).
#include "evaluation.h"

#include <algorithm>
#include <vector>

#include "ringtrain/distributed.h"

namespace ringtrain::app {

EvalResult evaluate_test(Comm& comm, Model& model, const Dataset& test, int64_t eval_batch,
                         const WeightEma* ema, Batch& scratch, Context& ctx,
                         Tensor& trained_scratch) {
  if (ema == nullptr) return evaluate_sharded(comm, model, test, eval_batch, scratch, ctx);
  if (model.device() != Device::kCpu) {  // device-to-device copies of the trained weights
    Tensor& params = model.params();
    Tensor& trained = trained_scratch;
    if (trained.device() != Device::kCuda) trained = Tensor(Device::kCuda);
    trained.resize(params.shape());
    copy_floats(trained.data(), Device::kCuda, params.data(), Device::kCuda, params.numel());
    copy_floats(params.data(), Device::kCuda, ema->shadow_data(), ema->device(), params.numel());
    EvalResult result = evaluate_sharded(comm, model, test, eval_batch, scratch, ctx);
    copy_floats(params.data(), Device::kCuda, trained.data(), Device::kCuda, params.numel());
    return result;
  }
  Tensor& params = model.params();
  std::vector<float> trained(params.data(), params.data() + params.numel());
  std::copy(ema->shadow().begin(), ema->shadow().end(), params.data());
  EvalResult result = evaluate_sharded(comm, model, test, eval_batch, scratch, ctx);
  std::copy(trained.begin(), trained.end(), params.data());
  return result;
}

}  // namespace ringtrain::app
