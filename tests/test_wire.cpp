// The 16-bit gradient wire (wire.h, ring_allreduce_wire in ring.h, the host Allreduce's
// --grad-wire): the conversions against IEEE round-to-nearest-even on every 16-bit interval,
// the fp16 scale rule, and the ring over thread ranks: identical bits on every rank, within an
// error bound derived from the roundings it does, no fp16 overflow, non-finite values seen
// alike everywhere, and the fp32 wire bit for bit the plain ring.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include <catch2/catch.hpp>

#include "options.h"
#include "ringtrain/allreduce.h"
#include "ringtrain/exact_sum.h"
#include "ringtrain/ring.h"
#include "ringtrain/wire.h"
#include "support/thread_comm.h"

using namespace ringtrain;

namespace {

struct Format {
  GradWire wire;
  uint16_t (*to)(float);
  float (*from)(uint16_t);
  uint16_t largest_finite;  // positive
  uint16_t infinity;
  double unit_roundoff;       // half an ulp, relative
  double half_min_subnormal;  // the absolute error of rounding near zero
};
const Format kBf16{GradWire::kBf16, float_to_bf16, bf16_to_float, 0x7f7f, 0x7f80, 0x1p-8, 0x1p-134};
const Format kFp16{GradWire::kFp16, float_to_fp16, fp16_to_float, 0x7bff, 0x7c00, 0x1p-11, 0x1p-25};

// The positive value just above `h` on the format's grid, as a double: the next encoding's
// value, or for the largest finite one the power of two an unbounded exponent would give.
double next_up(const Format& f, uint16_t h) {
  if (h == f.largest_finite) return 2.0 * std::pow(2.0, std::ilogb(f.from(h)));
  return static_cast<double>(f.from(static_cast<uint16_t>(h + 1)));
}

bool all_identical(const std::vector<std::vector<float>>& results) {
  for (const auto& r : results)
    if (r.size() != results[0].size() ||
        std::memcmp(r.data(), results[0].data(), r.size() * sizeof(float)) != 0)
      return false;
  return true;
}

}  // namespace

TEST_CASE("16-bit conversions round to nearest even on every interval of both formats", "[wire]") {
  for (const Format& f : {kBf16, kFp16}) {
    INFO(to_string(f.wire));
    size_t wrong = 0;
    for (uint32_t h = 0; h <= f.largest_finite; ++h) {
      const auto bits = static_cast<uint16_t>(h);
      const float value = f.from(bits);
      // Every value of the format converts back to itself, with either sign.
      wrong += f.to(value) != bits;
      wrong += f.to(-value) != (bits | 0x8000u);
      // The midpoint to the next value up (exact in a float: one bit more than the format)
      // goes to the even neighbour; a float either side of it to the nearer neighbour. Above
      // the largest finite value the next "value" is the infinity.
      const auto up = static_cast<uint16_t>(h == f.largest_finite ? f.infinity : h + 1);
      const auto mid = static_cast<float>((static_cast<double>(value) + next_up(f, bits)) / 2);
      wrong += f.to(mid) != ((bits % 2 == 0) ? bits : up);
      wrong += f.to(std::nextafter(mid, 0.0f)) != bits;
      wrong += f.to(std::nextafter(mid, std::numeric_limits<float>::infinity())) != up;
      wrong += f.to(-mid) != (((bits % 2 == 0) ? bits : up) | 0x8000u);
    }
    CHECK(wrong == 0);
    // Infinities and NaNs.
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(f.to(inf) == f.infinity);
    CHECK(f.to(-inf) == (f.infinity | 0x8000u));
    CHECK(std::isinf(f.from(f.infinity)));
    CHECK(std::isnan(f.from(f.to(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(std::isnan(f.from(f.to(-std::numeric_limits<float>::quiet_NaN()))));
    // A signalling NaN whose payload sits only in the dropped bits stays a NaN.
    CHECK(std::isnan(f.from(f.to(std::bit_cast<float>(0x7f800001u)))));
    CHECK(f.to(std::numeric_limits<float>::max()) == f.infinity);
    CHECK(f.to(-0.0f) == 0x8000u);
    CHECK(f.to(0.0f) == 0u);
  }
  // A few values to read.
  CHECK(float_to_fp16(65504.0f) == 0x7bff);
  CHECK(float_to_fp16(65519.996f) == 0x7bff);
  CHECK(float_to_fp16(65520.0f) == 0x7c00);    // the tie goes to the even "65536": infinity
  CHECK(float_to_fp16(0x1p-24f) == 0x0001);    // smallest subnormal
  CHECK(float_to_fp16(0x1p-25f) == 0x0000);    // tie between 0 and 2^-24: to even, 0
  CHECK(float_to_fp16(0x1.8p-24f) == 0x0002);  // tie between 1 and 2 steps: to even, 2
  CHECK(float_to_fp16(0x1p-14f) == 0x0400);    // smallest normal
  CHECK(float_to_fp16(1e-30f) == 0x0000);
  CHECK(float_to_bf16(0x1p-133f) == 0x0001);         // bf16 keeps float's subnormals
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);    // tie: to even (1.0)
  CHECK(float_to_bf16(1.0f + 0x1.8p-7f) == 0x3f82);  // tie: to even (1 + 2^-6)
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(fp16_to_float(0x3c00) == 1.0f);
  CHECK(fp16_to_float(0x0001) == 0x1p-24f);
  CHECK(fp16_to_float(0x03ff) == 1023 * 0x1p-24f);
}

TEST_CASE("the buffer conversions (F16C where the build has it) give the scalar bits", "[wire]") {
  // Every 16-bit pattern, every midpoint between neighbours and the floats either side of it,
  // the specials: through encode_wire, decode_wire, add_from_wire and round_through_wire, in
  // lengths that leave a tail for the scalar loop.
  for (const Format& f : {kBf16, kFp16}) {
    INFO(to_string(f.wire));
    std::vector<float> values;
    for (uint32_t h = 0; h <= f.largest_finite; ++h) {
      const float value = f.from(static_cast<uint16_t>(h));
      const auto mid = static_cast<float>(
          (static_cast<double>(value) + next_up(f, static_cast<uint16_t>(h))) / 2);
      for (float v : {value, mid, std::nextafter(mid, 0.0f),
                      std::nextafter(mid, std::numeric_limits<float>::infinity())})
        values.insert(values.end(), {v, -v});
    }
    values.insert(values.end(), {std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN(), 1e-40f, 3});
    const size_t n = values.size();
    REQUIRE(n % 8 != 0);
    std::vector<uint16_t> encoded(n);
    encode_wire(f.wire, values.data(), n, 0, encoded.data());
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t expected = f.to(values[i]);
      wrong += std::isnan(values[i]) ? !std::isnan(f.from(encoded[i])) : encoded[i] != expected;
    }
    CHECK(wrong == 0);
    std::vector<float> rounded = values;
    round_through_wire(f.wire, rounded.data(), n, 0);
    wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      const float expected = f.from(f.to(values[i]));
      wrong += std::isnan(expected)
                   ? !std::isnan(rounded[i])
                   : std::bit_cast<uint32_t>(rounded[i]) != std::bit_cast<uint32_t>(expected);
    }
    CHECK(wrong == 0);
    std::vector<uint16_t> patterns(65535);
    for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<uint16_t>(i);
    std::vector<float> decoded(patterns.size()), sums(patterns.size(), 0.5f);
    decode_wire(f.wire, patterns.data(), patterns.size(), 0, decoded.data());
    add_from_wire(f.wire, patterns.data(), patterns.size(), 0, sums.data());
    wrong = 0;
    for (size_t i = 0; i < patterns.size(); ++i) {
      const float expected = f.from(patterns[i]);
      if (std::isnan(expected)) {
        wrong += !std::isnan(decoded[i]) + !std::isnan(sums[i]);
      } else {
        wrong += std::bit_cast<uint32_t>(decoded[i]) != std::bit_cast<uint32_t>(expected);
        wrong += std::bit_cast<uint32_t>(sums[i]) != std::bit_cast<uint32_t>(0.5f + expected);
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("the fp16 scale keeps every partial sum within 2^15, or says the bucket cannot fit",
          "[wire]") {
  for (int ranks : {1, 2, 3, 4, 5, 8, 9, 16}) {
    const int headroom = static_cast<int>(std::ceil(std::log2(ranks)));
    for (int bound : {-140, -60, -20, -1, 0, 1, 15, 40, 99, 100}) {
      INFO(ranks << " ranks, bound " << bound);
      const WireExponents sum = fp16_exponents(bound, ranks, /*average=*/false);
      const WireExponents avg = fp16_exponents(bound, ranks, /*average=*/true);
      REQUIRE(sum.fits);
      REQUIRE(avg.fits);
      // N values below 2^bound sum below N 2^bound; scaled, at most 2^15 (fp16 max 65504).
      CHECK(std::ldexp(static_cast<double>(ranks), bound + sum.reduce) <= 0x1p15);
      CHECK(sum.gather == sum.reduce);
      CHECK(avg.reduce == sum.reduce);
      CHECK(std::ldexp(1.0, bound + avg.gather) <= 0x1p15);  // an average is below 2^bound
      // As much range as allowed, up to the cap that keeps unscaling exact.
      CHECK(sum.reduce == std::min(100, 15 - headroom - bound));
      CHECK(avg.gather == std::min(100, 15 - bound));
    }
    CHECK_FALSE(fp16_exponents(kNonFiniteBound, ranks, true).fits);
    CHECK_FALSE(fp16_exponents(kFp16LargestBound + 1, ranks, true).fits);
    CHECK(fp16_exponents(kAllZeroBound, ranks, true).fits);
  }
}

namespace {

// Every rank's inputs and results of one ring_allreduce_wire.
struct WireRun {
  std::vector<std::vector<float>> inputs, results;
  std::vector<size_t> bytes;
  WireExponents exponents;
};

// Inputs of widely varying magnitude (2^-12 .. 2^4 times a per-element factor of 1 .. 7, times
// `scale`), so that partial sums round at every hop and the fp16 scale matters. A hash of
// (rank, i): cheap, and the same on every machine.
float varied_input(int rank, size_t i, float scale) {
  uint64_t h = static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ull + i + 1;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  const float mantissa = static_cast<float>(h >> 40) * 0x1p-23f - 1.0f;  // [-1, 1)
  const int exponent = static_cast<int>(h % 17) - 12;                    // -12 .. 4
  return std::ldexp(mantissa, exponent) * scale * static_cast<float>(i % 7 + 1);
}

WireRun run_wire_ring(GradWire wire, int ranks, size_t count, ReduceOp op, float scale,
                      const RingOptions& options = {}) {
  WireRun run;
  run.inputs.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& in = run.inputs[static_cast<size_t>(r)];
    in.resize(count);
    for (size_t i = 0; i < count; ++i) in[i] = varied_input(r, i, scale);
  }
  if (wire == GradWire::kFp16) {
    int bound = kAllZeroBound;
    for (const auto& in : run.inputs) bound = std::max(bound, exponent_bound(in));
    run.exponents = fp16_exponents(bound, ranks, op == ReduceOp::kAvg);
  }
  run.results = run.inputs;
  run.bytes.resize(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](Comm& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    RingScratch scratch;
    run.bytes[r] = ring_allreduce_wire(comm, run.results[r].data(), count, op, wire, run.exponents,
                                       scratch, options);
  });
  return run;
}

// The error bound of one element of ring_allreduce_wire, from the roundings it does. The
// chunk's partial sum passes N - 1 hops; at each, the sender rounds it to 16 bits (relative
// error u, plus an absolute eta_reduce below the format's smallest normal, unscaled) and the
// receiver adds in float32 (relative 2^-24). Every partial sum is at most A = sum_j |v_j|,
// grown by at most g = (1 + u + 2^-24)^(2N) through the roundings before it. The owner then
// divides by N (2^-24) and rounds once more to 16 bits (u, eta_gather). So
//   |sum error| <= (N - 1) ((u + 2^-24) A g + eta_reduce) + (u + 2^-24) A g + eta_gather
// and the average's error is the division of the first part by N, plus the last rounding.
double wire_error_bound(const Format& f, int ranks, double magnitude, ReduceOp op,
                        const WireExponents& exponents) {
  const double n = ranks, float_add = 0x1p-24;
  const double growth = std::pow(1.0 + f.unit_roundoff + float_add, 2.0 * n);
  const double eta_reduce = std::ldexp(f.half_min_subnormal, -exponents.reduce);
  const double eta_gather = std::ldexp(f.half_min_subnormal, -exponents.gather);
  const double hops = (n - 1) * ((f.unit_roundoff + float_add) * magnitude * growth + eta_reduce);
  const double last = (f.unit_roundoff + float_add) * magnitude * growth;
  return op == ReduceOp::kAvg ? (hops + last) / n + eta_gather : hops + last + eta_gather;
}

}  // namespace

TEST_CASE("the 16-bit ring: same bits on every rank, within the bound of its roundings", "[wire]") {
  for (const Format& f : {kBf16, kFp16}) {
    for (int ranks = 1; ranks <= 8; ++ranks) {
      const auto n = static_cast<size_t>(ranks);
      for (size_t count : {size_t{0}, size_t{1}, n - 1, n + 1, size_t{1009}, size_t{20011}}) {
        for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kSum}) {
          // Small odd segments too: many segments per chunk, each with a pad.
          for (const RingOptions options : {RingOptions{}, RingOptions{7, 3}}) {
            INFO(to_string(f.wire) << ", " << ranks << " ranks, " << count << " elements, "
                                   << to_string(op) << ", segment " << options.segment_elements);
            const WireRun run = run_wire_ring(f.wire, ranks, count, op, 1.0f, options);
            CHECK(all_identical(run.results));
            double worst = 0.0;
            size_t off_grid = 0, rounded = 0;
            for (size_t i = 0; i < count; ++i) {
              double exact = 0.0, magnitude = 0.0;
              for (const auto& in : run.inputs) {
                exact += static_cast<double>(in[i]);
                magnitude += std::fabs(static_cast<double>(in[i]));
              }
              if (op == ReduceOp::kAvg) exact /= static_cast<double>(ranks);
              const double result = static_cast<double>(run.results[0][i]);
              worst = std::max(worst, std::fabs(result - exact) /
                                          wire_error_bound(f, ranks, magnitude, op, run.exponents));
              // What the allgather handed out is a 16-bit value at the gather scale.
              if (ranks > 1) {
                const float scaled = std::ldexp(run.results[0][i], run.exponents.gather);
                off_grid += f.from(f.to(scaled)) != scaled;
              }
              rounded += run.results[0][i] != run.inputs[0][i];
            }
            INFO("worst error / bound " << worst);
            CHECK(worst <= 1.0);
            CHECK(off_grid == 0);
            if (ranks == 1) CHECK(run.results == run.inputs);  // one rank: nothing moves
            if (ranks > 1 && count > 100) CHECK(rounded > 0);
          }
        }
      }
    }
  }
}

TEST_CASE("the 16-bit ring sends half the fp32 ring's bytes, plus a pad per odd segment",
          "[wire]") {
  for (int ranks : {2, 3, 4, 7}) {
    for (size_t count : {size_t{1000}, size_t{1001}, size_t{65536}}) {
      const RingOptions options{100, 2};
      const WireRun run =
          run_wire_ring(GradWire::kBf16, ranks, count, ReduceOp::kAvg, 1.0f, options);
      size_t total_fp32_elements = 0;
      for (int r = 0; r < ranks; ++r) {
        const size_t elements = ring_elements_sent(count, ranks, r);
        total_fp32_elements += elements;
        // Each segment of n values travels as ceil(n / 2) floats: 2 bytes a value, plus at most
        // 2 bytes per segment (segments of 100, one chunk per step, 2 (N - 1) steps).
        const size_t segments_bound =
            2 * static_cast<size_t>(ranks - 1) * ((count / ranks + 1 + 99) / 100);
        INFO(ranks << " ranks, " << count << " elements, rank " << r);
        CHECK(run.bytes[static_cast<size_t>(r)] >= elements * 2);
        CHECK(run.bytes[static_cast<size_t>(r)] <= elements * 2 + 2 * segments_bound);
        if (count % (2 * static_cast<size_t>(ranks)) == 0 && count / ranks % 100 == 0)
          CHECK(run.bytes[static_cast<size_t>(r)] == elements * 2);
      }
      CHECK(total_fp32_elements == 2 * static_cast<size_t>(ranks - 1) * count);
    }
  }
}

namespace {

// Every rank's result of the host Allreduce (make_allreduce, as mnist_train makes it) on the
// given wire, and its tally.
struct AllreduceRun {
  std::vector<std::vector<float>> results;
  std::vector<Allreduce::Tally> tallies;
};

AllreduceRun run_host_allreduce(GradWire wire, const std::vector<std::vector<float>>& inputs,
                                ReduceOp op) {
  const int ranks = static_cast<int>(inputs.size());
  AllreduceRun run{inputs, std::vector<Allreduce::Tally>(inputs.size())};
  run_ranks(ranks, [&](Comm& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    const std::unique_ptr<Allreduce> allreduce = make_allreduce(comm, {.wire = wire}, Context{});
    allreduce->reserve(inputs[r].size());
    allreduce->run(run.results[r].data(), inputs[r].size(), op);
    run.tallies[r] = allreduce->tally();
  });
  return run;
}

std::vector<std::vector<float>> varied_inputs(int ranks, size_t count, float scale) {
  std::vector<std::vector<float>> inputs(static_cast<size_t>(ranks), std::vector<float>(count));
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < count; ++i)
      inputs[static_cast<size_t>(r)][i] = varied_input(r, i, scale);
  return inputs;
}

}  // namespace

TEST_CASE("fp16 does not overflow on huge values; beyond its scale's reach it moves fp32",
          "[wire]") {
  for (int ranks : {2, 3, 5, 8}) {
    // Values up to 2^4 * 7 * 2^80 ~ 2^87: the sum of 8 is far beyond 65504, and fits the scale.
    const size_t count = 3001;
    const auto huge = varied_inputs(ranks, count, 0x1p80f);
    for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kSum}) {
      INFO(ranks << " ranks, " << to_string(op));
      const AllreduceRun run = run_host_allreduce(GradWire::kFp16, huge, op);
      CHECK(all_identical(run.results));
      int bound = kAllZeroBound;
      for (const auto& in : huge) bound = std::max(bound, exponent_bound(in));
      const WireExponents exponents = fp16_exponents(bound, ranks, op == ReduceOp::kAvg);
      REQUIRE(exponents.fits);
      double worst = 0.0;
      for (size_t i = 0; i < count; ++i) {
        double exact = 0.0, magnitude = 0.0;
        for (const auto& in : huge) {
          exact += static_cast<double>(in[i]);
          magnitude += std::fabs(static_cast<double>(in[i]));
        }
        if (op == ReduceOp::kAvg) exact /= ranks;
        REQUIRE(std::isfinite(run.results[0][i]));
        worst = std::max(worst, std::fabs(static_cast<double>(run.results[0][i]) - exact) /
                                    wire_error_bound(kFp16, ranks, magnitude, op, exponents));
      }
      CHECK(worst <= 1.0);
      CHECK(run.tallies[0].fp32_fallbacks == 0);
    }
    // Values of 2^100 and more: no fp16 scale is exact there; the bucket moves as fp32, on
    // every rank, with the fp32 ring's bits.
    const auto beyond = varied_inputs(ranks, count, 0x1p110f);
    const AllreduceRun run = run_host_allreduce(GradWire::kFp16, beyond, ReduceOp::kAvg);
    const AllreduceRun fp32 = run_host_allreduce(GradWire::kFp32, beyond, ReduceOp::kAvg);
    CHECK(run.results == fp32.results);
    for (const auto& tally : run.tallies) CHECK(tally.fp32_fallbacks == 1);
  }
}

TEST_CASE("a NaN or an infinity on one rank is seen alike on every rank, on either wire",
          "[wire]") {
  for (int ranks : {2, 3, 4, 8}) {
    const size_t count = 2000;
    auto inputs = varied_inputs(ranks, count, 1.0f);
    inputs[static_cast<size_t>(ranks - 1)][7] = std::numeric_limits<float>::quiet_NaN();
    inputs[0][1500] = std::numeric_limits<float>::infinity();
    const AllreduceRun fp32 = run_host_allreduce(GradWire::kFp32, inputs, ReduceOp::kAvg);
    for (GradWire wire : {GradWire::kBf16, GradWire::kFp16}) {
      INFO(ranks << " ranks, " << to_string(wire));
      const AllreduceRun run = run_host_allreduce(wire, inputs, ReduceOp::kAvg);
      CHECK(all_identical(run.results));
      CHECK(std::isnan(run.results[0][7]));
      CHECK(std::isinf(run.results[0][1500]));
      size_t non_finite = 0;
      for (float v : run.results[0]) non_finite += !std::isfinite(v);
      CHECK(non_finite == 2);
      for (const auto& tally : run.tallies) {
        // fp16: every rank saw the bound of the NaN in the allgather and sent fp32 instead.
        CHECK(tally.fp32_fallbacks == (wire == GradWire::kFp16 ? 1 : 0));
      }
      // fp16's fallback is the fp32 ring itself: the same bits (NaNs compared as bits).
      if (wire == GradWire::kFp16)
        CHECK(std::memcmp(run.results[0].data(), fp32.results[0].data(), count * 4) == 0);
    }
  }
}

TEST_CASE("the fp32 wire is the plain ring bit for bit, and counts its bytes", "[wire]") {
  for (int ranks : {1, 2, 3, 6}) {
    const size_t count = 10007;
    const auto inputs = varied_inputs(ranks, count, 1.0f);
    const AllreduceRun run = run_host_allreduce(GradWire::kFp32, inputs, ReduceOp::kAvg);
    std::vector<std::vector<float>> plain = inputs;
    run_ranks(ranks, [&](Comm& comm) {
      RingScratch scratch;
      ring_allreduce(comm, plain[static_cast<size_t>(comm.rank())].data(), count, ReduceOp::kAvg,
                     scratch);
    });
    CHECK(run.results == plain);
    for (int r = 0; r < ranks; ++r) {
      const Allreduce::Tally& tally = run.tallies[static_cast<size_t>(r)];
      CHECK(tally.runs == 1);
      CHECK(tally.bytes_sent ==
            static_cast<int64_t>(ring_elements_sent(count, ranks, r) * sizeof(float)));
    }
  }
}

TEST_CASE("a 16-bit wire is refused where it cannot run", "[wire]") {
  std::vector<int> refused(2, 0);  // Catch2 assertions stay out of the rank threads
  run_ranks(2, [&refused](Comm& comm) {
    try {
      make_allreduce(comm, {.algorithm = AllreduceAlgorithm::kLibrary, .wire = GradWire::kBf16},
                     Context{});
    } catch (const Error&) {
      refused[static_cast<size_t>(comm.rank())] = 1;
    }
  });
  CHECK(refused == std::vector<int>{1, 1});
  CHECK(parse_grad_wire("bf16") == GradWire::kBf16);
  CHECK(parse_grad_wire("fp16") == GradWire::kFp16);
  CHECK(parse_grad_wire("fp32") == GradWire::kFp32);
  CHECK_THROWS_AS(parse_grad_wire("fp8"), Error);
}

TEST_CASE("grad wire: 16 bits (--grad-wire) refused, the same on every rank, where it cannot run", "[wire]") {
  using namespace ringtrain::app;
  const auto refused = [](Options o, int ranks) {
    try {
      check_flag_combinations(o, ranks);
    } catch (const Error& error) {
      return error.code() == ExitCode::kUsage && error.on_every_rank();
    }
    return false;
  };
  Options wire;
  wire.grad_wire = GradWire::kFp16;
  CHECK_FALSE(refused(wire, 2));
  Options o = wire;
  o.allreduce = AllreduceAlgorithm::kLibrary;
  CHECK(refused(o, 2));
  o = wire;
  o.reproducible = true;
  o.global_batch_size = 96;
  CHECK(refused(o, 2));
  o.grad_wire = GradWire::kFp32;
  CHECK_FALSE(refused(o, 2));
  o = wire;
  o.strategy = Strategy::kParameterServers;
  CHECK(refused(o, 3));
  o = wire;
  o.strategy = Strategy::kLocalSgd;
  CHECK(refused(o, 2));
  o = wire;
  o.device = "cuda";
  CHECK(refused(o, 2));
  // --device auto that finds a GPU: refused once the device is known.
  const DeviceChoice gpu{.device = Device::kCuda, .gpu = 0, .why = "a GPU is visible"};
  const DeviceChoice cpu{.device = Device::kCpu, .gpu = -1, .why = "no GPU"};
  bool device_refused = false;
  try {
    check_device_flags(wire, 2, gpu);
  } catch (const Error& error) {
    device_refused = error.code() == ExitCode::kUsage &&
                     std::string(error.what()).find("--device cpu") != std::string::npos;
  }
  CHECK(device_refused);
  CHECK_NOTHROW(check_device_flags(wire, 2, cpu));
}

namespace {

// The rounding of a ring whose wire type is also its accumulator (as rings with a bf16
// datatype do): every input rounded to bf16, every hop's sum rounded to bf16, the average
// too. Chunk c's sum starts at rank c and gathers ranks c+1, c+2, ... (the schedule of
// ring.cpp), so element i of chunk c adds in that order.
float bf16_accumulating_average(const std::vector<std::vector<float>>& inputs, size_t i, int c) {
  const auto n = static_cast<int>(inputs.size());
  const auto bf16 = [](float v) { return bf16_to_float(float_to_bf16(v)); };
  float sum = bf16(inputs[static_cast<size_t>(c)][i]);
  for (int k = 1; k < n; ++k) sum = bf16(sum + bf16(inputs[static_cast<size_t>((c + k) % n)][i]));
  return bf16(sum / static_cast<float>(n));
}

}  // namespace

// Not a check: the table of docs/benchmarks.md ("The 16-bit wire's error as N grows"), printed
// by `ringtrain_tests "[.bench]"`.
TEST_CASE("16-bit wire error against the fp64 average, by rank count", "[.bench]") {
  const size_t count = 1 << 16;
  std::printf(
      "| ranks | fp32 ring | bf16 wire, fp32 sums (ours) | bf16 ring, bf16 sums | fp16 wire, "
      "fp32 sums (ours) |\n|---|---|---|---|---|\n");
  for (int ranks = 1; ranks <= 16; ++ranks) {
    // Gradient-like: a signal shared by the ranks plus per-rank noise twice its size.
    std::vector<std::vector<float>> inputs(static_cast<size_t>(ranks), std::vector<float>(count));
    for (int r = 0; r < ranks; ++r)
      for (size_t i = 0; i < count; ++i)
        inputs[static_cast<size_t>(r)][i] =
            varied_input(-1, i, 1e-3f) + 2.0f * varied_input(r, i, 1e-3f);
    std::vector<double> exact(count, 0.0);
    for (const auto& in : inputs)
      for (size_t i = 0; i < count; ++i) exact[i] += static_cast<double>(in[i]) / ranks;
    // Relative RMS error: sqrt(sum (x - exact)^2 / sum exact^2).
    const auto rms_error = [&](const std::vector<float>& result) {
      double err = 0.0, norm = 0.0;
      for (size_t i = 0; i < count; ++i) {
        err += std::pow(static_cast<double>(result[i]) - exact[i], 2.0);
        norm += exact[i] * exact[i];
      }
      return std::sqrt(err / norm);
    };
    const auto ring = [&](GradWire wire) {
      std::vector<std::vector<float>> results = inputs;
      int bound = kAllZeroBound;
      for (const auto& in : inputs) bound = std::max(bound, exponent_bound(in));
      run_ranks(ranks, [&](Comm& comm) {
        RingScratch scratch;
        float* data = results[static_cast<size_t>(comm.rank())].data();
        if (wire == GradWire::kFp32) {
          ring_allreduce(comm, data, count, ReduceOp::kAvg, scratch);
        } else {
          const WireExponents exponents =
              wire == GradWire::kFp16 ? fp16_exponents(bound, ranks, true) : WireExponents{};
          ring_allreduce_wire(comm, data, count, ReduceOp::kAvg, wire, exponents, scratch);
        }
      });
      return rms_error(results[0]);
    };
    std::vector<float> baseline(count);
    for (int c = 0; c < ranks; ++c) {
      const ChunkRange chunk = ring_chunk(count, ranks, c);
      for (size_t i = chunk.begin; i < chunk.begin + chunk.size; ++i)
        baseline[i] = bf16_accumulating_average(inputs, i, c);
    }
    std::printf("| %d | %.2e | %.2e | %.2e | %.2e |\n", ranks, ring(GradWire::kFp32),
                ring(GradWire::kBf16), rms_error(baseline), ring(GradWire::kFp16));
  }
}
