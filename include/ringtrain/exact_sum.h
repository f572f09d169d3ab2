// The exact reduction behind --reproducible: gradients summed as 64-bit fixed-point integers,
// so that the average of a global batch's micro-shard gradients has the same bits whichever
// rank computed which micro-shard, and however many ranks there were.
//
// Floating-point addition is not associative: summing the same values in another grouping
// (one rank adding 12 micro-shards, or 4 ranks adding 3 each and then the ring adding the
// four) changes the last bits, and a trajectory then drifts. Integer addition is associative.
// So each segment of the gradient buffer (one piece of Model::grad_ranges) gets one scale
// 2^shift that every rank agrees on, from the largest magnitude of that segment over every
// micro-shard of the job (an allgather of one exponent per segment); each micro-shard's values
// are rounded once to integers at that scale, summed as integers within the rank and across
// ranks by the ring (ring_allreduce_exact), and converted back once:
//
//   bound  = max over micro-shards j and elements i of exponent(|g_j[i]|)   (|g| < 2^bound;
//            for dense layers a bound derived from their rows, dense_terms.h)
//   shift  = 50 - ceil(log2 K) - bound       (K micro-shards: every sum stays within 2^50)
//   sum[i] = sum over j of round(g_j[i] * 2^shift)                           (exact)
//   avg[i] = float(double(sum[i]) * (2^-shift * double(1 / K)))
//
// Each term's rounding depends only on its value and the agreed shift, never on where it was
// summed; the integer sum is exact; the conversion back is one fixed sequence of correctly
// rounded operations. The result is therefore a function of the micro-shard gradients alone.
// Its error against the exact real average is at most half a unit of 2^-shift (the terms'
// rounding, averaged) plus the float rounding of the result: for a segment whose largest
// magnitude is M, below M * 2^(-50 + ceil(log2 K)) absolute per element, far below float's own
// 2^-24 relative to M. (50 bits, not 62: within 2^50 the conversions to and from double are
// exact with an addition, which vectorises on every x86-64.)
#pragma once

#include <bit>
#include <climits>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ringtrain/allreduce.h"
#include "ringtrain/comm.h"
#include "ringtrain/dense_terms.h"
#include "ringtrain/model.h"
#include "ringtrain/ring.h"
#include "ringtrain/tensor.h"

namespace ringtrain {

// exponent_bound of values that are all zero, and of values with a NaN or an infinity.
inline constexpr int kAllZeroBound = INT_MIN;
inline constexpr int kNonFiniteBound = INT_MAX;

// The smallest e with |v| < 2^e for every v; kAllZeroBound when all are zero (or there are
// none); kNonFiniteBound when any is NaN or infinite. Bounds combine by max.
int exponent_bound(std::span<const float> values);
// The scale exponent at which `terms` values, each below 2^bound in magnitude, round to
// integers whose sum stays within 2^50 (bound finite, not kAllZeroBound; terms >= 1).
int fixed_point_shift(int bound, int64_t terms);
// round-to-nearest-even(v * scale) for scale = 2^shift and |v * scale| <= 2^50: a term's one
// rounding. Doubles in [2^52, 2^53) are spaced exactly 1 apart, so adding 1.5 * 2^52 rounds
// to an integer and leaves it in the low mantissa bits; v * scale is exact in double, so a
// compiler that fuses the two into an fma changes nothing. Unlike llrint, this vectorises on
// every x86-64 (AVX2 has no packed double-to-int64 conversion).
inline int64_t fixed_point_term(float v, double scale) {
  constexpr double kRoundingMagic = 0x1.8p52;
  return std::bit_cast<int64_t>(static_cast<double>(v) * scale + kRoundingMagic) -
         std::bit_cast<int64_t>(kRoundingMagic);
}
// sums[i] += round-to-nearest-even(values[i] * 2^shift).
void add_fixed_point(std::span<const float> values, int shift, std::span<int64_t> sums);
// out[i] = float(double(sums[i]) * f), f = 2^-shift * double(1 / divisor): one rounding in
// double (1 / divisor is rounded once), then the float's.
void from_fixed_point(std::span<const int64_t> sums, int shift, int64_t divisor,
                      std::span<float> out);

// Model::grad_ranges() sorted by their start: the order in which ExactGradSum numbers the
// segments (its shifts, SegmentPiece::segment).
std::vector<GradRange> segments_in_buffer_order(std::span<const GradRange> segments);

// The micro-shard gradients of one step, averaged exactly over the job. Where they come from:
// - a model of dense layers whose micro-shards stack (DenseShardTerms): backward keeps each
//   layer's rows (DenseShardTerms::save, through dense_terms()), and the terms are computed
//   from them as the ring sends them; no micro-shard's gradients are ever written;
// - any other model: a rank computes its micro-shard j into shard_buffer(j) (the kept
//   buffers, then the model's gradient buffer for the last; Model::write_grads_to points
//   backward there), calling kept_in_place() for each but the last.
// average() then replaces [begin, end) of the model's buffer by the average over every
// micro-shard of the job; it reads the segments of [begin, end) only, which must by then be
// final in every micro-shard. The GradSync engine calls average() for each bucket through
// make_exact_allreduce, while backward of the last micro-shard runs (overlap) or after it;
// buckets never split a segment, so the scales, and so the bits, do not depend on the
// bucketing either.
class ExactGradSum {
 public:
  // grads: the model's flat gradient buffer (host memory), segments: Model::grad_ranges().
  // micro_shards: K, every micro-shard of the global batch (the divisor of the average);
  // local_micro_shards: this rank's share, the same on every rank. dense: the terms of a
  // model of dense layers (DenseShardTerms::make_for), or null: kept buffers. Allocates
  // everything.
  ExactGradSum(Comm& comm, float* grads, std::span<const GradRange> segments, int64_t micro_shards,
               int64_t local_micro_shards, const RingOptions& ring = {},
               std::unique_ptr<DenseShardTerms> dense = nullptr);
  ~ExactGradSum();

  // Where backward keeps the dense layers' rows; null: the micro-shards go to shard_buffer().
  DenseShardTerms* dense_terms() { return dense_.get(); }

  void begin_step();
  // Micro-shard `kept` (the count so far) is written into shard_buffer(kept) itself (by the
  // time its segments are averaged).
  void kept_in_place();
  // Kept micro-shard `shard`'s gradients [begin, end) are final this step: the bounds of the
  // segments inside the range are read now, while the values are in cache, instead of when
  // the segments are averaged. Optional; the bits are the same either way.
  void note_written(int64_t shard, int64_t begin, int64_t end);
  // Where micro-shard `shard` (0 .. local_micro_shards - 1) of this step is kept: its own
  // buffer, or, for the last, the model's gradient buffer.
  float* shard_buffer(int64_t shard);
  // Collective: [begin, end) must be a run of whole segments, the same on every rank, in the
  // same order, once per step each, after kept_in_place() was called local_micro_shards - 1
  // times.
  // A segment with a NaN or an infinity anywhere in the job averages to NaN everywhere.
  // The ring is ring_allreduce_exact: integers in the scatter-reduce, the averages' floats in
  // the allgather. Returns the bytes this rank sent (the bounds, counted as a ring allgather
  // would send them, and the ring's payload).
  int64_t average(int64_t begin, int64_t end);

  // The parameter servers' exact sum (--strategy ps): collective over comm (the workers), in
  // place of average(), after kept_in_place() was called local_micro_shards - 1 times. Agrees every
  // segment's scale with the other ranks and leaves in sums() this rank's fixed-point sum of
  // its micro-shards over the whole buffer; shifts[s] receives segment s's shift (segments()
  // order). A server adds the ranks' sums (integers: in any order) and converts back with
  // from_fixed_point(sum, shift, micro_shards()): what average() computes, bit for bit.
  // Returns false, on every rank, when some segment holds a NaN or an infinity in the job.
  bool local_sums(std::span<int> shifts);
  std::span<const int64_t> sums() const { return sums_; }
  // The gradient segments in buffer order: they tile the buffer.
  std::span<const GradRange> segments() const { return segments_; }

  // Throws unless this step's average() calls covered the whole buffer (a GradSync over
  // another Allreduce would leave all but the last micro-shard out, silently).
  void finish_step() const;
  // The bytes kept per step for the micro-shards: the dense layers' rows, or (local_micro_shards
  // - 1) x the gradient buffer.
  int64_t kept_bytes() const;

  int64_t micro_shards() const { return micro_shards_; }
  int64_t local_micro_shards() const { return local_micro_shards_; }
  Comm& comm() { return comm_; }
  const float* grads() const { return grads_; }

 private:
  // Micro-shard `shard` of this rank (the kept buffers, then the model's), one segment of it.
  std::span<const float> values(int64_t shard, const GradRange& segment) const;
  // Collective: the job's bound of segments [first, first + count) into bounds_. Returns the
  // bytes this rank sent for it.
  int64_t agree(size_t first, size_t count);
  // out[i] = this rank's fixed-point sum of its micro-shards at element at + i (plus
  // received[i] when given), for n elements of segment `segment`, at the scale agree() found.
  void fixed_point_terms(size_t segment, int64_t at, size_t n, const int64_t* received,
                         int64_t* out) const;
  // result[i] = the average that the finished sum (these terms plus received[i]) stands for.
  void finish_terms(size_t segment, int64_t at, size_t n, const int64_t* received,
                    float* result) const;
  class RingTerms;  // the exact ring's view of one average() call (exact_sum.cpp)

  Comm& comm_;
  float* grads_;
  std::vector<GradRange> segments_;  // in buffer order
  int64_t micro_shards_;
  int64_t local_micro_shards_;
  RingOptions ring_;
  std::unique_ptr<DenseShardTerms> dense_;
  // finish_terms' integer sums of one DenseShardTerms block, before their conversion. The
  // ring finishes one piece at a time, on one thread.
  mutable std::vector<int64_t> block_sums_;
  // Without dense_: local_micro_shards - 1 buffers, Tensors for their alignment: 64 bytes, as the
  // model's gradient buffer. Backward writes micro-shards into them, and Eigen's GEMMs can round
  // differently into a buffer of another alignment (16-byte aligned buffers changed the bits
  // of the default MLP): every micro-shard must be computed at the same alignment.
  std::vector<Tensor> kept_grads_;
  int64_t kept_ = 0;
  int64_t averaged_ = 0;     // gradients averaged this step
  std::vector<int> bounds_;  // the job's, per segment of one agree() call,
  size_t bounds_first_ = 0;  // from this segment on
  // This rank's integer sums of its micro-shards (local_sums), or the ring's partial sums.
  std::vector<int64_t> sums_;    // one per gradient
  std::vector<int> all_bounds_;  // every rank's
  // [shard][segment]: bounds read by note_written this step, and whether they were.
  std::vector<int> shard_bounds_;
  std::vector<uint8_t> shard_bound_known_;
  RingScratch scratch_;
};

// ExactGradSum::average behind the Allreduce interface, for the GradSync engines: run(data,
// count, kAvg) averages the buffer range at `data` (which must lie in the gradient buffer the
// sum was made over). Kind kExactRing. Keeps a reference to `sum`.
std::unique_ptr<Allreduce> make_exact_allreduce(ExactGradSum& sum);

}  // namespace ringtrain
