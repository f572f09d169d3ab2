// gather_batch (gather.h): one grid-stride loop over the batch's pixels; the first `batch`
// threads also copy the labels.
#include "gather.h"

#include "launch.cuh"

namespace ringtrain::gpu {

namespace {

using detail::grid_threads;
using detail::kThreads;
using detail::thread_index;

__global__ void __launch_bounds__(kThreads)
    gather_batch_kernel(const uint8_t* data, const uint8_t* data_labels, const int32_t* indices,
                        int64_t batch, int64_t pixels, float scale, float* images,
                        int32_t* labels) {
  const int64_t n = batch * pixels;
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    const int64_t b = i / pixels, p = i - b * pixels;
    const int64_t sample = indices[b];
    images[i] = __fmul_rn(static_cast<float>(data[sample * pixels + p]), scale);
  }
  for (int64_t b = thread_index(); b < batch; b += grid_threads()) {
    labels[b] = static_cast<int32_t>(data_labels[indices[b]]);
  }
}

}  // namespace

void gather_batch(const uint8_t* data, const uint8_t* data_labels, const int32_t* indices,
                  int64_t batch, int64_t pixels, float scale, float* images, int32_t* labels,
                  cudaStream_t stream) {
  detail::check_size(batch, "gather_batch");
  detail::check_size(pixels, "gather_batch");
  if (batch == 0) return;
  const int64_t work = std::max(batch * pixels, batch);
  gather_batch_kernel<<<detail::blocks_for(work), kThreads, 0, stream>>>(
      data, data_labels, indices, batch, pixels, scale, images, labels);
  RINGTRAIN_CHECK_LAUNCH();
}

}  // namespace ringtrain::gpu
