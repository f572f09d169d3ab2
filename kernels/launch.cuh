// Launch-configuration helpers shared by the kernels' .cu files (private to kernels/; the
// public contract is kernels.h). Every elementwise kernel is a grid-stride loop over int64
// indices in 256-thread blocks, with the grid capped so that a huge buffer is covered by
// threads that loop rather than by a grid larger than the GPU can hold at once.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"

namespace ringtrain::gpu::detail {

// Threads per block of the elementwise and reduction kernels: a multiple of the warp size
// that keeps 8 blocks resident per SM (2048 threads) on sm_90.
inline constexpr int kThreads = 256;
// At most this many blocks per launch: 4096 x 256 = 1 Mi threads, about four times what an
// H100/H200 (132 SMs x 2048 threads) holds resident; larger inputs loop (grid-stride).
inline constexpr int64_t kMaxBlocks = 4096;

// Blocks for `work` independent items at kThreads items per block (work > 0).
inline unsigned int blocks_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::min(blocks, kMaxBlocks));
}

// The global thread index and the grid's thread count, as int64 so that index arithmetic on
// buffers above 2^31 values cannot overflow.
__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// True when p is 16-byte aligned (a float4 load or store from it is legal).
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Elements before `p` reaches a 16-byte boundary (0..3); p must be 4-byte aligned.
inline int64_t head_to_aligned16(const float* p) {
  return static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / sizeof(float));
}

// The checks every launcher makes on its sizes before touching memory.
inline void check_size(int64_t n, const char* what) {
  RINGTRAIN_CHECK(n >= 0, "gpu::{}: negative size {}", what, n);
}

}  // namespace ringtrain::gpu::detail
