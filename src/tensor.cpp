// Tensor storage: aligned owning buffers and views.
#include "ringtrain/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ringtrain/check.h"

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
std::shared_ptr<float> allocate_aligned(int64_t count) {
  constexpr size_t kAlign = 64;
  size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float);
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
  RINGTRAIN_CHECK(p != nullptr, "out of memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  return std::shared_ptr<float>(p, [](float* q) { std::free(q); });
}
}  // namespace

Tensor::Tensor(const Shape& shape, Device device) : device_(device) {
  RINGTRAIN_CHECK(device == Device::kCpu, "CUDA tensors arrive with the CUDA issue");
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
    storage_ = allocate_aligned(shape.numel());
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
  std::fill(data_, data_ + numel(), value);
}

}  // namespace ringtrain
