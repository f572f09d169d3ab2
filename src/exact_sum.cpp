// The exact reduction (see exact_sum.h).
#include "ringtrain/exact_sum.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "ringtrain/check.h"
#include "ringtrain/progress_board.h"

namespace ringtrain {

int exponent_bound(std::span<const float> values) {
  float largest = 0.0f;
  bool nan = false;
  for (const float v : values) {
    const float magnitude = std::fabs(v);
    largest = magnitude > largest ? magnitude : largest;
    nan |= std::isnan(v);
  }
  if (nan || std::isinf(largest)) return kNonFiniteBound;
  if (largest == 0.0f) return kAllZeroBound;
  int exponent = 0;
  (void)std::frexp(largest, &exponent);  // largest = f * 2^exponent, f in [0.5, 1)
  return exponent;
}

int fixed_point_shift(int bound, int64_t terms) {
  RINGTRAIN_CHECK(terms >= 1 && bound != kAllZeroBound && bound != kNonFiniteBound,
                  "fixed_point_shift of {} terms below 2^{}", terms, bound);
  // Each rounded term is at most 2^(62 - headroom) in magnitude, so `terms` of them sum to at
  // most 2^62.
  const int headroom =
      static_cast<int>(std::bit_width(static_cast<uint64_t>(terms - 1)));  // ceil(log2 terms)
  return 62 - headroom - bound;
}

void add_fixed_point(std::span<const float> values, int shift, std::span<int64_t> sums) {
  RINGTRAIN_CHECK(values.size() == sums.size(), "{} values into {} sums", values.size(),
                  sums.size());
  // 2^shift is a double for every shift a float segment gives ([-130, 210]), and a float times
  // a power of two is exact in double: the only rounding is llrint's, to nearest even.
  const double scale = std::ldexp(1.0, shift);
  for (size_t i = 0; i < values.size(); ++i)
    sums[i] += std::llrint(static_cast<double>(values[i]) * scale);
}

void from_fixed_point(std::span<const int64_t> sums, int shift, int64_t divisor,
                      std::span<float> out) {
  RINGTRAIN_CHECK(sums.size() == out.size() && divisor >= 1, "{} sums into {} floats over {}",
                  sums.size(), out.size(), divisor);
  const double unscale = std::ldexp(1.0, -shift);
  const auto d = static_cast<double>(divisor);
  for (size_t i = 0; i < sums.size(); ++i)
    out[i] = static_cast<float>(static_cast<double>(sums[i]) * unscale / d);
}

ExactGradSum::ExactGradSum(Comm& comm, float* grads, std::span<const GradRange> segments,
                           int64_t micro_shards, int64_t local_micro_shards,
                           const RingOptions& ring)
    : comm_(comm),
      grads_(grads),
      micro_shards_(micro_shards),
      local_micro_shards_(local_micro_shards),
      ring_(ring) {
  RINGTRAIN_CHECK(local_micro_shards >= 1 && micro_shards == local_micro_shards * comm.size(),
                  "{} micro-shards cannot be shared as {} on each of {} ranks", micro_shards,
                  local_micro_shards, comm.size());
  segments_.assign(segments.begin(), segments.end());
  std::sort(segments_.begin(), segments_.end(),
            [](const GradRange& a, const GradRange& b) { return a.begin < b.begin; });
  int64_t total = 0;
  for (const GradRange& segment : segments_) {
    RINGTRAIN_CHECK(segment.begin == total && segment.end > segment.begin,
                    "the gradient segments must tile the buffer: [{}, {}) after {}",
                    segment.begin, segment.end, total);
    total = segment.end;
  }
  kept_grads_.assign(static_cast<size_t>(local_micro_shards - 1),
                     std::vector<float>(static_cast<size_t>(total)));
  sums_.assign(static_cast<size_t>(total), 0);
  bounds_.reserve(segments_.size());
  all_bounds_.reserve(segments_.size() * static_cast<size_t>(comm.size()));
  reserve_ring_sum(scratch_, static_cast<size_t>(total), comm.size(), ring_);
}

void ExactGradSum::keep() {
  RINGTRAIN_CHECK(kept_ + 1 < local_micro_shards_,
                  "keep() called for micro-shard {} of {}: the last one stays in the buffer",
                  kept_ + 1, local_micro_shards_);
  std::vector<float>& copy = kept_grads_[static_cast<size_t>(kept_)];
  std::memcpy(copy.data(), grads_, copy.size() * sizeof(float));
  ++kept_;
}

void ExactGradSum::average(int64_t begin, int64_t end) {
  RINGTRAIN_CHECK(kept_ + 1 == local_micro_shards_,
                  "averaging with {} micro-shard(s) kept; this rank computes {}", kept_,
                  local_micro_shards_);
  const auto first = std::lower_bound(
      segments_.begin(), segments_.end(), begin,
      [](const GradRange& segment, int64_t at) { return segment.begin < at; });
  auto last = first;
  while (last != segments_.end() && last->end <= end) ++last;
  RINGTRAIN_CHECK(first != segments_.end() && first->begin == begin && last != first &&
                      std::prev(last)->end == end,
                  "exact average of [{}, {}): not a run of whole gradient segments", begin, end);
  const size_t count = static_cast<size_t>(last - first);

  // Every micro-shard this rank holds: the kept copies, then the buffer.
  const auto values = [&](int64_t shard, const GradRange& segment) {
    const float* base = shard < kept_ ? kept_grads_[static_cast<size_t>(shard)].data() : grads_;
    return std::span<const float>(base + segment.begin,
                                  static_cast<size_t>(segment.end - segment.begin));
  };
  bounds_.assign(count, kAllZeroBound);
  for (size_t s = 0; s < count; ++s)
    for (int64_t shard = 0; shard < local_micro_shards_; ++shard)
      bounds_[s] = std::max(bounds_[s], exponent_bound(values(shard, first[s])));
  all_bounds_.resize(count * static_cast<size_t>(comm_.size()));
  comm_.allgather(bounds_.data(), all_bounds_.data(), count * sizeof(int));
  for (int r = 0; r < comm_.size(); ++r)  // every rank's, this one's included: the job's bound
    for (size_t s = 0; s < count; ++s)
      bounds_[s] = std::max(bounds_[s], all_bounds_[static_cast<size_t>(r) * count + s]);

  std::fill(sums_.begin() + begin, sums_.begin() + end, 0);
  for (size_t s = 0; s < count; ++s) {
    const GradRange& segment = first[s];
    if (bounds_[s] == kAllZeroBound || bounds_[s] == kNonFiniteBound) continue;
    const int shift = fixed_point_shift(bounds_[s], micro_shards_);
    const std::span<int64_t> sums(sums_.data() + segment.begin,
                                  static_cast<size_t>(segment.end - segment.begin));
    for (int64_t shard = 0; shard < local_micro_shards_; ++shard)
      add_fixed_point(values(shard, segment), shift, sums);
  }
  comm_.board().progress();
  ring_allreduce_sum(comm_, sums_.data() + begin, static_cast<size_t>(end - begin), scratch_,
                     ring_);
  for (size_t s = 0; s < count; ++s) {
    const GradRange& segment = first[s];
    const std::span<float> out(grads_ + segment.begin,
                               static_cast<size_t>(segment.end - segment.begin));
    if (bounds_[s] == kAllZeroBound) {
      std::fill(out.begin(), out.end(), 0.0f);
    } else if (bounds_[s] == kNonFiniteBound) {
      std::fill(out.begin(), out.end(), std::nanf(""));
    } else {
      from_fixed_point({sums_.data() + segment.begin, out.size()},
                       fixed_point_shift(bounds_[s], micro_shards_), micro_shards_, out);
    }
  }
}

namespace {

class ExactAllreduce final : public Allreduce {
 public:
  explicit ExactAllreduce(ExactGradSum& sum, const float* grads) : sum_(sum), grads_(grads) {}
  void run(float* data, size_t count, ReduceOp op) override {
    RINGTRAIN_CHECK(op == ReduceOp::kAvg, "the exact reduction averages micro-shards; it was "
                                          "asked to sum");
    const int64_t begin = data - grads_;
    const PhaseScope phase(sum_.comm().board(), "exact gradient sum");
    sum_.average(begin, begin + static_cast<int64_t>(count));
  }
  AllreduceKind kind() const override { return AllreduceKind::kExactRing; }
  int size() const override { return sum_.comm().size(); }

 private:
  ExactGradSum& sum_;
  const float* grads_;
};

}  // namespace

std::unique_ptr<Allreduce> make_exact_allreduce(ExactGradSum& sum) {
  return std::make_unique<ExactAllreduce>(sum, sum.grads());
}

}  // namespace ringtrain
