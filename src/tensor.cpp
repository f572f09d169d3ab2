// Tensor storage: aligned host buffers, cudaMalloc'd device buffers, views, explicit copies.
#include "ringtrain/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ringtrain/check.h"

#ifdef RINGTRAIN_HAVE_GPU
#include "ringtrain/cuda_check.h"
#endif

namespace ringtrain {

Shape::Shape(std::initializer_list<int64_t> dims) {
  RINGTRAIN_CHECK(dims.size() <= kMaxRank, "a shape has at most {} dimensions, got {}", kMaxRank,
                  dims.size());
  for (int64_t d : dims) {
    RINGTRAIN_CHECK(d >= 0, "negative dimension {} in a shape", d);
    dims_[static_cast<size_t>(rank_++)] = d;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return rank_ == 0 ? 0 : n;
}

Shape Shape::with_leading(int64_t leading) const {
  RINGTRAIN_CHECK(rank_ < kMaxRank, "cannot add a batch dimension to {}", str());
  Shape s;
  s.rank_ = rank_ + 1;
  s.dims_[0] = leading;
  for (int i = 0; i < rank_; ++i)
    s.dims_[static_cast<size_t>(i + 1)] = dims_[static_cast<size_t>(i)];
  return s;
}

Shape Shape::without_leading() const {
  RINGTRAIN_CHECK(rank_ >= 2, "shape {} has no per-sample part", str());
  Shape s;
  s.rank_ = rank_ - 1;
  for (int i = 1; i < rank_; ++i)
    s.dims_[static_cast<size_t>(i - 1)] = dims_[static_cast<size_t>(i)];
  return s;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  return std::equal(dims_.begin(), dims_.begin() + rank_, other.dims_.begin());
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return s + "]";
}

namespace {
std::atomic<uint64_t> device_allocation_count{0};
}  // namespace

uint64_t device_allocations() {
  return device_allocation_count.load(std::memory_order_relaxed);
}

void note_device_allocation() {
  device_allocation_count.fetch_add(1, std::memory_order_relaxed);
}

namespace {
std::shared_ptr<float> allocate_aligned(int64_t count) {
  constexpr size_t kAlign = 64;
  size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float);
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
  RINGTRAIN_CHECK(p != nullptr, "out of memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  return std::shared_ptr<float>(p, [](float* q) { std::free(q); });
}

[[noreturn]] void no_gpu_path(const char* what) {
  RINGTRAIN_FAIL(
      "{} needs the GPU path, which this build lacks (configured without CUDA, cuDNN "
      "or NCCL): use --device cpu",
      what);
}

// Zero-filled device memory on the current device (cudaSetDevice: GpuContext). cudaMalloc
// returns 256-byte aligned pointers. cudaMemset runs on the legacy default stream, which does
// not order with our non-blocking streams, so the device is synchronised after it: a kernel
// queued next on the compute stream must not race the zeroing. Allocations happen before the
// first step finishes, never inside a steady-state step.
std::shared_ptr<float> allocate_device(int64_t count) {
#ifdef RINGTRAIN_HAVE_GPU
  note_device_allocation();
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    RINGTRAIN_FAIL("out of GPU memory allocating {} bytes: {}", bytes, cudaGetErrorString(status));
  }
  RINGTRAIN_CHECK_CUDA(cudaMemset(p, 0, bytes));
  RINGTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
  // cudaFree in a deleter must not throw; a failure here means the context is already gone.
  return std::shared_ptr<float>(static_cast<float*>(p), [](float* q) { (void)cudaFree(q); });
#else
  (void)count;
  no_gpu_path("a CUDA tensor");
#endif
}
}  // namespace

Tensor::Tensor(const Shape& shape, Device device) : device_(device) {
  resize(shape);
}

Tensor Tensor::view(float* data, const Shape& shape, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.data_ = data;
  t.device_ = device;
  t.capacity_ = shape.numel();
  return t;
}

void Tensor::resize(const Shape& shape) {
  if (is_view()) {
    RINGTRAIN_CHECK(shape.numel() == shape_.numel(), "cannot resize a view from {} to {}",
                    shape_.str(), shape.str());
    shape_ = shape;
    return;
  }
  if (shape.numel() > capacity_) {
    storage_.reset();  // free first: the peak is the new size, not old + new
    data_ = nullptr;
    capacity_ = 0;
    storage_ =
        device_ == Device::kCuda ? allocate_device(shape.numel()) : allocate_aligned(shape.numel());
    data_ = storage_.get();
    capacity_ = shape.numel();
  }
  shape_ = shape;
}

Tensor Tensor::reshaped(const Shape& shape) const {
  RINGTRAIN_CHECK(shape.numel() == numel(), "cannot reshape {} to {}", shape_.str(), shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

void Tensor::fill(float value) {
  if (device_ == Device::kCpu) {
    std::fill(data_, data_ + numel(), value);
    return;
  }
#ifdef RINGTRAIN_HAVE_GPU
  if (value == 0.0f && !std::signbit(value)) {
    RINGTRAIN_CHECK_CUDA(cudaDeviceSynchronize());  // as copy_floats: ordered with all streams
    RINGTRAIN_CHECK_CUDA(cudaMemset(data_, 0, static_cast<size_t>(numel()) * sizeof(float)));
    RINGTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
    return;
  }
#endif
  const std::vector<float> host(static_cast<size_t>(numel()), value);
  copy_from_host(host);
}

void Tensor::copy_from_host(std::span<const float> host) {
  RINGTRAIN_CHECK(static_cast<int64_t>(host.size()) == numel(),
                  "copy_from_host: {} values for a tensor of {} ({})", host.size(), numel(),
                  shape_.str());
  copy_floats(data_, device_, host.data(), Device::kCpu, numel());
}

void Tensor::copy_to_host(std::span<float> host) const {
  RINGTRAIN_CHECK(static_cast<int64_t>(host.size()) == numel(),
                  "copy_to_host: room for {} values, the tensor holds {} ({})", host.size(),
                  numel(), shape_.str());
  copy_floats(host.data(), Device::kCpu, data_, device_, numel());
}

std::vector<float> Tensor::to_host() const {
  std::vector<float> host(static_cast<size_t>(numel()));
  copy_to_host(host);
  return host;
}

namespace {
// The part of every copy that needs no GPU: checks n, and copies nothing (n == 0) or host to
// host (memcpy). Returns whether the copy is done.
bool copied_without_device(float* dst, Device dst_device, const float* src, Device src_device,
                           int64_t n) {
  RINGTRAIN_CHECK(n >= 0, "copy of {} floats", n);
  if (n == 0) return true;
  if (dst_device != Device::kCpu || src_device != Device::kCpu) return false;
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  return true;
}
}  // namespace

void copy_floats(float* dst, Device dst_device, const float* src, Device src_device, int64_t n) {
  if (copied_without_device(dst, dst_device, src, src_device, n)) return;
#ifdef RINGTRAIN_HAVE_GPU
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  // cudaMemcpy runs on the legacy default stream, which does not order with the non-blocking
  // compute and communication streams; and from pageable memory it may return before its DMA
  // has landed. So: every queued kernel first (a read sees final values, a write cannot race
  // a kernel still using the buffer), and the copy complete before anything is queued after.
  // These copies are for set-up, checkpoints and checks, never the step's hot path.
  RINGTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
  RINGTRAIN_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  RINGTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
#else
  no_gpu_path("a copy to or from the GPU");
#endif
}

void copy_floats_async(float* dst, Device dst_device, const float* src, Device src_device,
                       int64_t n, StreamHandle stream) {
  if (copied_without_device(dst, dst_device, src, src_device, n)) return;
#ifdef RINGTRAIN_HAVE_GPU
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  RINGTRAIN_CHECK_CUDA(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
  no_gpu_path("a copy to or from the GPU");
#endif
}

}  // namespace ringtrain
