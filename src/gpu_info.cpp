// gpu_build() and visible_gpus() (gpu.h): the one place outside src/cuda/ that asks CUDA
// anything, so the CPU-only build compiles it without CUDA headers.
#include "ringtrain/gpu.h"

#ifdef RINGTRAIN_HAVE_GPU
#include <cuda_runtime.h>
#endif

namespace ringtrain {

bool gpu_build() {
#ifdef RINGTRAIN_HAVE_GPU
  return true;
#else
  return false;
#endif
}

int visible_gpus(std::string* why) {
#ifdef RINGTRAIN_HAVE_GPU
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // Reset the sticky error so a later call in this process starts clean.
    (void)cudaGetLastError();
    if (why != nullptr) *why = cudaGetErrorString(status);
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device is visible";
  return count;
#else
  if (why != nullptr) *why = "this build has no GPU path (configured without CUDA, cuDNN or NCCL)";
  return 0;
#endif
}

}  // namespace ringtrain
