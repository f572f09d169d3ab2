// Fused softmax cross-entropy: the loss and its gradient in one pass over the logits, with the
// max subtracted for stability. Fusing gives the simple gradient (softmax - onehot) / B and
// never forms log(softmax) separately, which would lose precision for confident rows.
#include <cmath>

#include "ringtrain/check.h"
#include "ringtrain/ops.h"

namespace ringtrain {

template <typename T>
double softmax_xent(const T* logits, const int32_t* labels, T* dlogits, int64_t batch,
                    int64_t classes, int64_t* correct) {
  RINGTRAIN_CHECK(batch > 0 && classes > 0, "softmax_xent on an empty batch");
  double loss_sum = 0.0;
  int64_t hits = 0;
  const T inv_batch = T(1) / static_cast<T>(batch);
  for (int64_t r = 0; r < batch; ++r) {
    const T* z = logits + r * classes;
    const int32_t label = labels[r];
    RINGTRAIN_CHECK(label >= 0 && label < classes, "label {} of row {} is outside [0, {})", label,
                    r, classes);
    int64_t argmax = 0;
    for (int64_t c = 1; c < classes; ++c) argmax = z[c] > z[argmax] ? c : argmax;
    const T max = z[argmax];
    T sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
    const T log_sum = std::log(sum);
    loss_sum += static_cast<double>(log_sum - (z[label] - max));
    hits += argmax == label ? 1 : 0;
    if (dlogits != nullptr) {
      T* d = dlogits + r * classes;
      for (int64_t c = 0; c < classes; ++c) d[c] = std::exp(z[c] - max - log_sum) * inv_batch;
      d[label] -= inv_batch;
    }
  }
  if (correct != nullptr) *correct = hits;
  return loss_sum / static_cast<double>(batch);
}

template double softmax_xent<float>(const float*, const int32_t*, float*, int64_t, int64_t,
                                    int64_t*);
template double softmax_xent<double>(const double*, const int32_t*, double*, int64_t, int64_t,
                                     int64_t*);

}  // namespace ringtrain
