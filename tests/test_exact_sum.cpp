// The exact reduction (exact_sum.h): its fixed-point conversion, the integer ring, and the
// property --reproducible rests on: the average of K micro-shards has the same bits however
// they are shared among ranks, swept over rank counts on thread ranks.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <catch2/catch.hpp>

#include "ringtrain/exact_sum.h"
#include "ringtrain/grad_sync.h"
#include "support/thread_comm.h"

using namespace ringtrain;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Segments of a gradient buffer as a model reports them, of awkward sizes.
const std::vector<GradRange> kSegments = {{3, 0, 37}, {2, 37, 38}, {1, 38, 1038}, {0, 1038, 1100}};
constexpr int64_t kElements = 1100;

// Micro-shard `shard`'s gradients: each segment on its own scale (as layers are), with a zero
// segment and values spread over many binades.
std::vector<float> shard_grads(int64_t shard) {
  std::mt19937 rng(static_cast<uint32_t>(1234 + shard));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-20, 0);
  std::vector<float> g(static_cast<size_t>(kElements));
  const float scales[] = {3e-3f, 0.0f, 40.0f, 1e-7f};
  for (size_t s = 0; s < kSegments.size(); ++s)
    for (int64_t i = kSegments[s].begin; i < kSegments[s].end; ++i)
      g[static_cast<size_t>(i)] = scales[s] * std::ldexp(unit(rng), binade(rng));
  return g;
}

// Every rank's averaged buffer when `ranks` ranks share `shards` micro-shards in order
// (rank r holds [r * shards / ranks, (r + 1) * shards / ranks)), averaged bucket by bucket.
std::vector<std::vector<float>> exact_average(int ranks, int64_t shards,
                                              const std::vector<Bucket>& buckets,
                                              int64_t poisoned_shard = -1) {
  std::vector<std::vector<float>> results(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](Comm& comm) {
    const int64_t local = shards / ranks;
    std::vector<float> grads(static_cast<size_t>(kElements));
    ExactGradSum sum(comm, grads.data(), kSegments, shards, local,
                     RingOptions{.segment_elements = 100, .window = 2});
    // Two steps: the first of values 2^-20 as large, its kept micro-shards' bounds all noted
    // as written, so that a bound left over from it would give the second too fine a scale;
    // in the second, only the even kept micro-shards' bounds are noted (the others are read
    // when their segments are averaged).
    for (const int step : {0, 1}) {
      sum.begin_step();
      for (int64_t k = 0; k < local; ++k) {
        const int64_t shard = comm.rank() * local + k;
        std::vector<float> values = shard_grads(shard);
        if (step == 0)
          for (float& v : values) v = std::ldexp(v, -20);
        float* const target = sum.shard_buffer(k);  // the kept buffers, then `grads`
        std::copy(values.begin(), values.end(), target);
        if (shard == poisoned_shard) target[1000] = std::numeric_limits<float>::quiet_NaN();
        if (k + 1 < local) {
          sum.kept_in_place();
          if (step == 0 || k % 2 == 0) sum.note_written(k, 0, kElements);
        }
      }
      for (const Bucket& bucket : buckets) sum.average(bucket.begin, bucket.end);
    }
    results[static_cast<size_t>(comm.rank())] = grads;
  });
  return results;
}

}  // namespace

TEST_CASE("exact sum: the exponent bound of a run of floats", "[exact]") {
  CHECK(exponent_bound(std::vector<float>{0.75f, -0.5f}) == 0);  // |v| < 2^0
  CHECK(exponent_bound(std::vector<float>{1.0f}) == 1);
  CHECK(exponent_bound(std::vector<float>{-3.0f, 0.1f}) == 2);
  CHECK(exponent_bound(std::vector<float>{0.0f, -0.0f}) == kAllZeroBound);
  CHECK(exponent_bound(std::vector<float>{}) == kAllZeroBound);
  CHECK(exponent_bound(std::vector<float>{1.0f, std::numeric_limits<float>::quiet_NaN()}) ==
        kNonFiniteBound);
  CHECK(exponent_bound(std::vector<float>{-std::numeric_limits<float>::infinity()}) ==
        kNonFiniteBound);
  CHECK(exponent_bound(std::vector<float>{std::numeric_limits<float>::denorm_min()}) == -148);
}

TEST_CASE("exact sum: one term converts to fixed point and back unchanged", "[exact]") {
  // One term at the shift of its own bound keeps 50 bits below the largest value: every float
  // within 26 binades of it is an integer there, so the round trip is exact.
  const std::vector<float> values = shard_grads(7);
  const std::span<const float> segment(values.data() + 38, 1000);
  const int bound = exponent_bound(segment);
  const int shift = fixed_point_shift(bound, 1);
  std::vector<int64_t> sums(segment.size(), 0);
  add_fixed_point(segment, shift, sums);
  std::vector<float> back(segment.size());
  from_fixed_point(sums, shift, 1, back);
  int checked = 0;
  for (size_t i = 0; i < segment.size(); ++i) {
    int exponent = 0;
    (void)std::frexp(segment[i], &exponent);
    if (segment[i] != 0.0f && exponent < bound - 26) continue;  // below the exact window
    REQUIRE(back[i] == segment[i]);
    ++checked;
  }
  CHECK(checked > 900);
}

TEST_CASE("exact sum: fixed point rounds to nearest even and keeps K terms within 2^50",
          "[exact]") {
  // 2.5 and 3.5 units at shift 0 (bound 52 - 50 headroom = 2): ties go to even.
  const std::vector<float> ties = {2.5f, 3.5f, -2.5f, 0.5f, 1.5f};
  std::vector<int64_t> sums(ties.size(), 0);
  add_fixed_point(ties, 0, sums);
  CHECK(sums == std::vector<int64_t>{2, 4, -2, 0, 2});
  for (const int64_t terms : {1, 2, 3, 12, 1000}) {
    const int shift = fixed_point_shift(0, terms);  // values below 1
    // The largest term rounds to at most 2^shift; K of them must stay within 2^50.
    const long double largest = std::ldexp(1.0L, shift);
    CHECK(largest * static_cast<long double>(terms) <= std::ldexp(1.0L, 50));
    CHECK(largest * static_cast<long double>(2 * terms) > std::ldexp(1.0L, 50) / 2);
  }
}

namespace {

// Rank r's integer term of element i: near 2^58, where a float or double sum would lose the
// low bits, different on every rank.
int64_t big_term(size_t i, int rank) {
  return (int64_t{1} << 58) + static_cast<int64_t>(i) * (rank + 1) - 7;
}

// The ring's side of a test: terms as big_term gives them; finish records each finished sum
// and writes a float that says whether it was the exact sum over `ranks` ranks.
class RecordingTerms final : public ExactTerms {
 public:
  RecordingTerms(int rank, int ranks, size_t count)
      : rank_(rank), ranks_(ranks), finished_(count, 0), finishes_(count, 0) {}
  void terms(size_t first, size_t n, const int64_t* received, int64_t* out) override {
    for (size_t i = 0; i < n; ++i)
      out[i] = big_term(first + i, rank_) + (received != nullptr ? received[i] : 0);
  }
  void finish(size_t first, size_t n, const int64_t* received, float* result) override {
    for (size_t i = 0; i < n; ++i) {
      const size_t at = first + i;
      finished_[at] = big_term(at, rank_) + (received != nullptr ? received[i] : 0);
      ++finishes_[at];
      result[at] = static_cast<float>(at % 1000) + (finished_[at] == expected(at) ? 0.0f : 0.5f);
    }
  }
  int64_t expected(size_t i) const {
    int64_t sum = 0;
    for (int r = 0; r < ranks_; ++r) sum += big_term(i, r);
    return sum;
  }
  const std::vector<int>& finishes() const { return finishes_; }

 private:
  int rank_, ranks_;
  std::vector<int64_t> finished_;
  std::vector<int> finishes_;
};

}  // namespace

TEST_CASE(
    "exact sum: the integer ring sums exactly over any rank count, finishing each element once",
    "[exact][ring]") {
  for (const int ranks : {1, 2, 3, 5, 8}) {
    const size_t count = 1001;
    std::vector<std::vector<float>> results(static_cast<size_t>(ranks));
    std::vector<std::vector<int>> finishes(static_cast<size_t>(ranks));
    std::vector<size_t> sent(static_cast<size_t>(ranks));
    run_ranks(ranks, [&](Comm& comm) {
      RecordingTerms terms(comm.rank(), ranks, count);
      std::vector<int64_t> partial(count, -1);
      std::vector<float> result(count, -1.0f);
      RingScratch scratch;
      const RingOptions options{.segment_elements = 64, .window = 3};
      reserve_ring_exact(scratch, count, ranks, options);
      sent[static_cast<size_t>(comm.rank())] =
          ring_allreduce_exact(comm, count, terms, partial.data(), result.data(), scratch, options);
      results[static_cast<size_t>(comm.rank())] = result;
      finishes[static_cast<size_t>(comm.rank())] = terms.finishes();
    });
    for (size_t i = 0; i < count; ++i) {
      int finished = 0;
      for (int r = 0; r < ranks; ++r) {
        // Exact (no 0.5 mark) and copied bit for bit to every rank.
        REQUIRE(results[static_cast<size_t>(r)][i] == static_cast<float>(i % 1000));
        finished += finishes[static_cast<size_t>(r)][i];
      }
      REQUIRE(finished == 1);  // converted once in the job, by the chunk's owner
    }
    // Integers in the scatter-reduce (step s sends chunk r - s), floats in the allgather
    // (chunk r + 1 - s).
    for (int r = 0; r < ranks; ++r) {
      size_t expected = 0;
      for (int step = 0; step + 1 < ranks; ++step) {
        expected += 8 * ring_chunk(count, ranks, (r - step + ranks) % ranks).size;
        expected += 4 * ring_chunk(count, ranks, (r + 1 - step + ranks) % ranks).size;
      }
      CHECK(sent[static_cast<size_t>(r)] == expected);
    }
  }
}

TEST_CASE("exact sum: the average of 12 micro-shards has the same bits on 1 to 12 ranks",
          "[exact]") {
  const int64_t shards = 12;
  const std::vector<Bucket> one_bucket = {{0, kElements}};
  const std::vector<Bucket> buckets = {{0, 37}, {37, 1038}, {1038, 1100}};
  const std::vector<float> reference = exact_average(1, shards, one_bucket)[0];
  for (const int ranks : {1, 2, 3, 4, 6, 12}) {
    for (const auto* split : {&one_bucket, &buckets}) {
      const auto results = exact_average(ranks, shards, *split);
      for (const auto& result : results) CHECK(same_bits(result, reference));
    }
  }
  // And it is the average: against a long-double sum, the error is the terms' rounding at
  // the segment's scale (2^-shift each, averaged) plus the result's own rounding to float.
  for (const GradRange& segment : kSegments) {
    std::vector<std::vector<float>> all;
    for (int64_t k = 0; k < shards; ++k) all.push_back(shard_grads(k));
    float largest = 0.0f;
    for (const auto& g : all)
      for (int64_t i = segment.begin; i < segment.end; ++i)
        largest = std::max(largest, std::fabs(g[static_cast<size_t>(i)]));
    if (largest == 0.0f) {
      for (int64_t i = segment.begin; i < segment.end; ++i)
        CHECK(reference[static_cast<size_t>(i)] == 0.0f);
      continue;
    }
    int bound = 0;
    (void)std::frexp(largest, &bound);
    const long double term_error = std::ldexp(1.0L, -fixed_point_shift(bound, shards));
    for (int64_t i = segment.begin; i < segment.end; ++i) {
      long double exact = 0.0L;
      for (const auto& g : all) exact += g[static_cast<size_t>(i)];
      exact /= static_cast<long double>(shards);
      const float got = reference[static_cast<size_t>(i)];
      const long double half_ulp =
          std::fabs(std::nextafter(got, std::numeric_limits<float>::infinity()) - got) / 2.0L;
      REQUIRE(std::fabs(static_cast<long double>(got) - exact) <= term_error + half_ulp * 1.001L);
    }
  }
}

TEST_CASE("exact sum: a NaN in one micro-shard poisons its segment on every rank only", "[exact]") {
  const std::vector<Bucket> buckets = {{0, 37}, {37, 1038}, {1038, 1100}};
  const auto clean = exact_average(1, 6, buckets);
  for (const int ranks : {1, 3}) {
    const auto results = exact_average(ranks, 6, buckets, /*poisoned_shard=*/4);
    for (const auto& result : results) {
      for (int64_t i = 38; i < 1038; ++i) REQUIRE(std::isnan(result[static_cast<size_t>(i)]));
      for (const int64_t i : {0, 36, 37, 1038, 1099})
        CHECK(result[static_cast<size_t>(i)] == clean[0][static_cast<size_t>(i)]);
    }
  }
}

TEST_CASE("exact sum: averages only runs of whole segments", "[exact]") {
  run_ranks(1, [](Comm& comm) {
    std::vector<float> grads(static_cast<size_t>(kElements), 1.0f);
    ExactGradSum sum(comm, grads.data(), kSegments, 1, 1);
    sum.begin_step();
    CHECK_THROWS_WITH(sum.average(0, 40), Catch::Contains("whole gradient segments"));
    CHECK_THROWS_WITH(sum.average(10, 37), Catch::Contains("whole gradient segments"));
    sum.average(0, kElements);
    CHECK(grads[5] == 1.0f);
  });
}
