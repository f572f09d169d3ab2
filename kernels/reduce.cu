// Reductions: the bias gradient (a column sum, deterministic: no float atomics, a fixed
// summation order, so the same dy gives the same bits on every run and every rank) and the
// non-finite count (integer atomics, exact in any order).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"
#include "launch.cuh"

namespace ringtrain::gpu {

namespace {

using detail::grid_threads;
using detail::kThreads;
using detail::thread_index;

// out[chunk, c] = sum over rows r of chunk `blockIdx.y` of dy[r, c], where chunk k holds rows
// [k * chunk_rows, min(rows, (k + 1) * chunk_rows)); one chunk (gridDim.y = 1, chunk_rows =
// rows) is the whole column sum. A block of kThreads threads is laid out as blockDim.x = TX
// columns (a power of two <= 32, so a warp reads TX consecutive floats of each of 32 / TX
// rows) times blockDim.y = TY = kThreads / TX row slices. Thread (tx, ty) sums rows
// ty, ty + TY, ty + 2 TY, ... of its chunk in column tile * TX + tx, in that order; the TY
// partial sums are then added by a fixed binary tree in shared memory (slice s + TY/2 into s,
// and so on). The order depends only on (rows, cols, chunk_rows), never on scheduling. Sums
// start from -0.0f, the exact additive identity (-0 + x == x for every x, +0 included), so a
// single row is copied bit for bit.
__global__ void __launch_bounds__(kThreads)
    column_sum_kernel(const float* dy, float* out, int64_t rows, int64_t cols, int64_t chunk_rows) {
  __shared__ float partial[kThreads];
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const int width = static_cast<int>(blockDim.x);
  const int slices = static_cast<int>(blockDim.y);
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t row_end = min(rows, row_begin + chunk_rows);
  float* chunk_out = out + static_cast<int64_t>(blockIdx.y) * cols;
  float* mine = partial + ty * width + tx;
  // The loop condition is the same for the whole block, so every __syncthreads is reached by
  // every thread.
  for (int64_t tile = blockIdx.x; tile * width < cols; tile += gridDim.x) {
    const int64_t c = tile * width + tx;
    float sum = -0.0f;
    if (c < cols) {
      for (int64_t r = row_begin + ty; r < row_end; r += slices) {
        sum = __fadd_rn(sum, dy[r * cols + c]);
      }
    }
    *mine = sum;
    __syncthreads();
    for (int half = slices / 2; half > 0; half /= 2) {
      if (ty < half) *mine = __fadd_rn(*mine, mine[half * width]);
      __syncthreads();
    }
    if (ty == 0 && c < cols) chunk_out[c] = *mine;
    __syncthreads();  // the next tile reuses partial
  }
}

// *count += the number of values whose exponent bits are all ones (Inf or NaN). The bit test
// holds under any floating-point compile flags (isfinite may not under fast-math).
__global__ void __launch_bounds__(kThreads)
    count_nonfinite_kernel(const float* x, int64_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    local += (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u ? 1 : 0;
  }
  // Every thread of the (full) block gets here: the warp adds its counts, lane 0 publishes.
  for (int offset = 16; offset > 0; offset /= 2) {
    local += __shfl_down_sync(0xffffffffu, local, offset);
  }
  if (threadIdx.x % 32 == 0 && local != 0) atomicAdd(count, local);
}

// Rows per chunk of the split form: 1024 rows (4 to 1024 per thread slice, by the width),
// more when that would need more than 65535 chunks (the grid's y limit).
constexpr int64_t kChunkRows = 1024;
constexpr int64_t kMaxChunks = 65535;

int64_t chunk_rows_for(int64_t rows) {
  const int64_t at_least = (rows + kMaxChunks - 1) / kMaxChunks;
  return std::max(kChunkRows, (at_least + kChunkRows - 1) / kChunkRows * kChunkRows);
}

// Launches column_sum_kernel over `chunks` chunks of chunk_rows rows (rows, cols > 0).
void launch_column_sum(const float* dy, float* out, int64_t rows, int64_t cols, int64_t chunk_rows,
                       int64_t chunks, cudaStream_t stream) {
  int width = 1;  // TX: the smallest power of two >= cols, at most 32
  while (width < 32 && width < cols) width *= 2;
  const dim3 block(static_cast<unsigned int>(width), static_cast<unsigned int>(kThreads / width));
  const int64_t tiles = (cols + width - 1) / width;
  const dim3 grid(static_cast<unsigned int>(std::min(tiles, detail::kMaxBlocks)),
                  static_cast<unsigned int>(chunks));
  column_sum_kernel<<<grid, block, 0, stream>>>(dy, out, rows, cols, chunk_rows);
  RINGTRAIN_CHECK_LAUNCH();
}

// The checks and the empty cases both forms share; false when there is nothing to launch.
bool bias_grad_prologue(float* dbias, int64_t rows, int64_t cols, cudaStream_t stream) {
  detail::check_size(rows, "bias_grad rows");
  detail::check_size(cols, "bias_grad cols");
  if (cols == 0) return false;
  if (rows == 0) {  // the sum of no rows: zeros, as the CPU's colwise().sum()
    RINGTRAIN_CHECK_CUDA(
        cudaMemsetAsync(dbias, 0, static_cast<size_t>(cols) * sizeof(float), stream));
    return false;
  }
  RINGTRAIN_CHECK(rows <= INT64_MAX / cols, "gpu::bias_grad: {} x {} values overflow int64", rows,
                  cols);
  return true;
}

}  // namespace

void bias_grad(const float* dy, float* dbias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (!bias_grad_prologue(dbias, rows, cols, stream)) return;
  launch_column_sum(dy, dbias, rows, cols, rows, 1, stream);
}

int64_t bias_grad_workspace_floats(int64_t rows, int64_t cols) {
  detail::check_size(rows, "bias_grad_workspace_floats rows");
  detail::check_size(cols, "bias_grad_workspace_floats cols");
  if (rows <= kChunkRows || cols == 0) return 0;
  const int64_t chunk_rows = chunk_rows_for(rows);
  return (rows + chunk_rows - 1) / chunk_rows * cols;
}

void bias_grad(const float* dy, float* dbias, int64_t rows, int64_t cols, float* workspace,
               int64_t workspace_floats, cudaStream_t stream) {
  const int64_t needed = bias_grad_workspace_floats(rows, cols);
  if (!bias_grad_prologue(dbias, rows, cols, stream)) return;
  if (needed == 0) {  // one chunk: the one-pass form
    launch_column_sum(dy, dbias, rows, cols, rows, 1, stream);
    return;
  }
  RINGTRAIN_CHECK(workspace != nullptr && workspace_floats >= needed,
                  "gpu::bias_grad of [{}, {}] needs a workspace of {} floats, got {}", rows, cols,
                  needed, workspace != nullptr ? workspace_floats : 0);
  const int64_t chunk_rows = chunk_rows_for(rows);
  const int64_t chunks = needed / cols;
  // Pass 1: each chunk's column sums into workspace[chunk, :]; pass 2: the column sums of
  // those, in one pass (chunks <= 65535 rows).
  launch_column_sum(dy, workspace, rows, cols, chunk_rows, chunks, stream);
  launch_column_sum(workspace, dbias, chunks, cols, chunks, 1, stream);
}

void count_nonfinite(const float* x, int64_t n, unsigned long long* count, cudaStream_t stream) {
  detail::check_size(n, "count_nonfinite");
  if (n == 0) return;
  count_nonfinite_kernel<<<detail::blocks_for(n), kThreads, 0, stream>>>(x, n, count);
  RINGTRAIN_CHECK_LAUNCH();
}

}  // namespace ringtrain::gpu
