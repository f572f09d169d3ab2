// The exact sum's terms of dense layers, from their kept rows (see dense_terms.h).
#include "ringtrain/dense_terms.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include <immintrin.h>

#include "ringtrain/check.h"
#include "ringtrain/exact_sum.h"

namespace ringtrain {

namespace {

// A float's magnitude as bits: non-negative floats order as their bits do, NaNs and infinities
// above every finite value, and an integer max vectorises where a float max with NaN checks
// does not.
inline uint32_t magnitude_bits(float v) {
  return std::bit_cast<uint32_t>(v) & 0x7fffffffu;
}
constexpr uint32_t kInfinityBits = 0x7f800000u;

// The kernel's vectors, written with intrinsics: an autovectoriser free to pick its loop
// vectorised the wrong one (the depth, with shuffles) for some tile shapes. Every lane is
// one fma (correctly rounded, so the same bits in every branch) and the conversion is
// fixed_point_term's, lane by lane.
namespace simd {
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
using F = __m512;
inline F zero() {
  return _mm512_setzero_ps();
}
inline F load(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void store(float* p, F v) {
  _mm512_storeu_ps(p, v);
}
inline F broadcast(float x) {
  return _mm512_set1_ps(x);
}
inline F fma(F a, F b, F c) {
  return _mm512_fmadd_ps(a, b, c);
}
// Eight int64 sums.
using Sums = __m512i;
inline Sums load_sums(const int64_t* p) {
  return _mm512_loadu_si512(p);
}
inline void store_sums(int64_t* p, Sums v) {
  _mm512_storeu_si512(p, v);
}
// sums + the terms of values[0 .. 8).
inline Sums add_terms8(Sums sums, const float* values, __m512d scale) {
  const __m512d magic = _mm512_set1_pd(0x1.8p52);
  const __m512d rounded = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(values)), scale, magic);
  return _mm512_add_epi64(
      sums, _mm512_sub_epi64(_mm512_castpd_si512(rounded), _mm512_castpd_si512(magic)));
}
using Scale = __m512d;
inline Scale scale_of(double scale) {
  return _mm512_set1_pd(scale);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kLanes = 8;
using F = __m256;
inline F zero() {
  return _mm256_setzero_ps();
}
inline F load(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void store(float* p, F v) {
  _mm256_storeu_ps(p, v);
}
inline F broadcast(float x) {
  return _mm256_set1_ps(x);
}
inline F fma(F a, F b, F c) {
  return _mm256_fmadd_ps(a, b, c);
}
struct Sums {
  __m256i half[2];
};
inline Sums load_sums(const int64_t* p) {
  return {{_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4))}};
}
inline void store_sums(int64_t* p, Sums v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v.half[0]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 4), v.half[1]);
}
using Scale = __m256d;
inline Scale scale_of(double scale) {
  return _mm256_set1_pd(scale);
}
inline Sums add_terms8(Sums sums, const float* values, Scale scale) {
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  for (int h = 0; h < 2; ++h) {
    const __m256d rounded =
        _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(values + 4 * h)), scale, magic);
    sums.half[h] = _mm256_add_epi64(
        sums.half[h], _mm256_sub_epi64(_mm256_castpd_si256(rounded), _mm256_castpd_si256(magic)));
  }
  return sums;
}
#else
constexpr int64_t kLanes = 4;
struct F {
  float lane[kLanes];
};
inline F zero() {
  return F{};
}
inline F load(const float* p) {
  F v;
  std::copy(p, p + kLanes, v.lane);
  return v;
}
inline void store(float* p, F v) {
  std::copy(v.lane, v.lane + kLanes, p);
}
inline F broadcast(float x) {
  return F{{x, x, x, x}};
}
inline F fma(F a, F b, F c) {
  for (int64_t l = 0; l < kLanes; ++l) c.lane[l] = std::fma(a.lane[l], b.lane[l], c.lane[l]);
  return c;
}
struct Sums {
  int64_t lane[8];
};
inline Sums load_sums(const int64_t* p) {
  Sums v;
  std::copy(p, p + 8, v.lane);
  return v;
}
inline void store_sums(int64_t* p, Sums v) {
  std::copy(v.lane, v.lane + 8, p);
}
using Scale = double;
inline Scale scale_of(double scale) {
  return scale;
}
inline Sums add_terms8(Sums sums, const float* values, Scale scale) {
  for (int l = 0; l < 8; ++l) sums.lane[l] += fixed_point_term(values[l], scale);
  return sums;
}
#endif
}  // namespace simd

// The weight tile's shape: kTileRows rows of w by two vectors of columns, whose dot products
// run as 8 independent fma chains, enough to hide the fma's latency; dy's rows of the tile
// are read from L1 for every row of w. A band of kBandRows rows is done tile column by tile
// column.
constexpr int64_t kTileRows = 4;  // weight_block's switch has a case for each count
constexpr int64_t kTileVectors = 2;
constexpr int64_t kTileColumns = kTileVectors * simd::kLanes;
constexpr int64_t kBandRows = 16;

struct Rows {
  const float* x_by_column;  // x_s[k][i] at i * stride + s * m + k
  const float* dy;           // dy_s[k][j] at (s * m + k) * out + j
  int64_t stride, out, m, shards;
  double scale;
  float* dots;  // scratch: shards x kTileRows x kTileColumns
};

// out[r * out_stride + c] = (received[r * out_stride + c] +) sum over s of the term of
// dot_s[i + r][j + c], for r < kRows, c < columns (<= kTileColumns). A partial tile computes
// all the tile's columns, reading dy past the row's end (into the next row, or the padding
// after the last): a column's dot products read that column alone, so the extra ones change
// nothing, and are not used.
template <int64_t kRows>
void weight_tile(const Rows& a, int64_t i, int64_t j, int64_t columns, const int64_t* received,
                 int64_t* out, int64_t out_stride) {
  // Every micro-shard's dot products first, into the scratch (L1), then their terms summed
  // element by element.
  for (int64_t s = 0; s < a.shards; ++s) {
    simd::F dot[kRows][kTileVectors];
    for (auto& row : dot)
      for (auto& v : row) v = simd::zero();
    const float* x = a.x_by_column + i * a.stride + s * a.m;
    const float* dy = a.dy + s * a.m * a.out + j;
    for (int64_t k = 0; k < a.m; ++k, dy += a.out) {
      simd::F dy_k[kTileVectors];
      for (int64_t v = 0; v < kTileVectors; ++v) dy_k[v] = simd::load(dy + v * simd::kLanes);
      for (int64_t r = 0; r < kRows; ++r) {
        const simd::F xk = simd::broadcast(x[r * a.stride + k]);
        for (int64_t v = 0; v < kTileVectors; ++v) dot[r][v] = simd::fma(xk, dy_k[v], dot[r][v]);
      }
    }
    float* kept = a.dots + s * kRows * kTileColumns;
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t v = 0; v < kTileVectors; ++v)
        simd::store(kept + r * kTileColumns + v * simd::kLanes, dot[r][v]);
  }
  for (int64_t r = 0; r < kRows; ++r) {
    alignas(64) int64_t sums[kTileColumns];
    for (int64_t c = 0; c < columns; ++c)
      sums[c] = received != nullptr ? received[r * out_stride + c] : 0;
    const int64_t whole = columns / 8 * 8;
    const simd::Scale scale = simd::scale_of(a.scale);
    const float* row = a.dots + r * kTileColumns;
    constexpr int64_t kShardStep = kRows * kTileColumns;
    // Eight columns at a time over every micro-shard, their sums in a register.
    for (int64_t c = 0; c < whole; c += 8) {
      simd::Sums sum = simd::load_sums(sums + c);
      for (int64_t s = 0; s < a.shards; ++s)
        sum = simd::add_terms8(sum, row + s * kShardStep + c, scale);
      simd::store_sums(sums + c, sum);
    }
    for (int64_t s = 0; s < a.shards; ++s)
      for (int64_t c = whole; c < columns; ++c)
        sums[c] += fixed_point_term(row[s * kShardStep + c], a.scale);
    std::copy(sums, sums + columns, out + r * out_stride);
  }
}

// The block of w's rows [i0, i1) and columns [j0, j1): out and received point at element
// (i0, j0) and step `out` floats a row, as the gradient buffer does.
void weight_block(const Rows& a, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                  const int64_t* received, int64_t* out) {
  // Bands of rows, and in each, column tiles outside and rows inside: dy's tile stays in L1
  // over the band's rows, and the band's sums (received, out) are a few contiguous rows.
  for (int64_t band = i0; band < i1; band += kBandRows) {
    const int64_t band_end = std::min(i1, band + kBandRows);
    for (int64_t j = j0; j < j1; j += kTileColumns) {
      const int64_t columns = std::min(kTileColumns, j1 - j);
      for (int64_t i = band; i < band_end; i += kTileRows) {
        const int64_t at = (i - i0) * a.out + (j - j0);
        const int64_t* in = received != nullptr ? received + at : nullptr;
        switch (std::min(kTileRows, band_end - i)) {
          case 1:
            weight_tile<1>(a, i, j, columns, in, out + at, a.out);
            break;
          case 2:
            weight_tile<2>(a, i, j, columns, in, out + at, a.out);
            break;
          case 3:
            weight_tile<3>(a, i, j, columns, in, out + at, a.out);
            break;
          default:
            weight_tile<4>(a, i, j, columns, in, out + at, a.out);
        }
      }
    }
  }
}

// out[c] = (received[c] +) sum over s of the term of db_s[j + c], c < columns <= kTileColumns.
void bias_tile(const Rows& a, int64_t j, int64_t columns, const int64_t* received, int64_t* out) {
  int64_t sums[kTileColumns];
  for (int64_t c = 0; c < columns; ++c) sums[c] = received != nullptr ? received[c] : 0;
  for (int64_t s = 0; s < a.shards; ++s) {
    float sum[kTileColumns] = {};
    for (int64_t k = 0; k < a.m; ++k) {
      const float* __restrict dy = a.dy + (s * a.m + k) * a.out + j;
      for (int64_t c = 0; c < columns; ++c) sum[c] += dy[c];
    }
    for (int64_t c = 0; c < columns; ++c) sums[c] += fixed_point_term(sum[c], a.scale);
  }
  std::copy(sums, sums + columns, out);
}

}  // namespace

std::unique_ptr<DenseShardTerms> DenseShardTerms::make_for(const Model& model, int64_t rows,
                                                           int64_t local_micro_shards) {
  if (!model.can_stack_micro_shards(rows)) return nullptr;
  for (int i = 0; i < model.num_layers(); ++i)
    if (!model.layer(i).param_specs().empty() && !model.layer(i).dense_sizes()) return nullptr;
  return std::make_unique<DenseShardTerms>(model, rows, local_micro_shards);
}

DenseShardTerms::DenseShardTerms(const Model& model, int64_t rows, int64_t local_micro_shards)
    : rows_(rows), shards_(local_micro_shards) {
  RINGTRAIN_CHECK(rows >= 1 && local_micro_shards >= 1, "{} micro-shards of {} rows",
                  local_micro_shards, rows);
  const int64_t stacked = rows * local_micro_shards;
  for (int i = 0; i < model.num_layers(); ++i) {
    if (model.layer(i).param_specs().empty()) continue;
    const std::optional<DenseSizes> sizes = model.layer(i).dense_sizes();
    RINGTRAIN_CHECK(sizes.has_value(), "{} is not a dense layer: its gradients need the layer",
                    model.layer_name(i));
    // Its weights then its bias, as the terms read them.
    const ParamView* weight = nullptr;
    const ParamView* bias = nullptr;
    for (const ParamView& view : model.param_views()) {
      if (view.layer != i) continue;
      (weight == nullptr ? weight : bias) = &view;
    }
    RINGTRAIN_CHECK(
        weight != nullptr && bias != nullptr && weight->size == sizes->in * sizes->out &&
            bias->size == sizes->out && bias->offset == weight->offset + weight->size,
        "{}: its weights and bias are not laid out as [in, out] then [out]", model.layer_name(i));
    Kept kept;
    kept.layer = i;
    kept.begin = weight->offset;
    kept.in = sizes->in;
    kept.out = sizes->out;
    kept.x_by_column.assign(static_cast<size_t>(kept.in * stacked), 0.0f);
    // Padded by a tile: a partial tile reads past the last row (weight_tile).
    kept.dy.assign(static_cast<size_t>(stacked * kept.out + kTileColumns), 0.0f);
    kept.dy_row_max.assign(static_cast<size_t>(stacked), 0.0f);
    kept_.push_back(std::move(kept));
  }
  dots_.assign(static_cast<size_t>(local_micro_shards * kTileRows * kTileColumns), 0.0f);
  std::sort(kept_.begin(), kept_.end(),
            [](const Kept& a, const Kept& b) { return a.begin < b.begin; });
}

int64_t DenseShardTerms::kept_bytes() const {
  int64_t bytes = 0;
  for (const Kept& kept : kept_)
    bytes += static_cast<int64_t>(
        (kept.x_by_column.size() + kept.dy.size() + kept.dy_row_max.size()) * sizeof(float));
  return bytes;
}

void DenseShardTerms::save(int layer, int64_t first_shard, const Tensor& x, const Tensor& dy) {
  const auto it = std::find_if(kept_.begin(), kept_.end(),
                               [layer](const Kept& kept) { return kept.layer == layer; });
  RINGTRAIN_CHECK(it != kept_.end(), "layer {} is not one of the dense layers kept", layer);
  Kept& kept = *it;
  const int64_t rows = x.dim(0);
  RINGTRAIN_CHECK(
      rows % rows_ == 0 && first_shard >= 0 && first_shard + rows / rows_ <= shards_ &&
          x.numel() == rows * kept.in && dy.numel() == rows * kept.out && dy.dim(0) == rows,
      "save of layer {}: {} rows from micro-shard {} of {} ({} micro-shards of {} "
      "rows), x {}, dy {}",
      layer, rows, first_shard, shards_, shards_, rows_, x.shape().str(), dy.shape().str());
  const int64_t stride = rows_ * shards_, first_row = first_shard * rows_;
  // x transposed, in blocks of columns so that both sides stay in cache.
  constexpr int64_t kBlock = 64;
  const float* in = x.data();
  for (int64_t i0 = 0; i0 < kept.in; i0 += kBlock) {
    const int64_t i1 = std::min(kept.in, i0 + kBlock);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = i0; i < i1; ++i)
        kept.x_by_column[static_cast<size_t>(i * stride + first_row + r)] = in[r * kept.in + i];
  }
  std::memcpy(kept.dy.data() + first_row * kept.out, dy.data(),
              static_cast<size_t>(rows * kept.out) * sizeof(float));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = dy.data() + r * kept.out;
    uint32_t largest = 0;
    for (int64_t j = 0; j < kept.out; ++j) largest = std::max(largest, magnitude_bits(row[j]));
    kept.dy_row_max[static_cast<size_t>(first_row + r)] = std::bit_cast<float>(largest);
  }
}

const DenseShardTerms::Kept& DenseShardTerms::kept_for(int64_t begin, int64_t end) const {
  auto it = std::upper_bound(kept_.begin(), kept_.end(), begin,
                             [](int64_t at, const Kept& kept) { return at < kept.begin; });
  RINGTRAIN_CHECK(it != kept_.begin(), "gradients [{}, {}) are before every dense layer", begin,
                  end);
  const Kept& kept = *std::prev(it);
  RINGTRAIN_CHECK(begin < end && end <= kept.begin + kept.in * kept.out + kept.out,
                  "gradients [{}, {}) are not inside one dense layer", begin, end);
  return kept;
}

int DenseShardTerms::bound(int64_t begin, int64_t end) const {
  const Kept& kept = kept_for(begin, end);
  const int64_t weights = kept.in * kept.out, stride = rows_ * shards_;
  const int64_t from = begin - kept.begin, to = end - kept.begin;
  const bool has_bias = to > weights;
  // max over the segment's weight rows of |x[k][i]|, per stacked row k
  std::vector<uint32_t>& x_max = x_max_;
  x_max.assign(static_cast<size_t>(stride), 0);
  if (from < weights) {
    const int64_t i0 = from / kept.out, i1 = (std::min(to, weights) + kept.out - 1) / kept.out;
    for (int64_t i = i0; i < i1; ++i) {
      const float* column = kept.x_by_column.data() + i * stride;
      for (int64_t k = 0; k < stride; ++k)
        x_max[static_cast<size_t>(k)] =
            std::max(x_max[static_cast<size_t>(k)], magnitude_bits(column[k]));
    }
  }
  // (m + 2) 2^-23, that is 2 (m + 2) unit roundoffs (2^-24): more than the fma chain's m
  // roundings and the double sum's; 2^-149 per operation: a subnormal result's absolute
  // rounding.
  const double widen = 1.0 + static_cast<double>(rows_ + 2) * 0x1p-23;
  const double floor = static_cast<double>(rows_ + 1) * 0x1p-149;
  int result = kAllZeroBound;
  for (int64_t s = 0; s < shards_; ++s) {
    double weight_bound = 0.0, bias_bound = 0.0;
    for (int64_t k = s * rows_; k < (s + 1) * rows_; ++k) {
      const auto row = static_cast<size_t>(k);
      const uint32_t dy_bits = magnitude_bits(kept.dy_row_max[row]);
      if (dy_bits >= kInfinityBits || x_max[row] >= kInfinityBits) return kNonFiniteBound;
      const auto dy_max = static_cast<double>(kept.dy_row_max[row]);
      weight_bound += static_cast<double>(std::bit_cast<float>(x_max[row])) * dy_max;
      bias_bound += dy_max;
    }
    const double largest =
        std::max(from < weights ? weight_bound : 0.0, has_bias ? bias_bound : 0.0);
    if (largest == 0.0) continue;  // every dot product of this micro-shard is exactly zero
    int exponent = 0;
    (void)std::frexp(largest * widen + floor, &exponent);  // = f * 2^exponent, f in [0.5, 1)
    if (exponent > 128) return kNonFiniteBound;            // could overflow float
    result = std::max(result, exponent);
  }
  return result;
}

int64_t DenseShardTerms::block_end(int64_t at, int64_t end) const {
  const Kept& kept = kept_for(at, end);
  const int64_t weights = kept.begin + kept.in * kept.out;
  if (at >= weights) return std::min(end, at + kept.out);  // in the bias
  const int64_t row = (at - kept.begin) / kept.out;
  const bool whole_row = (at - kept.begin) % kept.out == 0;
  const int64_t rows = whole_row ? kTileRows : 1;
  return std::min({end, weights, kept.begin + (row + rows) * kept.out});
}

int64_t DenseShardTerms::largest_block() const {
  int64_t widest = 0;
  for (const Kept& kept : kept_) widest = std::max(widest, kept.out);
  return kTileRows * widest;
}

void DenseShardTerms::terms(int64_t at, size_t n, int shift, const int64_t* received,
                            int64_t* out) const {
  if (n == 0) return;
  const Kept& kept = kept_for(at, at + static_cast<int64_t>(n));
  const Rows rows{.x_by_column = kept.x_by_column.data(),
                  .dy = kept.dy.data(),
                  .stride = rows_ * shards_,
                  .out = kept.out,
                  .m = rows_,
                  .shards = shards_,
                  .scale = std::ldexp(1.0, shift),
                  .dots = dots_.data()};
  const int64_t weights = kept.in * kept.out;
  const int64_t from = at - kept.begin, to = from + static_cast<int64_t>(n);
  // out[e] is element from + e of the layer; the weights row by row: a partial first row, the
  // whole rows, a partial last row.
  int64_t e = from;
  const auto weight_run = [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    const int64_t offset = i0 * kept.out + j0 - from;
    weight_block(rows, i0, i1, j0, j1, received != nullptr ? received + offset : nullptr,
                 out + offset);
  };
  const int64_t weight_end = std::min(to, weights);
  if (e < weight_end && e % kept.out != 0) {
    const int64_t i = e / kept.out;
    const int64_t j1 = std::min(kept.out, weight_end - i * kept.out);
    weight_run(i, i + 1, e % kept.out, j1);
    e = i * kept.out + j1;
  }
  if (e < weight_end) {
    const int64_t i0 = e / kept.out, i1 = weight_end / kept.out;
    if (i1 > i0) weight_run(i0, i1, 0, kept.out);
    e = std::max(e, i1 * kept.out);
  }
  if (e < weight_end) {  // a partial last row
    weight_run(e / kept.out, e / kept.out + 1, 0, weight_end - e);
    e = weight_end;
  }
  for (; e < to; e += kTileColumns) {  // the bias
    const int64_t columns = std::min(kTileColumns, to - e);
    bias_tile(rows, e - weights, columns, received != nullptr ? received + (e - from) : nullptr,
              out + (e - from));
  }
}

}  // namespace ringtrain
