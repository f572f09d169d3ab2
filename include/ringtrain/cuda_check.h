// Checks for CUDA, cuBLAS, cuDNN and NCCL calls (GPU build only): a failed call throws
// ringtrain::Error with [file:line], the call and the library's own message, like
// RINGTRAIN_CHECK_MPI. Kernel launches are checked with RINGTRAIN_CHECK_LAUNCH() right after
// the <<<>>> (cudaGetLastError), so a bad configuration is reported where it happened.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "ringtrain/check.h"

namespace ringtrain::detail {
const char* cublas_status_name(cublasStatus_t status);
}  // namespace ringtrain::detail

#define RINGTRAIN_CHECK_CUDA(call)                                                            \
  do {                                                                                        \
    const cudaError_t ringtrain_cuda_status_ = (call);                                        \
    if (ringtrain_cuda_status_ != cudaSuccess) [[unlikely]]                                   \
      ::ringtrain::detail::throw_error(                                                       \
          __FILE__, __LINE__,                                                                 \
          ::fmt::format("{} failed: {}", #call, cudaGetErrorString(ringtrain_cuda_status_))); \
  } while (0)

#define RINGTRAIN_CHECK_LAUNCH() RINGTRAIN_CHECK_CUDA(cudaGetLastError())

#define RINGTRAIN_CHECK_CUBLAS(call)                                                         \
  do {                                                                                       \
    const cublasStatus_t ringtrain_cublas_status_ = (call);                                  \
    if (ringtrain_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                      \
      ::ringtrain::detail::throw_error(                                                      \
          __FILE__, __LINE__,                                                                \
          ::fmt::format("{} failed: {}", #call,                                              \
                        ::ringtrain::detail::cublas_status_name(ringtrain_cublas_status_))); \
  } while (0)

#define RINGTRAIN_CHECK_CUDNN(call)                                                             \
  do {                                                                                          \
    const cudnnStatus_t ringtrain_cudnn_status_ = (call);                                       \
    if (ringtrain_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                           \
      ::ringtrain::detail::throw_error(                                                         \
          __FILE__, __LINE__,                                                                   \
          ::fmt::format("{} failed: {}", #call, cudnnGetErrorString(ringtrain_cudnn_status_))); \
  } while (0)

#define RINGTRAIN_CHECK_NCCL(call)                                                               \
  do {                                                                                           \
    const ncclResult_t ringtrain_nccl_status_ = (call);                                          \
    if (ringtrain_nccl_status_ != ncclSuccess) [[unlikely]]                                      \
      ::ringtrain::detail::throw_error(                                                          \
          __FILE__, __LINE__,                                                                    \
          ::fmt::format("{} failed: {} ({})", #call, ncclGetErrorString(ringtrain_nccl_status_), \
                        ncclGetLastError(nullptr)));                                             \
  } while (0)
