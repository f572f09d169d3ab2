// Context: where math runs. On the CPU that is N Eigen threads; on a GPU it is one device's
// compute stream with its cuBLAS and cuDNN handles (owned by a GpuContext, gpu_context.h), plus
// the communication stream on which gradient buckets are averaged. Every layer takes a Context
// and never reaches for a global; layers dispatch on ctx.device.
#pragma once

#include <string>

#include "ringtrain/cuda_handles.h"

namespace ringtrain {

enum class Device { kCpu, kCuda };
const char* to_string(Device device);  // "cpu", "cuda"

// How a GPU context runs Conv2D 3x3 and MaxPool2D 2x2 (--conv-impl): the direct kernels of
// kernels/conv.h, or cuDNN (src/cuda/cudnn_layers.cpp). The CPU ignores it.
enum class ConvImpl { kDirect, kCudnn };
const char* to_string(ConvImpl impl);  // "direct", "cudnn"
// "direct" or "cudnn"; anything else throws, naming --conv-impl and the accepted values.
ConvImpl parse_conv_impl(const std::string& flag);

struct Context {
  Device device = Device::kCpu;
  int threads = 1;  // CPU math threads (Eigen); 1 keeps runs bit-reproducible anywhere
  int gpu = -1;     // the CUDA device ordinal when device == kCuda
  StreamHandle stream = nullptr;       // the compute stream when device == kCuda
  StreamHandle comm_stream = nullptr;  // the communication stream when device == kCuda
  BlasHandle blas = nullptr;           // cuBLAS, bound to `stream`, when device == kCuda
  DnnHandle dnn = nullptr;             // cuDNN, bound to `stream`, when device == kCuda
  // Conv2D/MaxPool2D on the GPU. Direct is the default because it reproduces the CPU: the
  // pooling gradient goes to the first of tied maxima (cuDNN does not document which one it
  // picks) and the convolutions sum in the CPU's order; whether cuDNN is faster on the cnn's
  // shapes has not been measured.
  ConvImpl conv_impl = ConvImpl::kDirect;
};

// Applies ctx.threads to the CPU math libraries (Eigen's GEMM).
void set_cpu_threads(int threads);
// Makes Eigen's GEMM block its products the same way on every CPU (from fixed cache sizes
// instead of the ones the CPU reports), so that one binary sums in the same order, and gives
// the same bits, on any x86-64 machine that runs it (--reproducible).
void fix_cpu_gemm_blocking();

// What --device resolves to for one rank.
struct DeviceChoice {
  Device device = Device::kCpu;
  int gpu = -1;     // CUDA ordinal (local_rank modulo the visible GPUs) when device == kCuda
  std::string why;  // one line for the log: what was asked, what was found, what was chosen
};
// flag: "cpu", "cuda" or "auto" (cuda when this build has the GPU path and a GPU is visible,
// else cpu). A rank uses the GPU given by its local rank; more local ranks than GPUs share
// them round-robin (said in `why`). "cuda" without a usable GPU throws, naming the flag and
// the reason. Works in every build (the CPU-only build answers cpu, or refuses cuda).
DeviceChoice choose_device(const std::string& flag, int local_rank, int local_size);

}  // namespace ringtrain
