// The exact reduction (see exact_sum.h).
#include "ringtrain/exact_sum.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "ringtrain/check.h"
#include "ringtrain/dense_terms.h"
#include "ringtrain/progress_board.h"

namespace ringtrain {

int exponent_bound(std::span<const float> values) {
  // On the magnitudes' bit patterns: a non-negative float orders as its bits do, and an
  // integer max vectorises where a float max with NaN checks does not.
  uint32_t largest = 0;
  for (const float v : values)
    largest = std::max(largest, std::bit_cast<uint32_t>(v) & 0x7fffffffu);
  if (largest >= 0x7f800000u) return kNonFiniteBound;  // an infinity, or a NaN
  if (largest == 0) return kAllZeroBound;
  int exponent = 0;
  (void)std::frexp(std::bit_cast<float>(largest), &exponent);  // = f * 2^exponent, f in [0.5, 1)
  return exponent;
}

namespace {

constexpr double kRoundingMagic = 0x1.8p52;  // see fixed_point_term
constexpr int kTermBits = 50;  // |term| and |sum| stay within 2^50: the trick's exact range

}  // namespace

int fixed_point_shift(int bound, int64_t terms) {
  RINGTRAIN_CHECK(terms >= 1 && bound != kAllZeroBound && bound != kNonFiniteBound,
                  "fixed_point_shift of {} terms below 2^{}", terms, bound);
  // Each rounded term is at most 2^(kTermBits - headroom) in magnitude, so `terms` of them sum
  // to at most 2^kTermBits.
  const int headroom =
      static_cast<int>(std::bit_width(static_cast<uint64_t>(terms - 1)));  // ceil(log2 terms)
  return kTermBits - headroom - bound;
}

namespace {

// sums[i] (+)= round-to-nearest-even(values[i] * 2^shift): kAdd accumulates, else assigns
// (what adding into zeros gives, without writing the zeros first).
enum class Into { kAdd, kAssign };
template <Into into>
void to_fixed_point(std::span<const float> values, int shift, std::span<int64_t> sums) {
  RINGTRAIN_CHECK(values.size() == sums.size(), "{} values into {} sums", values.size(),
                  sums.size());
  // 2^shift is a double for every shift a float segment gives, and a float times a power of
  // two is exact in double: the only rounding is the magic addition's, to nearest even.
  const double scale = std::ldexp(1.0, shift);
  const float* __restrict in = values.data();
  int64_t* __restrict out = sums.data();
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t term = fixed_point_term(in[i], scale);
    if constexpr (into == Into::kAdd) {
      out[i] += term;
    } else {
      out[i] = term;
    }
  }
}

}  // namespace

void add_fixed_point(std::span<const float> values, int shift, std::span<int64_t> sums) {
  to_fixed_point<Into::kAdd>(values, shift, sums);
}

void from_fixed_point(std::span<const int64_t> sums, int shift, int64_t divisor,
                      std::span<float> out) {
  RINGTRAIN_CHECK(sums.size() == out.size() && divisor >= 1, "{} sums into {} floats over {}",
                  sums.size(), out.size(), divisor);
  // One multiplication by 2^-shift / divisor (1 / divisor rounded once, in double, the power
  // of two exact): a division per element was a twentieth of a --reproducible MLP step.
  const double factor = std::ldexp(1.0 / static_cast<double>(divisor), -shift);
  const int64_t magic_bits = std::bit_cast<int64_t>(kRoundingMagic);
  const int64_t* __restrict in = sums.data();
  float* __restrict result = out.data();
  for (size_t i = 0; i < sums.size(); ++i) {
    const double sum = std::bit_cast<double>(in[i] + magic_bits) - kRoundingMagic;  // exact
    result[i] = static_cast<float>(sum * factor);
  }
}

std::vector<GradRange> segments_in_buffer_order(std::span<const GradRange> segments) {
  std::vector<GradRange> sorted(segments.begin(), segments.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const GradRange& a, const GradRange& b) { return a.begin < b.begin; });
  return sorted;
}

ExactGradSum::ExactGradSum(Comm& comm, float* grads, std::span<const GradRange> segments,
                           int64_t micro_shards, int64_t local_micro_shards,
                           const RingOptions& ring, std::unique_ptr<DenseShardTerms> dense)
    : comm_(comm),
      grads_(grads),
      micro_shards_(micro_shards),
      local_micro_shards_(local_micro_shards),
      ring_(ring),
      dense_(std::move(dense)) {
  RINGTRAIN_CHECK(local_micro_shards >= 1 && micro_shards == local_micro_shards * comm.size(),
                  "{} micro-shards cannot be shared as {} on each of {} ranks", micro_shards,
                  local_micro_shards, comm.size());
  segments_ = segments_in_buffer_order(segments);
  int64_t total = 0;
  for (const GradRange& segment : segments_) {
    RINGTRAIN_CHECK(segment.begin == total && segment.end > segment.begin,
                    "the gradient segments must tile the buffer: [{}, {}) after {}", segment.begin,
                    segment.end, total);
    total = segment.end;
  }
  RINGTRAIN_CHECK(dense_ == nullptr || dense_->local_micro_shards() == local_micro_shards,
                  "dense terms of {} micro-shards for a rank of {}",
                  dense_ != nullptr ? dense_->local_micro_shards() : 0, local_micro_shards);
  if (dense_ != nullptr) block_sums_.resize(static_cast<size_t>(dense_->largest_block()));
  if (dense_ == nullptr) {
    kept_grads_.reserve(static_cast<size_t>(local_micro_shards - 1));
    for (int64_t k = 0; k + 1 < local_micro_shards; ++k) kept_grads_.emplace_back(Shape{total});
  }
  sums_.assign(static_cast<size_t>(total), 0);
  bounds_.reserve(segments_.size());
  all_bounds_.reserve(segments_.size() * static_cast<size_t>(comm.size()));
  shard_bounds_.assign(segments_.size() * static_cast<size_t>(local_micro_shards), kAllZeroBound);
  shard_bound_known_.assign(shard_bounds_.size(), 0);
  // One rank moves nothing: its ring only converts (ring_allreduce_exact).
  if (comm.size() > 1) reserve_ring_exact(scratch_, static_cast<size_t>(total), comm.size(), ring_);
}

ExactGradSum::~ExactGradSum() = default;

int64_t ExactGradSum::kept_bytes() const {
  return dense_ != nullptr
             ? dense_->kept_bytes()
             : static_cast<int64_t>(kept_grads_.size() * sums_.size() * sizeof(float));
}

float* ExactGradSum::shard_buffer(int64_t shard) {
  RINGTRAIN_CHECK(dense_ == nullptr && 0 <= shard && shard < local_micro_shards_,
                  "micro-shard {} of {}{}", shard, local_micro_shards_,
                  dense_ != nullptr ? ": the dense layers' rows are kept instead" : "");
  return shard + 1 < local_micro_shards_ ? kept_grads_[static_cast<size_t>(shard)].data() : grads_;
}

void ExactGradSum::kept_in_place() {
  RINGTRAIN_CHECK(dense_ == nullptr && kept_ + 1 < local_micro_shards_,
                  "kept_in_place() called for micro-shard {} of {}: the last one stays in the "
                  "buffer",
                  kept_ + 1, local_micro_shards_);
  ++kept_;
}

void ExactGradSum::note_written(int64_t shard, int64_t begin, int64_t end) {
  // The last micro-shard lives in the model's buffer, which average() overwrites: its bounds
  // are read when its segments are averaged.
  RINGTRAIN_CHECK(dense_ == nullptr && 0 <= shard && shard + 1 < local_micro_shards_ &&
                      0 <= begin && begin <= end && end <= static_cast<int64_t>(sums_.size()),
                  "note_written of kept micro-shard {} of {}, [{}, {})", shard, local_micro_shards_,
                  begin, end);
  const float* base = shard_buffer(shard);
  auto it =
      std::lower_bound(segments_.begin(), segments_.end(), begin,
                       [](const GradRange& segment, int64_t at) { return segment.begin < at; });
  for (; it != segments_.end() && it->end <= end; ++it) {
    const auto at =
        static_cast<size_t>(shard) * segments_.size() + static_cast<size_t>(it - segments_.begin());
    shard_bounds_[at] =
        exponent_bound({base + it->begin, static_cast<size_t>(it->end - it->begin)});
    shard_bound_known_[at] = 1;
  }
}

void ExactGradSum::begin_step() {
  std::fill(shard_bound_known_.begin(), shard_bound_known_.end(), 0);
  kept_ = 0;
  averaged_ = 0;
}

void ExactGradSum::finish_step() const {
  RINGTRAIN_CHECK(averaged_ == static_cast<int64_t>(sums_.size()),
                  "the step averaged {} of the {} gradients exactly: the GradSync must run the "
                  "exact sum's Allreduce (make_exact_allreduce)",
                  averaged_, sums_.size());
}

std::span<const float> ExactGradSum::values(int64_t shard, const GradRange& segment) const {
  const float* base = shard < kept_ ? kept_grads_[static_cast<size_t>(shard)].data() : grads_;
  return {base + segment.begin, static_cast<size_t>(segment.end - segment.begin)};
}

int64_t ExactGradSum::agree(size_t first, size_t count) {
  RINGTRAIN_CHECK(dense_ != nullptr || kept_ + 1 == local_micro_shards_,
                  "averaging with {} micro-shard(s) kept; this rank computes {}", kept_,
                  local_micro_shards_);
  bounds_first_ = first;
  bounds_.resize(count);
  // This rank's bound of each segment, over its micro-shards: read here, when the segment is
  // final in every one of them.
  for (size_t s = 0; s < count; ++s) {
    if (dense_ != nullptr) {
      bounds_[s] = dense_->bound(segments_[first + s].begin, segments_[first + s].end);
      continue;
    }
    bounds_[s] = kAllZeroBound;
    for (int64_t shard = 0; shard < local_micro_shards_; ++shard) {
      const size_t at = static_cast<size_t>(shard) * segments_.size() + first + s;
      bounds_[s] = std::max(bounds_[s], shard_bound_known_[at] != 0
                                            ? shard_bounds_[at]
                                            : exponent_bound(values(shard, segments_[first + s])));
    }
  }
  all_bounds_.resize(count * static_cast<size_t>(comm_.size()));
  comm_.allgather(bounds_.data(), all_bounds_.data(), count * sizeof(int));
  for (int r = 0; r < comm_.size(); ++r)  // every rank's, this one's included: the job's bound
    for (size_t s = 0; s < count; ++s)
      bounds_[s] = std::max(bounds_[s], all_bounds_[static_cast<size_t>(r) * count + s]);
  // Counted as a ring allgather would send them: N - 1 ints per segment.
  return static_cast<int64_t>(count * sizeof(int)) * (comm_.size() - 1);
}

void ExactGradSum::fixed_point_terms(size_t segment, int64_t at, size_t n, const int64_t* received,
                                     int64_t* out) const {
  const int bound = bounds_[segment - bounds_first_];
  if (bound == kAllZeroBound || bound == kNonFiniteBound) {
    // Zeros (a NaN segment's result is NaN whatever its sums hold).
    if (received != nullptr) {
      std::copy(received, received + n, out);
    } else {
      std::fill(out, out + n, 0);
    }
    return;
  }
  const int shift = fixed_point_shift(bound, micro_shards_);
  if (dense_ != nullptr) {
    dense_->terms(at, n, shift, received, out);
    return;
  }
  const int layer = segments_[segment].layer;
  // Block by block, every micro-shard into the block's sums: the sums stay in the L1 cache
  // instead of streaming through memory once per micro-shard.
  constexpr size_t kBlock = 2048;
  for (size_t done = 0; done < n; done += kBlock) {
    const size_t size = std::min(kBlock, n - done);
    const std::span<int64_t> sums(out + done, size);
    const int64_t begin = at + static_cast<int64_t>(done);
    const GradRange block{layer, begin, begin + static_cast<int64_t>(size)};
    to_fixed_point<Into::kAssign>(values(0, block), shift, sums);  // the first: no zeros
    for (int64_t shard = 1; shard < local_micro_shards_; ++shard)
      to_fixed_point<Into::kAdd>(values(shard, block), shift, sums);
    if (received != nullptr) {
      const int64_t* __restrict in = received + done;
      int64_t* __restrict sum = sums.data();
      for (size_t i = 0; i < size; ++i) sum[i] += in[i];
    }
  }
}

void ExactGradSum::finish_terms(size_t segment, int64_t at, size_t n, const int64_t* received,
                                float* result) const {
  const int bound = bounds_[segment - bounds_first_];
  if (bound == kAllZeroBound || bound == kNonFiniteBound) {
    std::fill(result, result + n, bound == kAllZeroBound ? 0.0f : std::nanf(""));
    return;
  }
  const int shift = fixed_point_shift(bound, micro_shards_);
  if (dense_ != nullptr) {
    // Blocks of whole rows of the layer's weights, which the kernel computes in whole tiles,
    // in cache between the terms and their conversion.
    const int64_t end = at + static_cast<int64_t>(n);
    for (int64_t from = at; from < end;) {
      const int64_t to = dense_->block_end(from, end);
      const auto size = static_cast<size_t>(to - from), offset = static_cast<size_t>(from - at);
      dense_->terms(from, size, shift, received != nullptr ? received + offset : nullptr,
                    block_sums_.data());
      from_fixed_point({block_sums_.data(), size}, shift, micro_shards_, {result + offset, size});
      from = to;
    }
    return;
  }
  constexpr size_t kBlock = 2048;
  int64_t sums[kBlock];  // in the L1 cache between the terms and their conversion
  for (size_t done = 0; done < n; done += kBlock) {
    const size_t size = std::min(kBlock, n - done);
    fixed_point_terms(segment, at + static_cast<int64_t>(done), size,
                      received != nullptr ? received + done : nullptr, sums);
    from_fixed_point({sums, size}, shift, micro_shards_, {result + done, size});
  }
}

// One average() call as the exact ring sees it: the segments [first, first + count), the
// ring's offsets counted from the first one's start.
class ExactGradSum::RingTerms final : public ExactTerms {
 public:
  RingTerms(const ExactGradSum& sum, size_t first, size_t count)
      : sum_(sum), first_(first), last_(first + count), base_(sum.segments_[first].begin) {}
  void terms(size_t first, size_t n, const int64_t* received, int64_t* out) override {
    for_each_piece(first, n, [&](size_t segment, int64_t at, size_t size, size_t offset) {
      sum_.fixed_point_terms(segment, at, size, received != nullptr ? received + offset : nullptr,
                             out + offset);
    });
  }
  void finish(size_t first, size_t n, const int64_t* received, float* result) override {
    for_each_piece(first, n, [&](size_t segment, int64_t at, size_t size, size_t offset) {
      sum_.finish_terms(segment, at, size, received != nullptr ? received + offset : nullptr,
                        result + first + offset);
    });
  }

 private:
  // fn(segment, absolute start, size, offset into the range) for each segment's piece of the
  // ring's range [first, first + n).
  template <class Fn>
  void for_each_piece(size_t first, size_t n, Fn&& fn) const {
    const int64_t begin = base_ + static_cast<int64_t>(first);
    const int64_t end = begin + static_cast<int64_t>(n);
    const auto segments = std::span(sum_.segments_).subspan(first_, last_ - first_);
    auto it =
        std::upper_bound(segments.begin(), segments.end(), begin,
                         [](int64_t at, const GradRange& segment) { return at < segment.end; });
    for (; it != segments.end() && it->begin < end; ++it) {
      const int64_t from = std::max(begin, it->begin), to = std::min(end, it->end);
      fn(first_ + static_cast<size_t>(it - segments.begin()), from, static_cast<size_t>(to - from),
         static_cast<size_t>(from - begin));
    }
  }

  const ExactGradSum& sum_;
  size_t first_, last_;
  int64_t base_;
};

int64_t ExactGradSum::average(int64_t begin, int64_t end) {
  const auto first =
      std::lower_bound(segments_.begin(), segments_.end(), begin,
                       [](const GradRange& segment, int64_t at) { return segment.begin < at; });
  auto last = first;
  while (last != segments_.end() && last->end <= end) ++last;
  RINGTRAIN_CHECK(first != segments_.end() && first->begin == begin && last != first &&
                      std::prev(last)->end == end,
                  "exact average of [{}, {}): not a run of whole gradient segments", begin, end);
  const auto first_segment = static_cast<size_t>(first - segments_.begin());
  const auto count = static_cast<size_t>(last - first);
  const int64_t bound_bytes = agree(first_segment, count);
  RingTerms terms(*this, first_segment, count);
  const size_t ring_bytes =
      ring_allreduce_exact(comm_, static_cast<size_t>(end - begin), terms, sums_.data() + begin,
                           grads_ + begin, scratch_, ring_);
  comm_.board().progress();
  averaged_ += end - begin;
  return bound_bytes + static_cast<int64_t>(ring_bytes);
}

bool ExactGradSum::local_sums(std::span<int> shifts) {
  RINGTRAIN_CHECK(shifts.size() == segments_.size(), "{} shifts for {} gradient segments",
                  shifts.size(), segments_.size());
  agree(0, segments_.size());
  for (size_t s = 0; s < segments_.size(); ++s) {
    const GradRange& segment = segments_[s];
    fixed_point_terms(s, segment.begin, static_cast<size_t>(segment.end - segment.begin), nullptr,
                      sums_.data() + segment.begin);
  }
  comm_.board().progress();
  for (size_t s = 0; s < segments_.size(); ++s) {
    if (bounds_[s] == kNonFiniteBound) return false;
    // An all-zero segment sums to zeros, which convert back to zeros at any scale.
    shifts[s] = bounds_[s] == kAllZeroBound ? 0 : fixed_point_shift(bounds_[s], micro_shards_);
  }
  averaged_ = static_cast<int64_t>(sums_.size());
  return true;
}

namespace {

class ExactAllreduce final : public Allreduce {
 public:
  explicit ExactAllreduce(ExactGradSum& sum, const float* grads) : sum_(sum), grads_(grads) {}
  void run(float* data, size_t count, ReduceOp op) override {
    RINGTRAIN_CHECK(op == ReduceOp::kAvg,
                    "the exact reduction averages micro-shards; it was asked to sum");
    const int64_t begin = data - grads_;
    const PhaseScope phase(sum_.comm().board(), "exact gradient sum");
    bytes_.fetch_add(sum_.average(begin, begin + static_cast<int64_t>(count)),
                     std::memory_order_relaxed);
    runs_.fetch_add(1, std::memory_order_relaxed);
  }
  AllreduceKind kind() const override { return AllreduceKind::kExactRing; }
  Tally tally() const override {
    return {.bytes_sent = bytes_.load(std::memory_order_relaxed),
            .runs = runs_.load(std::memory_order_relaxed)};
  }
  int size() const override { return sum_.comm().size(); }

 private:
  ExactGradSum& sum_;
  const float* grads_;
  std::atomic<int64_t> bytes_{0}, runs_{0};  // tally() may read them from another thread
};

}  // namespace

std::unique_ptr<Allreduce> make_exact_allreduce(ExactGradSum& sum) {
  return std::make_unique<ExactAllreduce>(sum, sum.grads());
}

}  // namespace ringtrain
