// The test-set evaluation of mnist_train: split over the ranks, with the EMA weights when there
// are any.
#pragma once

#include "ringtrain/comm.h"
#include "ringtrain/data.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/train.h"

namespace ringtrain::app {

// Collective. With `ema`, evaluates the weight average and restores the trained weights
// after; trained_scratch keeps a device model's trained weights meanwhile (allocated once: a
// new allocation would make --cuda-graphs recapture after every evaluation).
EvalResult evaluate_test(Comm& comm, Model& model, const Dataset& test, int64_t eval_batch,
                         const WeightEma* ema, Batch& scratch, Context& ctx,
                         Tensor& trained_scratch);

}  // namespace ringtrain::app
