// Filter layout transposes for the cuDNN convolution path (GPU build only; see
// src/cuda/cudnn_layers.cpp). Our Conv2D weights are TensorFlow's HWIO, w[kh,kw,ci,co]; cuDNN's
// filter layout for NHWC activations is KRSC (CUDNN_TENSOR_NHWC filter: [co,kh,kw,ci]). With
// `taps` = kh * kw filter positions, these are the two index permutations
//   HWIO index (tap * cin + ci) * cout + co   <->   KRSC index (co * taps + tap) * cin + ci
// (a transpose of a [taps*cin, cout] matrix, within each tap). They only move values, so a
// round trip gives back the same bits.
//
// Launchers follow kernels/README.md: asynchronous on `stream`, int64 sizes (a negative size
// throws), zero total size is a no-op (null pointers are then fine), launch checked. Device
// pointers; source and destination must not overlap.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ringtrain::gpu {

// krsc[co, tap, ci] = hwio[tap, ci, co].
void transpose_hwio_to_krsc(const float* hwio, float* krsc, int64_t taps, int64_t cin, int64_t cout,
                            cudaStream_t stream);
// hwio[tap, ci, co] = krsc[co, tap, ci].
void transpose_krsc_to_hwio(const float* krsc, float* hwio, int64_t taps, int64_t cin, int64_t cout,
                            cudaStream_t stream);

}  // namespace ringtrain::gpu
