// The device twin of make_batch (src/batch.cpp): gathers a batch of samples, by index, out of
// a data set held on the GPU as bytes (--data-on-gpu), scaling each pixel to [0, 1]. GPU build
// only. All pointers are device pointers; the launcher is asynchronous on `stream` and checks
// its launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ringtrain::gpu {

// images[b, p] = float(data[indices[b] * pixels + p]) * scale     for b < batch, p < pixels
// labels[b]    = int32(data_labels[indices[b]])
// `scale` is make_batch's 1.0f / 255.0f, passed in so that host and device multiply by the
// same float; the product is one rounded multiplication (__fmul_rn) and uint8 -> float is
// exact, so the batch equals make_batch's bit for bit. Indices are not checked here (the
// caller checks them on the host against the data set's count).               Twin: make_batch.
void gather_batch(const uint8_t* data, const uint8_t* data_labels, const int32_t* indices,
                  int64_t batch, int64_t pixels, float scale, float* images, int32_t* labels,
                  cudaStream_t stream);

}  // namespace ringtrain::gpu
