// The exact sum's terms of a model of dense layers, computed from each layer's input and
// output gradient instead of from written-out weight gradients.
//
// A micro-shard's weight gradient is dw = x^T dy over its m rows, and its bias gradient
// db = the column sums of dy. Under --reproducible every micro-shard's dw must be rounded to
// fixed point on its own (exact_sum.h), which, done the obvious way, writes a full dw per
// micro-shard and reads it back twice (for its bound, for its conversion): for the default
// MLP at 8 micro-shards a rank, 20 MB written and read per step to produce 5.2 MB of sums.
// Here nothing of the kind is written: backward keeps each dense layer's x and dy (a few
// rows wide), and the ring asks for the fixed-point sum of a run of gradients when it sends
// them. Each of those is computed as
//
//   term_s[i][j] = round(dot_s[i][j] * 2^shift),  dot_s[i][j] = fma chain over k = 0 .. m-1 of
//                                                               x_s[k][i] * dy_s[k][j]
//   (bias: the float sum over k of dy_s[k][j], in order)
//
// summed over this rank's micro-shards s as int64, while the micro-shard's values are in
// registers. Each dot_s is one fixed sequence of correctly rounded operations on the
// micro-shard's own rows, so its bits do not depend on which rank computes it, on the tile it
// falls in, or on the build's vector width.
//
// The scale must be agreed before any term is rounded, so the bound is not read off the
// values (which are never written) but derived from the rows, for micro-shard s and a segment
// of weight rows I (and the bias, where the segment holds it):
//
//   |dot_s[i][j]| <= sum_k |x_s[k][i]| |dy_s[k][j]|
//                 <= sum_k max_{i in I} |x_s[k][i]| max_j |dy_s[k][j]|
//   |db_s[j]|     <= sum_k max_j |dy_s[k][j]|
//
// evaluated in double and widened by (1 + (m + 2) 2^-23) plus (m + 1) 2^-149 for the float
// rounding of the fma chain (at most m half-ulps relative to the same sum, or a subnormal's
// unit each), so that every computed value is below it. It is looser than the values' own
// maximum by the cancellation inside the dot products (a few bits of the 50; see
// docs/reproducibility.md). A bound of 2^128 or more (values that could overflow float) and a
// NaN or an infinity in x or dy count as non-finite: the segment averages to NaN, as a
// non-finite gradient does.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "ringtrain/model.h"
#include "ringtrain/tensor.h"

namespace ringtrain {

class DenseShardTerms {
 public:
  // Null unless every layer of `model` with parameters is dense and micro-shards of `rows`
  // rows stack (Model::can_stack_micro_shards): then its micro-shards are computed as one
  // stacked forward and Model::backward_inputs, and summed from this.
  static std::unique_ptr<DenseShardTerms> make_for(const Model& model, int64_t rows,
                                                   int64_t local_micro_shards);

  DenseShardTerms(const Model& model, int64_t rows, int64_t local_micro_shards);

  int64_t micro_shard_rows() const { return rows_; }
  int64_t local_micro_shards() const { return shards_; }
  // Dense layer `layer`'s input x and output gradient dy of micro-shards first_shard .. (their
  // rows stacked: a multiple of micro_shard_rows()), kept until the next step's save of them.
  void save(int layer, int64_t first_shard, const Tensor& x, const Tensor& dy);
  // This rank's bound (exact_sum.h: |value| < 2^bound, kAllZeroBound, kNonFiniteBound) over
  // its micro-shards of gradients [begin, end) of the model's buffer, which lie in one layer.
  int bound(int64_t begin, int64_t end) const;
  // out[e] = (received[e] +) sum over this rank's micro-shards s of round(g_s[at + e] * 2^shift)
  // for e < n; [at, at + n) lies in one layer.
  void terms(int64_t at, size_t n, int shift, const int64_t* received, int64_t* out) const;
  // Where a block of terms that starts at `at` (before `end`, in the same layer) had best end
  // for the kernel: after whole tile rows of the weights (the end of at's row, if it starts
  // inside one), or at `end`. Never more than largest_block() gradients.
  int64_t block_end(int64_t at, int64_t end) const;
  int64_t largest_block() const;
  // The bytes of the kept rows.
  int64_t kept_bytes() const;

 private:
  struct Kept {
    int layer = 0;
    int64_t begin = 0;  // the layer's weights [begin, begin + in * out), then its bias
    int64_t in = 0, out = 0;
    // [in][shards * rows]: x_s[k][i] at i * shards * rows + s * rows + k
    std::vector<float> x_by_column;
    std::vector<float> dy;          // [shards * rows][out]
    std::vector<float> dy_row_max;  // [shards * rows]: max_j |dy[k][j]|
  };
  const Kept& kept_for(int64_t begin, int64_t end) const;

  int64_t rows_;
  int64_t shards_;
  std::vector<Kept> kept_;  // one per dense layer, in buffer order
  // A tile's dot products of every micro-shard, between their computation and their terms.
  // Scratch of terms() and bound(), which are not called concurrently (the ring runs on one
  // thread): sized once, so that a step allocates nothing.
  mutable std::vector<float> dots_;
  mutable std::vector<uint32_t> x_max_;  // bound(): per stacked row, the segment's max |x|
};

}  // namespace ringtrain
