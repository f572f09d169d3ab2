// GpuContext: one rank's GPU, owned (RAII): the device selected with cudaSetDevice, a compute
// stream on which every layer, the loss and the optimizer run, a communication stream on which
// gradient buckets are averaged (it waits on events recorded on the compute stream, never on
// the host), and the cuBLAS and cuDNN handles bound to the compute stream.
//
// cuBLAS runs in CUBLAS_DEFAULT_MATH: full float32 products, no TF32 tensor-op rounding (which
// would make GPU results differ from the CPU's by ~1e-3 relative instead of ~1e-6), so the
// GPU-equals-CPU tests can use float tolerances. cuBLAS's GEMMs are deterministic run to run
// on one GPU model with one stream per handle, which is how they are used here. The handle
// gets its own workspace (kCublasWorkspaceBytes, once): cuBLAS then never allocates inside a
// step, which a captured CUDA graph requires, and eager and captured steps use the same one.
//
// Only the GPU build defines this class (src/cuda/gpu_context.cpp); the header itself needs no
// CUDA headers, so code that merely passes it around compiles in every build.
#pragma once

#include <memory>
#include <string>

#include "ringtrain/context.h"
#include "ringtrain/progress_board.h"

namespace ringtrain {

class GpuContext {
 public:
  // Selects CUDA device `gpu` for this thread (and the threads that set it from context()).
  explicit GpuContext(int gpu);
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  // device kCuda, the ordinal, both streams and both handles.
  Context& context() { return ctx_; }
  int gpu() const { return ctx_.gpu; }
  // "GPU 0: NVIDIA H200 (sm_90, 139.8 GiB, PCI 0000:1b:00.0)"
  std::string describe() const;
  // Waits for both streams (outside the training step: evaluation, checkpoints, the end).
  void synchronize();

 private:
  Context ctx_;
  void* blas_workspace_ = nullptr;  // device memory given to cuBLAS (see gpu_context.cpp)
};

// Makes `gpu` the current device of the calling thread (the communication thread calls it).
void set_current_gpu(int gpu);

// Waits until `stream` has run everything queued on it. With a progress board the wait polls
// cudaStreamQuery, posted on the board as `what`, so that a stream stuck behind a collective
// whose peer stalled or died is seen by the collective watchdog (a cudaStreamSynchronize would
// block out of its sight, forever); timeout_s > 0 also throws after that long without
// completion. Without a board it is a plain cudaStreamSynchronize.
// (Declared in every build, like the rest of this header; the CPU-only build's stub throws, so
// that code which waits only in a CUDA branch needs no #ifdef.)
void wait_for_stream(StreamHandle stream, ProgressBoard* board, const char* what,
                     double timeout_s = 0);

// The NCCL library loaded at run time, "2.28.3", or "2.28.3 (built with 2.28.9 headers)" when
// the headers differ, for reports (allreduce_bench's preamble); the CPU-only build's stub throws.
std::string nccl_version();

}  // namespace ringtrain
