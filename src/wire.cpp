// The 16-bit wire formats and the fp16 scale (see wire.h).
//
// The conversions work on the bits, branch-free, so that the loops over a segment vectorise;
// the one floating-point operation (the subnormal rounding of float_to_fp16, an addition that
// rounds in the default mode, to nearest even) is exact IEEE arithmetic on every x86-64.
#include "ringtrain/wire.h"

#include <algorithm>
#include <bit>
#include <cmath>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

#include "ringtrain/check.h"
#include "ringtrain/exact_sum.h"

namespace ringtrain {

GradWire parse_grad_wire(const std::string& flag) {
  if (flag == "fp32") return GradWire::kFp32;
  if (flag == "bf16") return GradWire::kBf16;
  if (flag == "fp16") return GradWire::kFp16;
  throw Error(
      fmt::format("--grad-wire '{}' is unknown: use fp32 (the default), bf16 or fp16", flag),
      ExitCode::kUsage, /*on_every_rank=*/true);
}

const char* to_string(GradWire wire) {
  switch (wire) {
    case GradWire::kFp32:
      return "fp32";
    case GradWire::kBf16:
      return "bf16";
    case GradWire::kFp16:
      return "fp16";
  }
  return "?";
}

size_t wire_element_bytes(GradWire wire) {
  return wire == GradWire::kFp32 ? sizeof(float) : sizeof(uint16_t);
}

namespace {

constexpr uint32_t kSignBit = 0x80000000u;
constexpr uint32_t kFloatInfinity = 0x7f800000u;

}  // namespace

uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // Adding 0x7fff (plus the kept part's lowest bit, for the tie) carries into the kept half
  // exactly when the dropped half is above one half (or is one half and the kept part is odd);
  // a carry out of the largest finite value gives the infinity, as IEEE rounding does.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // A NaN keeps its sign and top payload bits and is made quiet, so that it cannot round to an
  // infinity.
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & ~kSignBit) > kFloatInfinity ? quiet_nan : rounded);
}

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_fp16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits & kSignBit) >> 16;
  const uint32_t magnitude = bits & ~kSignBit;
  // Normal results: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to
  // nearest even with the carry trick of float_to_bf16. A carry out of 65504's range (from
  // 65520 = 65504 + half its ulp up) lands on the infinity's encoding, as it should.
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t normal = (magnitude - (112u << 23) + 0xfffu + odd) >> 13;
  // Subnormal results (below 2^-14): adding 0.5 puts the value's multiples of 2^-24 (the
  // fp16 subnormal step) in the low mantissa bits of a float whose ulp is exactly 2^-24; the
  // addition rounds to nearest even.
  constexpr float kSubnormalMagic = 0.5f;
  const float shifted = std::bit_cast<float>(magnitude) + kSubnormalMagic;
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kSubnormalMagic);
  uint32_t result = magnitude < (113u << 23) ? subnormal : normal;
  // 2^16 and above (the float range beyond any rounding to 65504) is an infinity; NaNs stay
  // quiet NaNs.
  if (magnitude >= (143u << 23)) result = 0x7c00u;
  if (magnitude > kFloatInfinity) result = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  return static_cast<uint16_t>(sign | result);
}

float fp16_to_float(uint16_t half) {
  const uint32_t bits = static_cast<uint32_t>(half);
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t exponent = bits & 0x7c00u;
  uint32_t magnitude = ((bits & 0x7fffu) << 13) + (112u << 23);  // rebias 15 -> 127
  if (exponent == 0x7c00u) magnitude += 112u << 23;              // infinity, NaN: all ones
  float result = std::bit_cast<float>(magnitude);
  // Subnormal halves (and zero): the mantissa m gave 2^-14 * (1 + m/1024) above; subtracting
  // 2^-14 leaves m * 2^-24, exactly.
  if (exponent == 0) result = std::bit_cast<float>(magnitude + (1u << 23)) - 0x1p-14f;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(result) | sign);
}

namespace {

// The loops, one per format, so that the conversion inlines into each and vectorises. Where
// the compiler may use F16C (x86-64 since 2012; -march=native here), fp16 converts 8 values
// per instruction: the hardware rounds to nearest even too (the mode is given explicitly), so
// the bits are the same as the portable code's (the tests compare the two).
#if defined(__F16C__)
constexpr size_t kF16cLanes = 8;
size_t encode_fp16_f16c(const float* in, size_t n, float scale, uint16_t* out) {
  const __m256 scales = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + kF16cLanes <= n; i += kF16cLanes) {
    const __m256 values = _mm256_mul_ps(_mm256_loadu_ps(in + i), scales);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(values, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}
template <bool kAdd>
size_t decode_fp16_f16c(const uint16_t* in, size_t n, float unscale, float* data) {
  const __m256 unscales = _mm256_set1_ps(unscale);
  size_t i = 0;
  for (; i + kF16cLanes <= n; i += kF16cLanes) {
    const __m256 values = _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))), unscales);
    _mm256_storeu_ps(data + i, kAdd ? _mm256_add_ps(_mm256_loadu_ps(data + i), values) : values);
  }
  return i;
}
size_t round_through_fp16_f16c(float* data, size_t n, float scale, float unscale) {
  const __m256 scales = _mm256_set1_ps(scale), unscales = _mm256_set1_ps(unscale);
  size_t i = 0;
  for (; i + kF16cLanes <= n; i += kF16cLanes) {
    const __m128i halves = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(data + i), scales),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(data + i, _mm256_mul_ps(_mm256_cvtph_ps(halves), unscales));
  }
  return i;
}
#endif

template <uint16_t (*ToWire)(float)>
void encode(const float* __restrict in, size_t n, float scale, uint16_t* __restrict out) {
  size_t i = 0;
#if defined(__F16C__)
  if constexpr (ToWire == float_to_fp16) i = encode_fp16_f16c(in, n, scale, out);
#endif
  for (; i < n; ++i) out[i] = ToWire(in[i] * scale);
}
template <float (*FromWire)(uint16_t)>
void add_from(const uint16_t* __restrict in, size_t n, float unscale, float* __restrict data) {
  size_t i = 0;
#if defined(__F16C__)
  if constexpr (FromWire == fp16_to_float) i = decode_fp16_f16c<true>(in, n, unscale, data);
#endif
  for (; i < n; ++i) data[i] += FromWire(in[i]) * unscale;
}
template <float (*FromWire)(uint16_t)>
void decode(const uint16_t* __restrict in, size_t n, float unscale, float* __restrict data) {
  size_t i = 0;
#if defined(__F16C__)
  if constexpr (FromWire == fp16_to_float) i = decode_fp16_f16c<false>(in, n, unscale, data);
#endif
  for (; i < n; ++i) data[i] = FromWire(in[i]) * unscale;
}
template <uint16_t (*ToWire)(float), float (*FromWire)(uint16_t)>
void round_through(float* __restrict data, size_t n, float scale, float unscale) {
  size_t i = 0;
#if defined(__F16C__)
  if constexpr (ToWire == float_to_fp16) i = round_through_fp16_f16c(data, n, scale, unscale);
#endif
  for (; i < n; ++i) data[i] = FromWire(ToWire(data[i] * scale)) * unscale;
}

// 2^exponent as a float: exact for the exponents fp16_exponents gives (and 0 for bf16).
float power_of_two(int exponent) {
  RINGTRAIN_CHECK(exponent >= -126 && exponent <= 127, "wire scale 2^{} is not a normal float",
                  exponent);
  return std::ldexp(1.0f, exponent);
}

void check_16_bit(GradWire wire) {
  RINGTRAIN_CHECK(wire != GradWire::kFp32, "the fp32 wire has no 16-bit conversion");
}

}  // namespace

void encode_wire(GradWire wire, const float* in, size_t n, int exponent, uint16_t* out) {
  check_16_bit(wire);
  const float scale = power_of_two(exponent);
  if (wire == GradWire::kBf16) {
    encode<float_to_bf16>(in, n, scale, out);
  } else {
    encode<float_to_fp16>(in, n, scale, out);
  }
}

void add_from_wire(GradWire wire, const uint16_t* in, size_t n, int exponent, float* data) {
  check_16_bit(wire);
  const float unscale = power_of_two(-exponent);
  if (wire == GradWire::kBf16) {
    add_from<bf16_to_float>(in, n, unscale, data);
  } else {
    add_from<fp16_to_float>(in, n, unscale, data);
  }
}

void decode_wire(GradWire wire, const uint16_t* in, size_t n, int exponent, float* data) {
  check_16_bit(wire);
  const float unscale = power_of_two(-exponent);
  if (wire == GradWire::kBf16) {
    decode<bf16_to_float>(in, n, unscale, data);
  } else {
    decode<fp16_to_float>(in, n, unscale, data);
  }
}

void round_through_wire(GradWire wire, float* data, size_t n, int exponent) {
  check_16_bit(wire);
  const float scale = power_of_two(exponent), unscale = power_of_two(-exponent);
  if (wire == GradWire::kBf16) {
    round_through<float_to_bf16, bf16_to_float>(data, n, scale, unscale);
  } else {
    round_through<float_to_fp16, fp16_to_float>(data, n, scale, unscale);
  }
}

// Why no partial sum overflows. Every rank's values are below 2^b (b = bound, over all ranks),
// N ranks, L = ceil(log2 N), reduce exponent e = 15 - L - b. A chunk's partial sum after k
// ranks' values, p_k = fl(wire(p_{k-1}) + v_k), satisfies |p_k| <= k 2^b: by induction, since
// rounding to nearest (float or fp16) is monotone and k 2^b is representable in both at scale
// 2^e (k 2^(b+e) <= N 2^(b+e) <= 2^15 <= 65504), rounding a value of at most k 2^b gives at
// most k 2^b. So every partial sum on the wire is at most 2^15 after scaling. The average,
// fl(p_N / N), is at most 2^b, so the allgather can scale by 2^(15 - b), L bits more.
//
// Why the scales are exact: values scaled by 2^e (e <= 100) are either normal floats (exact)
// or below 2^-126, which fp16 rounds to zero either way; a nonzero fp16 value is at least
// 2^-24, so unscaling by 2^-e (e <= 100) gives at least 2^-124, a normal float (exact). Bounds
// of 2^100 and more would need e < -85 - L, where the unscaled sums could pass float's range:
// such a bucket (a diverged step) moves as fp32, as a NaN or an infinity does.
WireExponents fp16_exponents(int bound, int ranks, bool average) {
  RINGTRAIN_CHECK(ranks >= 1, "fp16 scale for {} ranks", ranks);
  if (bound == kNonFiniteBound || bound > kFp16LargestBound) return {.fits = false};
  if (bound == kAllZeroBound) return {};  // zeros: any scale is exact
  constexpr int kSmallestValues = 100;    // the largest exponent: tiny buckets scale this far
  const int headroom = static_cast<int>(std::bit_width(static_cast<unsigned>(ranks - 1)));
  const int reduce = std::min(kSmallestValues, 15 - headroom - bound);
  const int gather = average ? std::min(kSmallestValues, 15 - bound) : reduce;
  return {.fits = true, .reduce = reduce, .gather = gather};
}

}  // namespace ringtrain
