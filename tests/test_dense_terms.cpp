// The exact sum's dense kernel (dense_terms.h): its terms are, bit for bit, the definition
// computed one element at a time (an fma chain per micro-shard, one rounding to fixed point),
// for every tile shape and cut of the range; its bound holds every value it stands for; and
// the ring over it gives the same averages on every rank count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/dense_terms.h"
#include "ringtrain/exact_sum.h"
#include "ringtrain/grad_sync.h"
#include "support/thread_comm.h"

using namespace ringtrain;

namespace {

// An MLP whose widths are not multiples of any tile (4 rows, 32 or 16 columns): partial tiles
// in both directions, a 10-wide last layer.
std::unique_ptr<Model> odd_mlp() {
  ModelSpec spec;
  spec.hidden = {40, 24};
  return make_model(spec);
}

struct LayerRows {
  int layer = 0;
  int64_t in = 0, out = 0, begin = 0;
  Tensor x, dy;  // [shards * m, in], [shards * m, out]
};

// Random rows for every dense layer of `model`: x over several binades, dy of mixed signs; or
// (`flat`) each row one positive value, so that every dot product is the bound's sum itself.
std::vector<LayerRows> random_rows(const Model& model, int64_t rows, uint32_t seed,
                                   bool flat = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(flat ? 0.5f : -1.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-12, 3);
  std::vector<LayerRows> layers;
  for (int i = 0; i < model.num_layers(); ++i) {
    const auto sizes = model.layer(i).dense_sizes();
    if (!sizes) continue;
    LayerRows l{.layer = i, .in = sizes->in, .out = sizes->out};
    for (const ParamView& view : model.param_views())
      if (view.layer == i && view.name.ends_with("weight")) l.begin = view.offset;
    l.x = Tensor(Shape{rows, sizes->in});
    l.dy = Tensor(Shape{rows, sizes->out});
    for (int64_t e = 0; e < l.x.numel(); ++e) l.x.data()[e] = std::ldexp(unit(rng), binade(rng));
    for (int64_t e = 0; e < l.dy.numel(); ++e)
      l.dy.data()[e] = 1e-3f * std::ldexp(unit(rng), binade(rng));
    if (flat) {
      for (int64_t r = 0; r < rows; ++r) {
        std::fill_n(l.x.data() + r * sizes->in, sizes->in, l.x.data()[r * sizes->in]);
        std::fill_n(l.dy.data() + r * sizes->out, sizes->out, l.dy.data()[r * sizes->out]);
      }
    }
    layers.push_back(std::move(l));
  }
  return layers;
}

// The definition, element by element: micro-shard s's gradient of layer element e.
// The rows kept for `layer`, or null.
const LayerRows* rows_of(const std::vector<LayerRows>& layers, int layer) {
  for (const LayerRows& l : layers)
    if (l.layer == layer) return &l;
  return nullptr;
}

float reference_value(const LayerRows& l, int64_t m, int64_t s, int64_t e) {
  float value = 0.0f;
  if (e < l.in * l.out) {
    const int64_t i = e / l.out, j = e % l.out;
    for (int64_t k = 0; k < m; ++k)
      value =
          std::fma(l.x.data()[(s * m + k) * l.in + i], l.dy.data()[(s * m + k) * l.out + j], value);
  } else {
    for (int64_t k = 0; k < m; ++k) value += l.dy.data()[(s * m + k) * l.out + (e - l.in * l.out)];
  }
  return value;
}

}  // namespace

TEST_CASE("dense terms: the kernel's sums are the definition's, for any cut of the range",
          "[exact][dense]") {
  const auto model = odd_mlp();
  for (const int64_t m : {4, 8, 12}) {
    for (const int64_t shards : {1, 3}) {
      INFO(shards << " micro-shards of " << m << " rows");
      DenseShardTerms terms(*model, m, shards);
      const auto layers = random_rows(*model, m * shards, static_cast<uint32_t>(m * 10 + shards));
      for (const LayerRows& l : layers) terms.save(l.layer, 0, l.x, l.dy);
      std::mt19937 rng(7);
      for (const LayerRows& l : layers) {
        INFO("layer " << l.layer);
        const int64_t n = l.in * l.out + l.out;
        const int shift = 40;
        const double scale = std::ldexp(1.0, shift);
        std::vector<int64_t> expected(static_cast<size_t>(n)), received(static_cast<size_t>(n));
        for (int64_t e = 0; e < n; ++e) {
          received[static_cast<size_t>(e)] = static_cast<int64_t>(rng() % 1000) - 500;
          for (int64_t s = 0; s < shards; ++s)
            expected[static_cast<size_t>(e)] +=
                fixed_point_term(reference_value(l, m, s, e), scale);
        }
        // Whole, and cut at random places (partial rows, single elements, the bias alone).
        for (const bool random_cuts : {false, true}) {
          std::vector<int64_t> got(static_cast<size_t>(n), -1), plus(static_cast<size_t>(n), -1);
          for (int64_t at = 0; at < n;) {
            const int64_t size =
                random_cuts ? std::min<int64_t>(n - at, 1 + static_cast<int64_t>(rng() % 97)) : n;
            terms.terms(l.begin + at, static_cast<size_t>(size), shift, nullptr, got.data() + at);
            terms.terms(l.begin + at, static_cast<size_t>(size), shift, received.data() + at,
                        plus.data() + at);
            at += size;
          }
          CHECK(got == expected);
          for (int64_t e = 0; e < n; ++e)
            plus[static_cast<size_t>(e)] -= received[static_cast<size_t>(e)];
          CHECK(plus == expected);
        }
      }
    }
  }
}

TEST_CASE("dense terms: the bound holds every value, a few bits above the largest",
          "[exact][dense]") {
  const auto model = odd_mlp();
  constexpr int64_t m = 8, shards = 4;
  for (const bool flat : {false, true}) {
    for (const uint32_t seed : {1u, 2u, 3u}) {
      INFO("flat rows " << flat << ", seed " << seed);
      DenseShardTerms terms(*model, m, shards);
      const auto layers = random_rows(*model, m * shards, seed, flat);
      for (const LayerRows& l : layers) terms.save(l.layer, 0, l.x, l.dy);
      for (const GradRange& segment : model->grad_ranges()) {
        const LayerRows* l = rows_of(layers, segment.layer);
        REQUIRE(l != nullptr);
        std::vector<float> values;
        for (int64_t s = 0; s < shards; ++s)
          for (int64_t e = segment.begin; e < segment.end; ++e)
            values.push_back(reference_value(*l, m, s, e - l->begin));
        const int actual = exponent_bound(values);
        const int bound = terms.bound(segment.begin, segment.end);
        CHECK(bound >= actual);
        // Rows of one positive value each: the bound's sum is the largest value, so the bound
        // is its exponent, or one more from the widening.
        if (flat) CHECK(bound <= actual + 1);
        // With it, the bound is looser by the cancellation; 8 rows cancel a few bits at most
        // here (the test's data: that the bound is not absurdly loose).
        CHECK(bound <= actual + 8);
      }
    }
  }
}

TEST_CASE("dense terms: zeros, NaNs, infinities and overflow in the bound", "[exact][dense]") {
  const auto model = odd_mlp();
  constexpr int64_t m = 8;
  DenseShardTerms terms(*model, m, 1);
  auto layers = random_rows(*model, m, 5);
  const LayerRows& first =
      layers.front();  // dense(784->40): segment [begin, begin + 784 * 40 + 40)
  const int64_t end = first.begin + first.in * first.out + first.out;
  const auto save_all = [&] {
    for (const LayerRows& l : layers) terms.save(l.layer, 0, l.x, l.dy);
  };

  layers.front().dy.fill(0.0f);
  save_all();
  CHECK(terms.bound(first.begin, end) == kAllZeroBound);

  layers = random_rows(*model, m, 5);
  layers.front().x.data()[3] = std::numeric_limits<float>::quiet_NaN();  // row 0, input 3
  save_all();
  CHECK(terms.bound(first.begin, end) == kNonFiniteBound);
  // Weights of input 3 are in rows 3 of w only: the other rows' bound stays finite.
  CHECK(terms.bound(first.begin + 4 * first.out, first.begin + 8 * first.out) < kNonFiniteBound);

  layers = random_rows(*model, m, 5);
  layers.front().dy.data()[1] = std::numeric_limits<float>::infinity();
  save_all();
  CHECK(terms.bound(first.begin, end) == kNonFiniteBound);

  // Finite rows whose products could overflow float: non-finite too.
  layers = random_rows(*model, m, 5);
  layers.front().x.fill(1e30f);
  layers.front().dy.fill(1e20f);
  save_all();
  CHECK(terms.bound(first.begin, end) == kNonFiniteBound);
}

TEST_CASE("dense terms: the exact average has the same bits on 1 to 12 ranks", "[exact][dense]") {
  const auto model = odd_mlp();
  constexpr int64_t m = 8, shards = 12;
  const auto layers = random_rows(*model, m * shards, 11);
  const auto segments = model->grad_ranges();
  const auto n = static_cast<size_t>(model->num_params());
  std::vector<float> reference;
  for (const int ranks : {1, 2, 3, 4, 6, 12}) {
    INFO(ranks << " ranks");
    std::vector<std::vector<float>> results(static_cast<size_t>(ranks));
    run_ranks(ranks, [&](Comm& comm) {
      const int64_t local = shards / ranks;
      std::vector<float> grads(n, std::numeric_limits<float>::quiet_NaN());
      ExactGradSum sum(comm, grads.data(), segments, shards, local,
                       RingOptions{.segment_elements = 1000, .window = 2},
                       std::make_unique<DenseShardTerms>(*model, m, local));
      sum.begin_step();
      for (const LayerRows& l : layers) {
        const int64_t first_row = comm.rank() * local * m;
        const Tensor x =
            Tensor::view(const_cast<float*>(l.x.data()) + first_row * l.in, Shape{local * m, l.in});
        const Tensor dy = Tensor::view(const_cast<float*>(l.dy.data()) + first_row * l.out,
                                       Shape{local * m, l.out});
        sum.dense_terms()->save(l.layer, 0, x, dy);
      }
      for (const GradRange& segment : segments) sum.average(segment.begin, segment.end);
      sum.finish_step();
      results[static_cast<size_t>(comm.rank())] = grads;
    });
    if (reference.empty()) reference = results[0];
    for (const auto& result : results) {
      REQUIRE(result.size() == reference.size());
      CHECK(std::memcmp(result.data(), reference.data(), n * sizeof(float)) == 0);
    }
  }
  // And the average is the average of the micro-shards' values: within the float rounding of
  // the result (2^-24 relative, with a little room for the double product before it) plus the
  // terms' rounding, half a unit of 2^-shift each, so half a unit of 2^-shift in the average,
  // where shift = fixed_point_shift(bound, 12) with this data's bound of the segment.
  DenseShardTerms all(*model, m, shards);
  for (const LayerRows& l : layers) all.save(l.layer, 0, l.x, l.dy);
  for (const GradRange& segment : segments) {
    const LayerRows* l = rows_of(layers, segment.layer);
    REQUIRE(l != nullptr);
    const int shift = fixed_point_shift(all.bound(segment.begin, segment.end), shards);
    for (int64_t e = segment.begin; e < segment.end; ++e) {
      long double want = 0.0L;
      for (int64_t s = 0; s < shards; ++s) want += reference_value(*l, m, s, e - l->begin);
      want /= shards;
      const float got = reference[static_cast<size_t>(e)];
      CHECK(std::fabs(static_cast<long double>(got) - want) <=
            std::ldexp(std::fabs(want), -24) * (1.0L + 0x1p-20L) + std::ldexp(1.0L, -shift - 1));
    }
  }
}
