// GpuContext (gpu_context.h): device selection, the two streams, the cuBLAS and cuDNN handles.
#include "ringtrain/gpu_context.h"

#include "cudnn_layers.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "ringtrain/comm.h"
#include "ringtrain/cuda_check.h"

namespace ringtrain {

namespace {
// cuBLAS's guide recommends 32 MiB of workspace on Hopper (its own default pool there); less
// can make it choose other (slower) GEMM kernels.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
}  // namespace

void set_current_gpu(int gpu) {
  RINGTRAIN_CHECK_CUDA(cudaSetDevice(gpu));
}

GpuContext::GpuContext(int gpu) {
  int count = 0;
  RINGTRAIN_CHECK_CUDA(cudaGetDeviceCount(&count));
  RINGTRAIN_CHECK(gpu >= 0 && gpu < count, "GPU {} does not exist: {} visible", gpu, count);
  set_current_gpu(gpu);
  ctx_.device = Device::kCuda;
  ctx_.gpu = gpu;
  // Build in steps and free what was made if a later step throws.
  cudaStream_t compute = nullptr, comm = nullptr;
  cublasHandle_t blas = nullptr;
  cudnnHandle_t dnn = nullptr;
  void* blas_workspace = nullptr;
  try {
    // Non-blocking: neither stream synchronises with the legacy default stream, so a stray
    // default-stream call elsewhere cannot serialise compute and communication.
    RINGTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    RINGTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
    RINGTRAIN_CHECK_CUBLAS(cublasCreate(&blas));
    RINGTRAIN_CHECK_CUBLAS(cublasSetStream(blas, compute));
    // Full float32 arithmetic (no TF32): see the header.
    RINGTRAIN_CHECK_CUBLAS(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
    RINGTRAIN_CHECK_CUBLAS(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST));
    // After cublasSetStream, which resets the workspace to cuBLAS's pool.
    RINGTRAIN_CHECK_CUDA(cudaMalloc(&blas_workspace, kCublasWorkspaceBytes));
    RINGTRAIN_CHECK_CUBLAS(cublasSetWorkspace(blas, blas_workspace, kCublasWorkspaceBytes));
    RINGTRAIN_CHECK_CUDNN(cudnnCreate(&dnn));
    RINGTRAIN_CHECK_CUDNN(cudnnSetStream(dnn, compute));
  } catch (...) {
    if (dnn != nullptr) (void)cudnnDestroy(dnn);
    if (blas != nullptr) (void)cublasDestroy(blas);
    if (blas_workspace != nullptr) (void)cudaFree(blas_workspace);
    if (comm != nullptr) (void)cudaStreamDestroy(comm);
    if (compute != nullptr) (void)cudaStreamDestroy(compute);
    throw;
  }
  ctx_.stream = compute;
  ctx_.comm_stream = comm;
  ctx_.blas = blas;
  ctx_.dnn = dnn;
  blas_workspace_ = blas_workspace;
}

GpuContext::~GpuContext() {
  // Destructors must not throw: errors here mean the device is already lost.
  (void)cudaSetDevice(ctx_.gpu);
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream));
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.comm_stream));
  // The cuDNN conv path's cached plans belong to this handle: free them first (they would
  // otherwise outlive it, held until the process ends).
  try {
    cudnn_layers::release_plans(ctx_.dnn);
  } catch (...) {  // a destructor must not throw; the device is already lost
  }
  (void)cudnnDestroy(static_cast<cudnnHandle_t>(ctx_.dnn));
  (void)cublasDestroy(static_cast<cublasHandle_t>(ctx_.blas));
  (void)cudaFree(blas_workspace_);
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(ctx_.comm_stream));
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(ctx_.stream));
}

std::string GpuContext::describe() const {
  cudaDeviceProp prop{};
  RINGTRAIN_CHECK_CUDA(cudaGetDeviceProperties(&prop, ctx_.gpu));
  char pci[32] = {};
  if (cudaDeviceGetPCIBusId(pci, sizeof(pci), ctx_.gpu) != cudaSuccess) {
    (void)cudaGetLastError();
    pci[0] = '?';
  }
  return fmt::format("GPU {}: {} (sm_{}{}, {:.1f} GiB, PCI {}), cuDNN {}", ctx_.gpu, prop.name,
                     prop.major, prop.minor,
                     static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), pci,
                     cudnnGetVersion());
}

void GpuContext::synchronize() {
  RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream)));
  RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.comm_stream)));
}

void wait_for_stream(StreamHandle stream_handle, ProgressBoard* board, const char* what,
                     double timeout_s) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  if (board == nullptr) {
    RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    return;
  }
  const WaitScope post(*board, what, -1);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) RINGTRAIN_CHECK_CUDA(status);
    const auto waited = Clock::now() - start;
    RINGTRAIN_CHECK(timeout_s <= 0 || waited < std::chrono::duration<double>(timeout_s),
                    "{} made no progress for {:g} s (the stream is stuck behind earlier work)",
                    what, timeout_s);
    // Spin briefly (the stream's tail is usually microseconds away), then yield the core.
    if (waited >= std::chrono::microseconds(200))
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace ringtrain
