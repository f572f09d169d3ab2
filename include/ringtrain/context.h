// Context: where math runs. Today that is the CPU with N Eigen threads; the CUDA issue fills
// in the stream and library handles, so every layer already takes a Context and never
// reaches for a global.
#pragma once

namespace ringtrain {

enum class Device { kCpu, kCuda };

struct Context {
  Device device = Device::kCpu;
  int threads = 1;         // CPU math threads (Eigen); 1 keeps runs bit-reproducible anywhere
  void* stream = nullptr;  // cudaStream_t of the compute stream when device == kCuda
  void* blas = nullptr;    // cublasHandle_t when device == kCuda
  void* dnn = nullptr;     // cudnnHandle_t when device == kCuda
};

// Applies ctx.threads to the CPU math libraries (Eigen's GEMM).
void set_cpu_threads(int threads);

}  // namespace ringtrain
