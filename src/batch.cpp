// make_batch: gathers samples by index into a float batch. The data set stays as bytes and is
// scaled here, one batch at a time, so memory holds 1 byte per pixel rather than 4.
#include <algorithm>

#include "ringtrain/check.h"
#include "ringtrain/data.h"

namespace ringtrain {

void make_batch(const Dataset& data, std::span<const int64_t> indices, Tensor& images,
                std::vector<int32_t>& labels) {
  RINGTRAIN_CHECK(data.rows > 0 && data.cols > 0, "make_batch on an empty data set");
  const int64_t batch = static_cast<int64_t>(indices.size());
  const int64_t pixels = data.image_size();
  for (int64_t i : indices) {
    RINGTRAIN_CHECK(i >= 0 && i < data.count,
                    "make_batch: index {} is outside the data set [0, {})", i, data.count);
  }
  images.resize(Shape{batch, data.rows, data.cols, 1});  // [B, rows, cols, 1]
  labels.resize(indices.size());                         // [B]
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t idx = indices[static_cast<size_t>(b)];
    const uint8_t* src = data.images.data() + idx * pixels;
    float* dst = images.data() + b * pixels;
    for (int64_t p = 0; p < pixels; ++p) dst[p] = static_cast<float>(src[p]) * kPixelScale;
    labels[static_cast<size_t>(b)] = static_cast<int32_t>(data.labels[static_cast<size_t>(idx)]);
  }
}

}  // namespace ringtrain
