// DeviceBuffer<T>: n values of T in cudaMalloc'd device memory, freed by the destructor, for
// the GPU tests. Move-only. upload() and download() copy synchronously: download() waits for
// the work queued on `stream` (the legacy default stream when none is given, which also waits
// for the other blocking streams) before it copies, so a test can launch and read back
// without its own synchronize. Zero values allocate nothing (data() is null).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"

namespace ringtrain::test {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) RINGTRAIN_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()));
  }
  // A buffer holding a copy of `values`.
  explicit DeviceBuffer(std::span<const T> values) : DeviceBuffer(values.size()) { upload(values); }
  explicit DeviceBuffer(const std::vector<T>& values)
      : DeviceBuffer(std::span<const T>(values.data(), values.size())) {}
  ~DeviceBuffer() {
    if (data_ != nullptr) (void)cudaFree(data_);  // a destructor must not throw
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), n_(std::exchange(other.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      if (data_ != nullptr) (void)cudaFree(data_);
      data_ = std::exchange(other.data_, nullptr);
      n_ = std::exchange(other.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  // Host -> device: values.size() must equal size().
  void upload(std::span<const T> values) {
    RINGTRAIN_CHECK(values.size() == n_, "DeviceBuffer::upload: {} values into a buffer of {}",
                    values.size(), n_);
    if (n_ > 0) {
      RINGTRAIN_CHECK_CUDA(cudaMemcpy(data_, values.data(), bytes(), cudaMemcpyHostToDevice));
    }
  }
  void upload(const std::vector<T>& values) {
    upload(std::span<const T>(values.data(), values.size()));
  }
  // Every byte set to `byte` (cudaMemset), e.g. 0xff to poison a buffer before a kernel
  // that must overwrite it.
  void fill_bytes(int byte) {
    if (n_ > 0) RINGTRAIN_CHECK_CUDA(cudaMemset(data_, byte, bytes()));
  }

  // Device -> host after the work queued on `stream` is done.
  std::vector<T> download(cudaStream_t stream = nullptr) const {
    return download_range(0, n_, stream);
  }
  // Values [offset, offset + count) only (large buffers: read back just what is checked).
  std::vector<T> download_range(size_t offset, size_t count, cudaStream_t stream = nullptr) const {
    RINGTRAIN_CHECK(offset <= n_ && count <= n_ - offset,
                    "DeviceBuffer::download_range: [{}, +{}) outside a buffer of {}", offset, count,
                    n_);
    RINGTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<T> values(count);
    if (count > 0) {
      RINGTRAIN_CHECK_CUDA(
          cudaMemcpy(values.data(), data_ + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return values;
  }

 private:
  T* data_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ringtrain::test
