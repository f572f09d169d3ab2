// Prints one hash of the exact sum's dense terms and bounds (dense_terms.h) for fixed random
// rows. tests/CMakeLists.txt builds it with dense_terms.cpp compiled for each of the kernel's
// branches (AVX-512, AVX2, plain x86-64): the hashes must agree, since every lane is one
// correctly rounded fma and one exact conversion.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "ringtrain/dense_terms.h"
#include "ringtrain/exact_sum.h"

int main() {
  using namespace ringtrain;
  ModelSpec spec;
  spec.hidden = {40, 24};  // partial tiles in both directions (see test_dense_terms.cpp)
  const auto model = make_model(spec);
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the bounds and the integer sums
  const auto mix = [&hash](uint64_t v) { hash = (hash ^ v) * 1099511628211ull; };
  // Magnitudes: x = u 2^(lo + r % span) and dy likewise, for u uniform in (-1, 1): gradients
  // of the usual sizes (a shift near 50); tiny ones, whose dot products are subnormal floats
  // and whose shift (above 127) is no float; huge ones mixed with small, whose shift is
  // negative and whose smaller terms round to 0 or to a few units.
  struct Magnitudes {
    int x_lo, x_span, dy_lo, dy_span;
  };
  const Magnitudes magnitudes[] = {{-12, 16, -20, 16}, {-75, 10, -80, 10}, {-10, 60, -10, 55}};
  for (const Magnitudes& size : magnitudes) {
    for (const int64_t m : {4, 8, 12}) {
      for (const int64_t shards : {1, 3}) {
        DenseShardTerms terms(*model, m, shards);
        std::mt19937 rng(static_cast<uint32_t>(m * 7 + shards));
        std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
        for (int layer = 0; layer < model->num_layers(); ++layer) {
          const auto sizes = model->layer(layer).dense_sizes();
          if (!sizes) continue;
          Tensor x(Shape{m * shards, sizes->in}), dy(Shape{m * shards, sizes->out});
          for (int64_t e = 0; e < x.numel(); ++e)
            x.data()[e] =
                std::ldexp(unit(rng), static_cast<int>(rng() % static_cast<unsigned>(size.x_span)) +
                                          size.x_lo);
          for (int64_t e = 0; e < dy.numel(); ++e)
            dy.data()[e] = std::ldexp(
                unit(rng),
                static_cast<int>(rng() % static_cast<unsigned>(size.dy_span)) + size.dy_lo);
          terms.save(layer, 0, x, dy);
        }
        std::vector<int64_t> sums(static_cast<size_t>(model->num_params()));
        for (const GradRange& range : model->grad_ranges()) {
          const int bound = terms.bound(range.begin, range.end);
          mix(static_cast<uint64_t>(bound));
          terms.terms(range.begin, static_cast<size_t>(range.end - range.begin),
                      fixed_point_shift(bound, shards * 4), nullptr, sums.data() + range.begin);
        }
        for (const int64_t sum : sums) mix(static_cast<uint64_t>(sum));
      }
    }
  }
  std::printf("%016llx\n", static_cast<unsigned long long>(hash));
  return 0;
}
