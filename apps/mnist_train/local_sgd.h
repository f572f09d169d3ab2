// --strategy local-sgd: every rank steps on its own batch, and every --average-every steps (and
// at the end) the ranks average their parameters and optimizer state, so that they leave
// identical and a checkpoint of the chief's replica is the whole state.
#pragma once

#include <cstdint>

#include "ringtrain/allreduce.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"

namespace ringtrain::app {

class LocalSgd {
 public:
  // `allreduce` null: one rank, nothing to average.
  LocalSgd(Allreduce* allreduce, int64_t average_every, int64_t total_steps)
      : allreduce_(allreduce), every_(average_every), total_(total_steps) {}
  // Whether the ranks average at all (several ranks): between averages their replicas differ.
  bool active() const { return allreduce_ != nullptr; }
  // Whether the step just done (step + 1 of the run's count) ends with an average.
  bool due(int64_t step) const {
    return allreduce_ != nullptr && ((step + 1) % every_ == 0 || step + 1 == total_);
  }
  // Averages the parameters and every optimizer buffer (host memory); returns the time taken,
  // in milliseconds (all of it exposed: nothing computes meanwhile).
  double average(Model& model, Optimizer& optimizer);
  int64_t averages() const { return averages_; }

 private:
  Allreduce* allreduce_;
  int64_t every_, total_;
  int64_t averages_ = 0;
};

}  // namespace ringtrain::app
