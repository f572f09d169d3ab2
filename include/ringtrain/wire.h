// The 16-bit wire formats of the gradient ring (--grad-wire): bf16 and fp16 values, converted
// from float32 by round to nearest, ties to even, and back exactly; and the per-bucket
// power-of-two scale that keeps fp16 from overflowing.
//
// The ring over a 16-bit wire (ring_allreduce_wire, ring.h) keeps every partial sum in
// float32 and rounds to 16 bits only what it sends: once per hop of the scatter-reduce, and
// once, by the owner, for the finished chunk that the allgather hands to every rank. What a
// value rounds to here depends on its bits alone, so every rank, on any x86-64, rounds alike.
//
//   format  bits (sign, exponent, mantissa)  unit roundoff  largest finite  smallest subnormal
//   bf16    1, 8, 7                          2^-8           ~3.39e38        2^-133
//   fp16    1, 5, 10                         2^-11          65504           2^-24
//
// bf16 has float32's exponent range: it needs no scale. fp16 does: values are multiplied by
// 2^exponent before rounding and by 2^-exponent after (both exact: powers of two, in range).
// fp16_exponents() chooses the exponent from the bound of the bucket over all ranks, so that
// no partial sum of the ring can exceed 2^15 on the wire (proof beside it in wire.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ringtrain {

// --grad-wire: what the gradient ring sends.
enum class GradWire { kFp32, kBf16, kFp16 };
// "fp32", "bf16" or "fp16"; anything else throws a usage Error naming --grad-wire.
GradWire parse_grad_wire(const std::string& flag);
const char* to_string(GradWire wire);      // "fp32", "bf16", "fp16"
size_t wire_element_bytes(GradWire wire);  // 4 or 2

// Round to nearest even, as IEEE 754 converts: overflow gives an infinity of the value's sign,
// a NaN stays a (quiet) NaN, subnormals are kept.
uint16_t float_to_bf16(float value);
uint16_t float_to_fp16(float value);
// Exact.
float bf16_to_float(uint16_t bits);
float fp16_to_float(uint16_t bits);

// out[i] = to_16(in[i] * 2^exponent), the 16-bit format `wire` (kBf16 or kFp16).
void encode_wire(GradWire wire, const float* in, size_t n, int exponent, uint16_t* out);
// data[i] += from_16(in[i]) * 2^-exponent.
void add_from_wire(GradWire wire, const uint16_t* in, size_t n, int exponent, float* data);
// data[i] = from_16(in[i]) * 2^-exponent.
void decode_wire(GradWire wire, const uint16_t* in, size_t n, int exponent, float* data);
// data[i] = from_16(to_16(data[i] * 2^exponent)) * 2^-exponent: what a rank holds after
// receiving data[i] over the wire.
void round_through_wire(GradWire wire, float* data, size_t n, int exponent);

// The scale exponents of one bucket on the fp16 wire, chosen from `bound` (exponent_bound,
// exact_sum.h, of the bucket's values, the max over every rank: |v| < 2^bound) for a ring of
// `ranks`. The scatter-reduce sends partial sums at 2^reduce, the allgather the finished
// chunks at 2^gather (an average is N times smaller than a sum: it gets log2 N more bits of
// range below). `fits` is false when the bucket holds a NaN or an infinity, or values of 2^100
// or more, which no fp16 scale carries: then the bucket moves as fp32.
struct WireExponents {
  bool fits = true;
  int reduce = 0;
  int gather = 0;
};
WireExponents fp16_exponents(int bound, int ranks, bool average);
// The largest bound fp16_exponents scales (values below 2^kFp16LargestBound).
inline constexpr int kFp16LargestBound = 100;

}  // namespace ringtrain
