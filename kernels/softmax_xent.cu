// Fused softmax cross-entropy over logits[rows, classes], the GPU twin of
// src/layers/softmax_xent.cpp, with the same float arithmetic per row:
//   argmax = first maximum (the CPU's scan `z[c] > z[argmax]`, NaN never wins; z[0] NaN
//            keeps argmax 0), max = z[argmax]
//   sum    = sum over c of exp(z[c] - max), in float       log_sum = log(sum)
//   loss   = log_sum - (z[label] - max), added in double to the loss sum
//   dlogits[c] = exp(z[c] - max - log_sum) * (1/rows), minus 1/rows at the label
// The GPU's expf and logf are within 2 and 1 ulp (CUDA's documented bounds) where glibc's are
// within 1, so the values agree to a few ulp, not bit for bit; the arg-max is exact.
//
// Launch: ONE block of 1024 threads for the whole batch. Rows are dealt to groups of G lanes
// (G = 1 for classes <= 32: a thread walks its row in class order, the CPU's order exactly;
// G = 32, a warp per row, for more classes: lane l takes classes l, l + 32, ..., and the
// lanes combine by a fixed shuffle tree). Each group's first lane keeps its rows' loss sum
// (double), hits and bad labels in registers, and the block reduces them by a fixed tree at
// the end, so the loss sum has the same bits on every run (a grid with atomicAdd on a double
// would add the rows in scheduling order: different last bits run to run). One block is the
// price of determinism without scratch memory; at MNIST sizes (a few hundred to a few
// thousand rows of 10 classes) that is one pass of a few microseconds.
//
// A label outside [0, classes) is counted in bad_labels (the caller turns that into an
// error) and touches nothing out of bounds: its row adds no loss and no hit, and its dlogits
// are the softmax / rows without the one-hot term.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels.h"
#include "launch.cuh"

namespace ringtrain::gpu {

namespace {

constexpr int kXentThreads = 1024;
constexpr unsigned int kFullMask = 0xffffffffu;

// Sums v over the 32 lanes of a warp by a fixed xor tree (every lane gets the same bits:
// each step adds the same two values on both partner lanes).
template <typename T>
__device__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <int G>
__global__ void __launch_bounds__(kXentThreads)
    softmax_xent_kernel(const float* logits, const int32_t* labels, float* dlogits, int64_t rows,
                        int64_t classes, float inv_batch, XentStats* stats) {
  static_assert(G == 1 || G == 32, "a row is one thread or one warp");
  const int lane = static_cast<int>(threadIdx.x) % G;
  const int group = static_cast<int>(threadIdx.x) / G;
  const int groups = static_cast<int>(blockDim.x) / G;

  double loss = 0.0;
  unsigned long long hits = 0;
  unsigned long long bad = 0;
  // With G = 32 the loop bound is the same for the whole warp, so every lane reaches every
  // shuffle with the full mask.
  for (int64_t r = group; r < rows; r += groups) {
    const float* z = logits + r * classes;

    // This lane's first maximum among its non-NaN values (best_c = -1: none yet).
    float best = 0.0f;
    int64_t best_c = -1;
    for (int64_t c = lane; c < classes; c += G) {
      const float v = z[c];
      if (v > best || (best_c < 0 && !isnan(v))) {
        best = v;
        best_c = c;
      }
    }
    // The lanes' candidates: the larger value wins, a tie goes to the smaller class. This
    // picks the smallest index holding the maximum of the non-NaN values, as the CPU's scan.
    if constexpr (G > 1) {
      for (int offset = G / 2; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(kFullMask, best, offset);
        const int64_t other_c = __shfl_xor_sync(kFullMask, best_c, offset);
        if (other_c >= 0 && (best_c < 0 || other > best || (other == best && other_c < best_c))) {
          best = other;
          best_c = other_c;
        }
      }
    }
    // The CPU's scan starts at z[0]: when that is NaN no comparison ever succeeds.
    const int64_t argmax = isnan(z[0]) ? 0 : best_c;
    const float max = z[argmax];

    float sum = 0.0f;
    for (int64_t c = lane; c < classes; c += G) sum = __fadd_rn(sum, expf(__fsub_rn(z[c], max)));
    if constexpr (G > 1) sum = warp_sum(sum);
    const float log_sum = logf(sum);

    const int32_t label = labels[r];
    const bool good = label >= 0 && label < classes;
    if (lane == 0) {
      if (good) {
        loss += static_cast<double>(__fsub_rn(log_sum, __fsub_rn(z[label], max)));
        hits += argmax == label ? 1 : 0;
      } else {
        ++bad;
      }
    }
    if (dlogits != nullptr) {
      float* d = dlogits + r * classes;
      for (int64_t c = lane; c < classes; c += G) {
        float p = __fmul_rn(expf(__fsub_rn(__fsub_rn(z[c], max), log_sum)), inv_batch);
        if (good && c == label) p = __fsub_rn(p, inv_batch);
        d[c] = p;
      }
    }
  }

  // The block's totals by a fixed tree: each warp, then warp 0 over the warps' sums.
  __shared__ double warp_loss[32];
  __shared__ unsigned long long warp_hits[32];
  __shared__ unsigned long long warp_bad[32];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  loss = warp_sum(loss);
  hits = warp_sum(hits);
  bad = warp_sum(bad);
  if (warp_lane == 0) {
    warp_loss[warp] = loss;
    warp_hits[warp] = hits;
    warp_bad[warp] = bad;
  }
  __syncthreads();
  if (warp == 0) {
    loss = warp_lane < warps ? warp_loss[warp_lane] : 0.0;
    hits = warp_lane < warps ? warp_hits[warp_lane] : 0;
    bad = warp_lane < warps ? warp_bad[warp_lane] : 0;
    loss = warp_sum(loss);
    hits = warp_sum(hits);
    bad = warp_sum(bad);
    if (warp_lane == 0) {
      stats->loss_sum = loss;
      stats->correct = hits;
      stats->bad_labels = bad;
    }
  }
}

}  // namespace

void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows,
                  int64_t classes, XentStats* stats, cudaStream_t stream) {
  detail::check_size(rows, "softmax_xent rows");
  detail::check_size(classes, "softmax_xent classes");
  RINGTRAIN_CHECK(stats != nullptr, "gpu::softmax_xent needs a device XentStats");
  if (rows == 0) {  // nothing to launch: the results of no rows are zeros
    RINGTRAIN_CHECK_CUDA(cudaMemsetAsync(stats, 0, sizeof(XentStats), stream));
    return;
  }
  RINGTRAIN_CHECK(classes > 0, "gpu::softmax_xent: {} rows of 0 classes", rows);
  RINGTRAIN_CHECK(rows <= INT64_MAX / classes, "gpu::softmax_xent: {} x {} logits overflow int64",
                  rows, classes);
  // The kernel writes all three fields of *stats, so no memset is needed before it: the
  // caller sees them zeroed and then accumulated, as the contract says.
  const float inv_batch = 1.0f / static_cast<float>(rows);  // the CPU's T(1) / T(batch)
  if (classes <= 32) {
    softmax_xent_kernel<1>
        <<<1, kXentThreads, 0, stream>>>(logits, labels, dlogits, rows, classes, inv_batch, stats);
  } else {
    softmax_xent_kernel<32>
        <<<1, kXentThreads, 0, stream>>>(logits, labels, dlogits, rows, classes, inv_batch, stats);
  }
  RINGTRAIN_CHECK_LAUNCH();
}

}  // namespace ringtrain::gpu
