// Finite-difference gradient checks for every op in ops.h, in double precision: for a fixed
// random r the scalar L = sum(y * r) has dL/dy = r, so each *_backward called with dy = r must
// give dL/dx, dL/dw, dL/db, which are compared entry by entry against central differences of
// L. Then the float instantiation (the one that trains) is checked against the double one, and
// both conv2d paths (direct loops and im2col + GEMM) against a naive 7-loop convolution.
//
// Error measure everywhere: |a - n| / max(1, |a| + |n|), relative for large values and
// absolute for small ones. Bounds: 1e-6 for the gradient checks (with a step of 1e-6 the
// central difference is off by O(eps^2) truncation, zero for these ops, which are linear in
// each entry or piecewise so, except softmax_xent, plus the rounding error of L divided by
// 2 eps: at most 6e-8 here, for the 8->16 conv whose L sums 480 products of 72-term sums),
// 1e-4 for float against double (float's unit roundoff is 6e-8 and the longest sum here has
// 72 terms; the largest error seen is 2e-6), 1e-12 for conv2d in double against the naive
// reference (only the summation order differs).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/ops.h"

namespace {

using Vec = std::vector<double>;

// ---- the checker ----

constexpr double kEps = 1e-6;       // central-difference step
constexpr double kGradTol = 1e-6;   // analytic gradient against central differences (double)
constexpr double kFloatTol = 1e-4;  // float instantiation against the double one
constexpr double kRefTol = 1e-12;   // conv2d (double) against the naive reference

double rel_error(double a, double n) {
  return std::abs(a - n) / std::max(1.0, std::abs(a) + std::abs(n));
}

// The largest rel_error, over every entry i of v, between analytic[i] and the central
// difference (objective(v[i] + eps) - objective(v[i] - eps)) / (2 eps). objective reads v
// (by reference); each entry is restored exactly before the next is perturbed.
double max_fd_error(Vec& v, const Vec& analytic, const std::function<double()>& objective,
                    double eps = kEps) {
  REQUIRE(v.size() == analytic.size());
  double worst = 0.0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i];
    v[i] = saved + eps;
    const double plus = objective();
    v[i] = saved - eps;
    const double minus = objective();
    v[i] = saved;
    worst = std::max(worst, rel_error(analytic[i], (plus - minus) / (2.0 * eps)));
  }
  return worst;
}

// ---- helpers ----

double dot(const Vec& a, const Vec& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

// A typed null for the optional outputs (dx, dcols), so the template argument deduces.
constexpr double* kNoDx = nullptr;

size_t size_of(int64_t n) {
  return static_cast<size_t>(n);
}

// Uniform values in [lo, hi), rounded to float so the float and double instantiations see the
// same inputs and any difference between them is the arithmetic's.
Vec random_vec(std::mt19937_64& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(size_of(n));
  for (double& x : v) x = static_cast<double>(static_cast<float>(dist(rng)));
  return v;
}

// A buffer for an output that backward must overwrite: NaN shows any read or any entry left
// unwritten.
Vec poisoned(int64_t n) {
  return Vec(size_of(n), std::numeric_limits<double>::quiet_NaN());
}

std::vector<float> to_float(const Vec& v) {
  std::vector<float> f(v.size());
  std::transform(v.begin(), v.end(), f.begin(), [](double x) { return static_cast<float>(x); });
  return f;
}

double max_error(const std::vector<float>& actual, const Vec& expected) {
  REQUIRE(actual.size() == expected.size());
  double worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    worst = std::max(worst, rel_error(static_cast<double>(actual[i]), expected[i]));
  }
  return worst;
}

double max_error(const Vec& actual, const Vec& expected) {
  REQUIRE(actual.size() == expected.size());
  double worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    worst = std::max(worst, rel_error(actual[i], expected[i]));
  }
  return worst;
}

// Scratch for conv2d: B*H*W*9*Cin values on the im2col path, none (null) on the direct path.
template <typename T>
std::vector<T> conv_scratch(int64_t batch, int64_t height, int64_t width, int64_t cin,
                            int64_t cout) {
  if (!ringtrain::conv2d_uses_im2col(cin, cout)) return {};
  return std::vector<T>(size_of(batch * height * width * 9 * cin));
}

template <typename T>
T* data_or_null(std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

struct ConvCase {
  int64_t batch, height, width, cin, cout;
};

// The spatial shapes every conv2d check runs on: odd and even heights and widths, batch 2.
constexpr ConvCase kConvShapes[] = {{2, 5, 6, 0, 0}, {2, 4, 3, 0, 0}};

// The naive definition: y[b,h,w,co] = bias[co] + sum over kh, kw, ci of
// x[b, h+kh-1, w+kw-1, ci] * w[kh,kw,ci,co], out-of-image taps reading zero.
Vec naive_conv(const Vec& x, const Vec& w, const Vec& bias, const ConvCase& c) {
  Vec y(size_of(c.batch * c.height * c.width * c.cout));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.height; ++h)
      for (int64_t col = 0; col < c.width; ++col)
        for (int64_t co = 0; co < c.cout; ++co) {
          double sum = bias[size_of(co)];
          for (int64_t kh = 0; kh < 3; ++kh)
            for (int64_t kw = 0; kw < 3; ++kw)
              for (int64_t ci = 0; ci < c.cin; ++ci) {
                const int64_t ih = h + kh - 1, iw = col + kw - 1;
                if (ih < 0 || ih >= c.height || iw < 0 || iw >= c.width) continue;
                sum += x[size_of(((b * c.height + ih) * c.width + iw) * c.cin + ci)] *
                       w[size_of(((kh * 3 + kw) * c.cin + ci) * c.cout + co)];
              }
          y[size_of(((b * c.height + h) * c.width + col) * c.cout + co)] = sum;
        }
  return y;
}

// Inputs with pairwise distinct values at least 0.05 apart, so no perturbation of 1e-6 (or
// float rounding) changes which entry of a pooling window is the maximum.
Vec distinct_values(std::mt19937_64& rng, int64_t n) {
  Vec v(size_of(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05 * static_cast<double>(i) - 1.0;
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// Values at least 0.1 away from ReLU's kink at 0.
Vec away_from_zero(std::mt19937_64& rng, int64_t n) {
  Vec v = random_vec(rng, n, 0.1, 1.0);
  std::bernoulli_distribution negative(0.5);
  for (double& x : v) x = negative(rng) ? -x : x;
  return v;
}

}  // namespace

using ringtrain::conv2d_backward;
using ringtrain::conv2d_forward;
using ringtrain::conv2d_uses_im2col;
using ringtrain::dense_backward;
using ringtrain::dense_forward;
using ringtrain::maxpool2d_backward;
using ringtrain::maxpool2d_forward;
using ringtrain::relu_backward;
using ringtrain::relu_forward;
using ringtrain::softmax_xent;

TEST_CASE("dense_backward matches central differences (with and without dx)", "[gradcheck]") {
  constexpr int64_t kBatch = 3, kIn = 7, kOut = 4;
  std::mt19937_64 rng(1);
  Vec x = random_vec(rng, kBatch * kIn), w = random_vec(rng, kIn * kOut);
  Vec b = random_vec(rng, kOut);
  const Vec r = random_vec(rng, kBatch * kOut);
  const auto objective = [&] {
    Vec y(size_of(kBatch * kOut));
    dense_forward(x.data(), w.data(), b.data(), y.data(), kBatch, kIn, kOut);
    return dot(y, r);
  };

  Vec dw = poisoned(kIn * kOut), db = poisoned(kOut), dx = poisoned(kBatch * kIn);
  dense_backward(x.data(), w.data(), r.data(), dw.data(), db.data(), dx.data(), kBatch, kIn, kOut);
  CHECK(max_fd_error(w, dw, objective) < kGradTol);
  CHECK(max_fd_error(b, db, objective) < kGradTol);
  CHECK(max_fd_error(x, dx, objective) < kGradTol);

  SECTION("without dx the parameter gradients are the same") {
    Vec dw2 = poisoned(kIn * kOut), db2 = poisoned(kOut);
    dense_backward(x.data(), w.data(), r.data(), dw2.data(), db2.data(), kNoDx, kBatch, kIn, kOut);
    CHECK(dw2 == dw);
    CHECK(db2 == db);
  }
}

TEST_CASE("relu_backward matches central differences away from 0", "[gradcheck]") {
  constexpr int64_t kN = 40;
  std::mt19937_64 rng(2);
  Vec x = away_from_zero(rng, kN);
  const Vec r = random_vec(rng, kN);
  const auto objective = [&] {
    Vec y(size_of(kN));
    relu_forward(x.data(), y.data(), kN);
    return dot(y, r);
  };
  Vec y(size_of(kN));
  relu_forward(x.data(), y.data(), kN);
  Vec dx = poisoned(kN);
  relu_backward(y.data(), r.data(), dx.data(), kN);
  CHECK(max_fd_error(x, dx, objective) < kGradTol);
  // Both sides of the kink were exercised.
  CHECK(std::count(dx.begin(), dx.end(), 0.0) > 0);
  CHECK(std::count(dx.begin(), dx.end(), 0.0) < kN);
}

namespace {

// Checks dw, db and dx of conv2d_backward (on whichever path (cin, cout) selects) against
// central differences, then that a call without dx gives the same dw and db.
void check_conv_gradients(const ConvCase& c) {
  INFO("conv2d " << c.cin << "->" << c.cout << " on " << c.batch << "x" << c.height << "x"
                 << c.width << (conv2d_uses_im2col(c.cin, c.cout) ? " (im2col)" : " (direct)"));
  std::mt19937_64 rng(static_cast<uint64_t>(100 * c.cin + 10 * c.cout + c.height));
  const int64_t x_size = c.batch * c.height * c.width * c.cin;
  const int64_t y_size = c.batch * c.height * c.width * c.cout;
  const int64_t w_size = 9 * c.cin * c.cout;
  Vec x = random_vec(rng, x_size), w = random_vec(rng, w_size), b = random_vec(rng, c.cout);
  const Vec r = random_vec(rng, y_size);
  Vec fd_cols = conv_scratch<double>(c.batch, c.height, c.width, c.cin, c.cout);
  const auto objective = [&] {
    Vec y(size_of(y_size));
    conv2d_forward(x.data(), w.data(), b.data(), y.data(), data_or_null(fd_cols), c.batch, c.height,
                   c.width, c.cin, c.cout);
    return dot(y, r);
  };

  // backward on the im2col path reads the cols that forward left behind.
  Vec cols = conv_scratch<double>(c.batch, c.height, c.width, c.cin, c.cout);
  Vec dcols = conv_scratch<double>(c.batch, c.height, c.width, c.cin, c.cout);
  Vec y(size_of(y_size));
  conv2d_forward(x.data(), w.data(), b.data(), y.data(), data_or_null(cols), c.batch, c.height,
                 c.width, c.cin, c.cout);
  Vec dw = poisoned(w_size), db = poisoned(c.cout), dx = poisoned(x_size);
  std::fill(dcols.begin(), dcols.end(), std::numeric_limits<double>::quiet_NaN());
  conv2d_backward(x.data(), data_or_null(cols), w.data(), r.data(), dw.data(), db.data(), dx.data(),
                  data_or_null(dcols), c.batch, c.height, c.width, c.cin, c.cout);
  CHECK(max_fd_error(w, dw, objective) < kGradTol);
  CHECK(max_fd_error(b, db, objective) < kGradTol);
  CHECK(max_fd_error(x, dx, objective) < kGradTol);

  // Without dx (the first layer): no dcols either, and the same parameter gradients.
  Vec dw2 = poisoned(w_size), db2 = poisoned(c.cout);
  conv2d_backward(x.data(), data_or_null(cols), w.data(), r.data(), dw2.data(), db2.data(), kNoDx,
                  kNoDx, c.batch, c.height, c.width, c.cin, c.cout);
  CHECK(dw2 == dw);
  CHECK(db2 == db);
}

}  // namespace

TEST_CASE("conv2d_backward, direct path, matches central differences", "[gradcheck]") {
  REQUIRE_FALSE(conv2d_uses_im2col(1, 8));
  REQUIRE_FALSE(conv2d_uses_im2col(8, 16));
  for (const auto& [cin, cout] : {std::pair<int64_t, int64_t>{1, 8}, {8, 16}}) {
    for (ConvCase c : kConvShapes) {
      c.cin = cin;
      c.cout = cout;
      check_conv_gradients(c);
    }
  }
}

TEST_CASE("conv2d_backward, im2col path, matches central differences", "[gradcheck]") {
  REQUIRE(conv2d_uses_im2col(2, 3));
  REQUIRE(conv2d_uses_im2col(3, 5));
  for (const auto& [cin, cout] : {std::pair<int64_t, int64_t>{2, 3}, {3, 5}}) {
    for (ConvCase c : kConvShapes) {
      c.cin = cin;
      c.cout = cout;
      check_conv_gradients(c);
    }
  }
}

TEST_CASE("conv2d_forward on both paths matches a naive convolution", "[gradcheck]") {
  for (const auto& [cin, cout] : {std::pair<int64_t, int64_t>{1, 8}, {8, 16}, {3, 5}}) {
    for (ConvCase c : kConvShapes) {
      c.cin = cin;
      c.cout = cout;
      INFO("conv2d " << cin << "->" << cout << " on " << c.height << "x" << c.width
                     << (conv2d_uses_im2col(cin, cout) ? " (im2col)" : " (direct)"));
      std::mt19937_64 rng(static_cast<uint64_t>(7 * cin + cout + c.width));
      const Vec x = random_vec(rng, c.batch * c.height * c.width * cin);
      const Vec w = random_vec(rng, 9 * cin * cout), b = random_vec(rng, cout);
      Vec cols = conv_scratch<double>(c.batch, c.height, c.width, cin, cout);
      Vec y = poisoned(c.batch * c.height * c.width * cout);
      conv2d_forward(x.data(), w.data(), b.data(), y.data(), data_or_null(cols), c.batch, c.height,
                     c.width, cin, cout);
      CHECK(max_error(y, naive_conv(x, w, b, c)) < kRefTol);
    }
  }
}

TEST_CASE("maxpool2d_backward matches central differences for unique maxima", "[gradcheck]") {
  // 8 and 16 channels take the compile-time-width kernels, 3 the generic one.
  const int64_t kChannels = GENERATE(int64_t{3}, int64_t{8}, int64_t{16});
  INFO(kChannels << " channels");
  constexpr int64_t kBatch = 2, kHeight = 4, kWidth = 6;
  const int64_t kIn = kBatch * kHeight * kWidth * kChannels, kOut = kIn / 4;
  std::mt19937_64 rng(static_cast<uint64_t>(3 + kChannels));
  Vec x = distinct_values(rng, kIn);
  const Vec r = random_vec(rng, kOut);
  const auto objective = [&] {
    Vec y(size_of(kOut));
    maxpool2d_forward(x.data(), y.data(), kBatch, kHeight, kWidth, kChannels);
    return dot(y, r);
  };
  Vec y(size_of(kOut));
  maxpool2d_forward(x.data(), y.data(), kBatch, kHeight, kWidth, kChannels);
  Vec dx = poisoned(kIn);
  maxpool2d_backward(x.data(), y.data(), r.data(), dx.data(), kBatch, kHeight, kWidth, kChannels);
  CHECK(max_fd_error(x, dx, objective) < kGradTol);
  // Exactly one entry per window receives the gradient.
  CHECK(std::count(dx.begin(), dx.end(), 0.0) == kIn - kOut);
}

TEST_CASE("maxpool2d_backward sends a tied window's gradient to its first maximum", "[gradcheck]") {
  // One 2x2 window, one channel, all four inputs equal; then the last three equal.
  for (const Vec& x : {Vec{1.0, 1.0, 1.0, 1.0}, Vec{0.0, 2.0, 2.0, 2.0}}) {
    Vec y(1), dx = poisoned(4);
    const Vec dy = {0.5};
    maxpool2d_forward(x.data(), y.data(), 1, 2, 2, 1);
    maxpool2d_backward(x.data(), y.data(), dy.data(), dx.data(), 1, 2, 2, 1);
    const Vec expected = x[0] == y[0] ? Vec{0.5, 0.0, 0.0, 0.0} : Vec{0.0, 0.5, 0.0, 0.0};
    CHECK(dx == expected);
  }
}

TEST_CASE("softmax_xent's dlogits match central differences of its mean loss", "[gradcheck]") {
  constexpr int64_t kBatch = 4, kClasses = 5;
  std::mt19937_64 rng(4);
  Vec logits = random_vec(rng, kBatch * kClasses, -3.0, 3.0);
  const std::vector<int32_t> labels = {0, 3, 4, 3};
  const auto objective = [&] {
    return softmax_xent(logits.data(), labels.data(), static_cast<double*>(nullptr), kBatch,
                        kClasses, nullptr);
  };
  Vec dlogits = poisoned(kBatch * kClasses);
  int64_t correct = -1;
  const double loss =
      softmax_xent(logits.data(), labels.data(), dlogits.data(), kBatch, kClasses, &correct);
  CHECK(loss == objective());
  CHECK(max_fd_error(logits, dlogits, objective) < kGradTol);

  int64_t expected_correct = 0;
  for (int64_t row = 0; row < kBatch; ++row) {
    const auto begin = logits.begin() + row * kClasses;
    expected_correct +=
        std::max_element(begin, begin + kClasses) - begin == labels[size_of(row)] ? 1 : 0;
  }
  CHECK(correct == expected_correct);

  const std::vector<int32_t> bad_labels = {0, 1, 5, 2};
  CHECK_THROWS_AS(
      softmax_xent(logits.data(), bad_labels.data(), dlogits.data(), kBatch, kClasses, nullptr),
      ringtrain::Error);
}

TEST_CASE("the float instantiation computes the same math as the double one", "[gradcheck]") {
  std::mt19937_64 rng(5);

  SECTION("dense") {
    constexpr int64_t kBatch = 3, kIn = 9, kOut = 4;
    const Vec x = random_vec(rng, kBatch * kIn), w = random_vec(rng, kIn * kOut);
    const Vec b = random_vec(rng, kOut), dy = random_vec(rng, kBatch * kOut);
    Vec y(size_of(kBatch * kOut)), dw(size_of(kIn * kOut)), db(size_of(kOut));
    Vec dx(size_of(kBatch * kIn));
    dense_forward(x.data(), w.data(), b.data(), y.data(), kBatch, kIn, kOut);
    dense_backward(x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), kBatch, kIn,
                   kOut);
    const auto xf = to_float(x), wf = to_float(w), bf = to_float(b), dyf = to_float(dy);
    std::vector<float> yf(y.size()), dwf(dw.size()), dbf(db.size()), dxf(dx.size());
    dense_forward(xf.data(), wf.data(), bf.data(), yf.data(), kBatch, kIn, kOut);
    dense_backward(xf.data(), wf.data(), dyf.data(), dwf.data(), dbf.data(), dxf.data(), kBatch,
                   kIn, kOut);
    CHECK(max_error(yf, y) < kFloatTol);
    CHECK(max_error(dwf, dw) < kFloatTol);
    CHECK(max_error(dbf, db) < kFloatTol);
    CHECK(max_error(dxf, dx) < kFloatTol);
  }

  SECTION("relu") {
    constexpr int64_t kN = 32;
    const Vec x = away_from_zero(rng, kN), dy = random_vec(rng, kN);
    Vec y(size_of(kN)), dx(size_of(kN));
    relu_forward(x.data(), y.data(), kN);
    relu_backward(y.data(), dy.data(), dx.data(), kN);
    const auto xf = to_float(x), dyf = to_float(dy);
    std::vector<float> yf(size_of(kN)), dxf(size_of(kN));
    relu_forward(xf.data(), yf.data(), kN);
    relu_backward(yf.data(), dyf.data(), dxf.data(), kN);
    CHECK(max_error(yf, y) < kFloatTol);
    CHECK(max_error(dxf, dx) < kFloatTol);
  }

  SECTION("conv2d, both paths") {
    for (const auto& [cin, cout] : {std::pair<int64_t, int64_t>{1, 8}, {8, 16}, {2, 3}, {3, 5}}) {
      for (const ConvCase& shape : kConvShapes) {
        const int64_t batch = shape.batch, height = shape.height, width = shape.width;
        INFO("conv2d " << cin << "->" << cout << " on " << height << "x" << width);
        const int64_t pixels = batch * height * width;
        const Vec x = random_vec(rng, pixels * cin), w = random_vec(rng, 9 * cin * cout);
        const Vec b = random_vec(rng, cout), dy = random_vec(rng, pixels * cout);
        Vec cols = conv_scratch<double>(batch, height, width, cin, cout), dcols = cols;
        Vec y(size_of(pixels * cout)), dw(w.size()), db(b.size()), dx(x.size());
        conv2d_forward(x.data(), w.data(), b.data(), y.data(), data_or_null(cols), batch, height,
                       width, cin, cout);
        conv2d_backward(x.data(), data_or_null(cols), w.data(), dy.data(), dw.data(), db.data(),
                        dx.data(), data_or_null(dcols), batch, height, width, cin, cout);
        const auto xf = to_float(x), wf = to_float(w), bf = to_float(b), dyf = to_float(dy);
        auto colsf = conv_scratch<float>(batch, height, width, cin, cout), dcolsf = colsf;
        std::vector<float> yf(y.size()), dwf(dw.size()), dbf(db.size()), dxf(dx.size());
        conv2d_forward(xf.data(), wf.data(), bf.data(), yf.data(), data_or_null(colsf), batch,
                       height, width, cin, cout);
        conv2d_backward(xf.data(), data_or_null(colsf), wf.data(), dyf.data(), dwf.data(),
                        dbf.data(), dxf.data(), data_or_null(dcolsf), batch, height, width, cin,
                        cout);
        CHECK(max_error(yf, y) < kFloatTol);
        CHECK(max_error(dwf, dw) < kFloatTol);
        CHECK(max_error(dbf, db) < kFloatTol);
        CHECK(max_error(dxf, dx) < kFloatTol);
      }
    }
  }

  SECTION("maxpool2d") {
    constexpr int64_t kBatch = 2, kHeight = 4, kWidth = 6, kChannels = 3;
    constexpr int64_t kIn = kBatch * kHeight * kWidth * kChannels, kOut = kIn / 4;
    const Vec x = distinct_values(rng, kIn), dy = random_vec(rng, kOut);
    Vec y(size_of(kOut)), dx(size_of(kIn));
    maxpool2d_forward(x.data(), y.data(), kBatch, kHeight, kWidth, kChannels);
    maxpool2d_backward(x.data(), y.data(), dy.data(), dx.data(), kBatch, kHeight, kWidth,
                       kChannels);
    const auto xf = to_float(x), dyf = to_float(dy);
    std::vector<float> yf(size_of(kOut)), dxf(size_of(kIn));
    maxpool2d_forward(xf.data(), yf.data(), kBatch, kHeight, kWidth, kChannels);
    maxpool2d_backward(xf.data(), yf.data(), dyf.data(), dxf.data(), kBatch, kHeight, kWidth,
                       kChannels);
    CHECK(max_error(yf, y) < kFloatTol);
    CHECK(max_error(dxf, dx) < kFloatTol);
  }

  SECTION("softmax_xent") {
    constexpr int64_t kBatch = 4, kClasses = 10;
    const Vec logits = random_vec(rng, kBatch * kClasses, -5.0, 5.0);
    const std::vector<int32_t> labels = {9, 0, 4, 4};
    Vec dlogits(logits.size());
    int64_t correct = 0, correct_f = 0;
    const double loss =
        softmax_xent(logits.data(), labels.data(), dlogits.data(), kBatch, kClasses, &correct);
    const auto logits_f = to_float(logits);
    std::vector<float> dlogits_f(logits.size());
    const double loss_f = softmax_xent(logits_f.data(), labels.data(), dlogits_f.data(), kBatch,
                                       kClasses, &correct_f);
    CHECK(rel_error(loss_f, loss) < kFloatTol);
    CHECK(max_error(dlogits_f, dlogits) < kFloatTol);
    CHECK(correct_f == correct);
  }
}

TEST_CASE("dense weight gradients computed in row blocks equal the whole-matrix gradient",
          "[gradcheck]") {
  constexpr int64_t kBatch = 3, kIn = 11, kOut = 5;
  std::mt19937_64 rng(21);
  const Vec x = random_vec(rng, kBatch * kIn), w = random_vec(rng, kIn * kOut);
  const Vec dy = random_vec(rng, kBatch * kOut);
  Vec whole(size_of(kIn * kOut)), db(size_of(kOut)), blocks = poisoned(kIn * kOut);
  ringtrain::dense_backward(x.data(), w.data(), dy.data(), whole.data(), db.data(),
                            static_cast<double*>(nullptr), kBatch, kIn, kOut);
  for (int64_t row = 0; row < kIn; row += 4) {
    ringtrain::dense_backward_weight_rows(x.data(), dy.data(), blocks.data(), kBatch, kIn, kOut,
                                          row, std::min(kIn, row + 4));
  }
  CHECK(max_error(blocks, whole) < 1e-12);
}
