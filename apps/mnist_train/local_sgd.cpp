// Local SGD's parameter averages (see local_sgd.h).
#include "local_sgd.h"

#include <chrono>
#include <span>

namespace ringtrain::app {

double LocalSgd::average(Model& model, Optimizer& optimizer) {
  const auto start = std::chrono::steady_clock::now();
  Tensor& params = model.params();
  allreduce_->run(params.data(), static_cast<size_t>(params.numel()), ReduceOp::kAvg);
  for (const std::span<float> buffer : optimizer.state())
    allreduce_->run(buffer.data(), buffer.size(), ReduceOp::kAvg);
  ++averages_;
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace ringtrain::app
