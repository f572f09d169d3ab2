// EpochSampler: the order of one epoch, a permutation that depends only on (seed, epoch).
//
// std::shuffle and the std distributions are free to differ between standard libraries, so
// the same seed would give different runs on different machines. Here everything is spelled
// out: a splitmix64 stream seeded from (seed, epoch), an unbiased bounded integer by
// rejection, and the textbook Fisher-Yates shuffle starting from 0, 1, ..., size-1.
#include <numeric>
#include <utility>

#include "ringtrain/check.h"
#include "ringtrain/data.h"

namespace ringtrain {

namespace {

// Steele, Lea and Flood's splitmix64 finaliser: a bijection that spreads every input bit.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The splitmix64 generator: a counter passed through the finaliser.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() {
    uint64_t out = splitmix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return out;
  }
  // Uniform in [0, n), n > 0. Plain `next() % n` favours small values; rejecting the lowest
  // 2^64 mod n outputs leaves a range that is a multiple of n (the arc4random_uniform rule).
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // == 2^64 mod n
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

 private:
  uint64_t state_;
};

}  // namespace

EpochSampler::EpochSampler(int64_t size, uint64_t seed) : seed_(seed) {
  RINGTRAIN_CHECK(size >= 0, "EpochSampler: negative size {}", size);
  order_.resize(static_cast<size_t>(size));
}

std::span<const int64_t> EpochSampler::order(int64_t epoch) {
  RINGTRAIN_CHECK(epoch >= 0, "EpochSampler: negative epoch {}", epoch);
  if (epoch == epoch_) return order_;
  // Mixing the epoch before the XOR keeps (seed, epoch) and (seed ^ 1, epoch ^ 1) apart.
  SplitMix64 rng(
      splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(epoch) + 0x632be59bd9b4e019ULL)));
  // From iota every time: the order is a function of (seed, epoch), not of earlier epochs.
  std::iota(order_.begin(), order_.end(), int64_t{0});
  for (size_t i = order_.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.below(i));
    std::swap(order_[i - 1], order_[j]);
  }
  epoch_ = epoch;
  return order_;
}

}  // namespace ringtrain
