// What this process can do with GPUs, in every build: the CPU-only build answers "none" with
// the reason, so callers (--device, the GPU tests' skip) need no #ifdef.
#pragma once

#include <string>

namespace ringtrain {

// True when this binary was built with the GPU path (CUDA, cuBLAS, cuDNN, NCCL).
bool gpu_build();

// The number of CUDA devices this process can use; 0 in a CPU-only build or when none is
// visible (no driver, no device, CUDA_VISIBLE_DEVICES empty), with the reason in *why.
int visible_gpus(std::string* why = nullptr);

}  // namespace ringtrain
