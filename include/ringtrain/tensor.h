// Tensor: a float32 array with a shape (up to 4 dims, row-major) and a device. It either owns
// its storage (64-byte aligned host memory, so Eigen and AVX-512 loads are aligned; or
// cudaMalloc'd device memory for Device::kCuda) or is a view into storage owned elsewhere, such
// as a layer's slice of the model's flat parameter buffer. resize() reuses the existing
// allocation whenever it is large enough, which is what lets the training step run without
// allocating after its first call.
//
// Device memory is never touched from the host: data() of a CUDA tensor is a device pointer
// (operator[] on it would fault). Host <-> device transfers happen only where a caller asks
// for them: copy_from_host / copy_to_host / to_host, or copy_floats.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/context.h"

namespace ringtrain {

// A fixed-capacity shape: copying or assigning it never allocates.
class Shape {
 public:
  static constexpr int kMaxRank = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  // The same shape with `leading` prepended (a batch dimension in front of a sample shape).
  Shape with_leading(int64_t leading) const;
  // The shape without its first dimension (the per-sample shape of a batch).
  Shape without_leading() const;
  bool operator==(const Shape& other) const;
  std::string str() const;  // "[128, 28, 28, 1]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // An empty owning tensor on `device`: resize() allocates there.
  explicit Tensor(Device device) : device_(device) {}
  // An owning, zero-filled tensor (host or device memory).
  explicit Tensor(const Shape& shape, Device device = Device::kCpu);
  // A view: storage is owned by someone else and must outlive the view.
  static Tensor view(float* data, const Shape& shape, Device device = Device::kCpu);

  // Owning tensors reallocate only when the new shape needs more room than they have;
  // views may only be reshaped to the same element count.
  void resize(const Shape& shape);
  // A view of the same storage with another shape of the same element count.
  Tensor reshaped(const Shape& shape) const;
  // Host tensors: a loop. Device tensors: a device-synchronising cudaMemset / upload (not for
  // the training step's hot path).
  void fill(float value);
  // Explicit, synchronous copies of the whole tensor (numel() values) from / to host memory;
  // a plain copy for host tensors.
  void copy_from_host(std::span<const float> host);
  void copy_to_host(std::span<float> host) const;
  std::vector<float> to_host() const;

  float* data() { return data_; }
  const float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  Device device() const { return device_; }
  bool is_view() const { return storage_ == nullptr && data_ != nullptr; }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }

 private:
  Shape shape_;
  float* data_ = nullptr;
  std::shared_ptr<float> storage_;  // null for views
  int64_t capacity_ = 0;            // elements allocated in storage_
  Device device_ = Device::kCpu;
};

// Copies n floats between any two places (host or device), synchronously: memcpy host to host;
// otherwise the device is synchronised (all streams), copied, and synchronised again, so the
// copy sees every queued kernel's result and is complete before anything queued after it.
void copy_floats(float* dst, Device dst_device, const float* src, Device src_device, int64_t n);
// The same, queued on a CUDA stream without waiting; host to host is a memcpy.
// Pageable host memory makes the call wait until the host buffer has been staged.
void copy_floats_async(float* dst, Device dst_device, const float* src, Device src_device,
                       int64_t n, StreamHandle stream);

// How many device allocations have been made in this process so far: Tensor's, and those of
// other device caches that call note_device_allocation(). A captured CUDA graph holds raw
// pointers, so it is valid only while this count is what it was when the graph was captured
// (the device step's graphs check it). Always 0 in the CPU-only build.
uint64_t device_allocations();
void note_device_allocation();

}  // namespace ringtrain
