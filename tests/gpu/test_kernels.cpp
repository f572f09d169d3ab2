// Every kernel of kernels/kernels.h against its CPU twin, on random data of many sizes: 0, 1,
// odd sizes, sizes around the float4 boundary and the block size, and sizes above 2^20 (and
// above the 4096 x 256 threads of a capped grid, so the grid-stride loops go round). Where the
// GPU does the same IEEE operations in the same order as the CPU, the comparison is bit for
// bit (NaN compared as NaN: the GPU returns the canonical NaN where x86 keeps a payload);
// where it cannot (expf/logf, a different summation order), the tolerance is stated with its
// reason next to the check.
//
// The optimizer and EMA kernels spell out GCC's FMA contraction of the CPU loops
// (kernels/README.md). Each of those tests computes a host reference with std::fma in that
// same pattern: the GPU must equal it bit for bit wherever it runs. The CPU twin must equal
// it too when the CPU build contracts as GCC does on an FMA-capable x86-64 with -march=native
// (the project's default); a build without FMA (RINGTRAIN_NATIVE=OFF, another compiler) gets
// a WARN and a float32 tolerance instead, since then the two sides round differently by
// design.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "gpu/device_buffer.h"
#include "kernels.h"
#include "layout.h"
#include "ringtrain/ops.h"
#include "ringtrain/optim.h"

namespace {

using ringtrain::test::DeviceBuffer;
namespace gpu = ringtrain::gpu;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
// float32 unit roundoff (half an ulp of 1).
constexpr double kUnitRoundoff = 0x1p-24;

// Sizes for the elementwise kernels: empty, tiny, around 4 (float4) and 256 (a block),
// odd, above 2^20, and above 4096 blocks x 256 threads x 4 floats (every loop goes round).
const std::vector<int64_t> kSizes = {0,
                                     1,
                                     2,
                                     3,
                                     4,
                                     5,
                                     7,
                                     31,
                                     32,
                                     33,
                                     255,
                                     256,
                                     257,
                                     1000,
                                     4099,
                                     65537,
                                     (int64_t{1} << 20) + 3,
                                     (int64_t{5} << 20) + 3};

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Salts a vector with the values elementwise code must pass through correctly.
void add_specials(std::vector<float>& v) {
  const float specials[] = {kNaN,  -kNaN,  kInf,    -kInf, 0.0f,
                            -0.0f, 1e-40f, -1e-40f, 3e38f, -3e38f};  // denormals and near-overflow
  for (size_t i = 0; i < std::size(specials) && i * 7 < v.size(); ++i) v[i * 7] = specials[i];
}

bool same_value(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// Bit-for-bit equality (NaN == NaN), reporting the first difference.
void require_same(std::span<const float> actual, std::span<const float> expected,
                  const std::string& what) {
  REQUIRE(actual.size() == expected.size());
  size_t mismatches = 0;
  size_t first = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!same_value(actual[i], expected[i])) {
      if (mismatches++ == 0) first = i;
    }
  }
  INFO(what << ": " << mismatches << " of " << actual.size() << " values differ; the first at "
            << first << ": got " << (mismatches ? actual[first] : 0.0f) << ", expected "
            << (mismatches ? expected[first] : 0.0f));
  REQUIRE(mismatches == 0);
}

bool all_same(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same_value(a[i], b[i])) return false;
  }
  return true;
}

// |actual - expected| <= tolerance(i) for every value i (NaN where expected is NaN);
// `tolerance_name` says in the failure message what the tolerance is.
void require_within(std::span<const float> actual, std::span<const float> expected,
                    const std::function<double(size_t)>& tolerance,
                    const std::string& tolerance_name, const std::string& what) {
  REQUIRE(actual.size() == expected.size());
  size_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i];
    const double e = expected[i];
    const bool ok = std::isnan(e) ? std::isnan(a) : std::abs(a - e) <= tolerance(i);
    if (!ok && bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << actual.size() << " values outside " << tolerance_name
            << "; the first at " << first << ": got " << (bad ? actual[first] : 0.0f)
            << ", expected " << (bad ? expected[first] : 0.0f) << ", tolerance "
            << (bad ? tolerance(first) : 0.0));
  REQUIRE(bad == 0);
}

// |actual - expected| <= rel * |expected| + abs for every value.
void require_close(std::span<const float> actual, std::span<const float> expected, double rel,
                   double abs, const std::string& what) {
  require_within(
      actual, expected, [&](size_t i) { return rel * std::abs(double{expected[i]}) + abs; },
      "rel " + std::to_string(rel) + " abs " + std::to_string(abs), what);
}

template <typename T>
std::span<const T> cspan(const std::vector<T>& v) {
  return std::span<const T>(v.data(), v.size());
}

// (1 + u)^(n - 1) - 1 times magnitude: how far any order of float additions of n values whose
// absolute values sum to magnitude can land from the exact sum (see the bias_grad test).
double any_order_sum_bound(int64_t n, double magnitude) {
  return std::expm1(static_cast<double>(n - 1) * std::log1p(kUnitRoundoff)) * magnitude;
}

void device_sync() {
  RINGTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The ring's arithmetic: exact. Offsets 0..3 move the pointers off 16-byte alignment, alike
// (the float4 path after a scalar head) and unlike (the all-scalar path).
// ---------------------------------------------------------------------------------------

TEST_CASE("gpu::add_inplace equals Comm::add_inplace bit for bit at every size and offset",
          "[gpu][kernels]") {
  const std::vector<std::pair<int64_t, int64_t>> offsets = {{0, 0}, {1, 1}, {3, 3},
                                                            {0, 1}, {2, 1}, {1, 3}};
  for (const int64_t n : kSizes) {
    for (const auto& [dst_off, src_off] : offsets) {
      INFO("n " << n << ", dst offset " << dst_off << ", src offset " << src_off);
      const size_t len = static_cast<size_t>(n + 4);
      std::vector<float> dst = random_floats(len, static_cast<uint32_t>(n) + 1);
      std::vector<float> src = random_floats(len, static_cast<uint32_t>(n) + 2);
      add_specials(dst);
      add_specials(src);
      DeviceBuffer<float> d_dst(dst);
      DeviceBuffer<float> d_src(src);
      gpu::add_inplace(d_dst.data() + dst_off, d_src.data() + src_off, n, nullptr);
      // The twin: Comm::add_inplace's loop (out[i] += in[i]), on the same windows.
      std::vector<float> expected = dst;
      for (int64_t i = 0; i < n; ++i) expected[dst_off + i] += src[src_off + i];
      require_same(d_dst.download(), expected, "add_inplace");  // the guard values included
    }
  }
}

TEST_CASE("gpu::scale and gpu::divide equal x * f and x / d bit for bit", "[gpu][kernels]") {
  for (const int64_t n : kSizes) {
    for (const int64_t off : {0, 1, 2, 3}) {
      INFO("n " << n << ", offset " << off);
      const size_t len = static_cast<size_t>(n + 4);
      std::vector<float> x = random_floats(len, static_cast<uint32_t>(n) + 3, -100.0f, 100.0f);
      add_specials(x);
      for (const float factor : {0.25f, 1.0f / 3.0f, -7.0f}) {
        DeviceBuffer<float> d(x);
        gpu::scale(d.data() + off, factor, n, nullptr);
        std::vector<float> expected = x;
        for (int64_t i = 0; i < n; ++i) expected[off + i] *= factor;
        require_same(d.download(), expected, "scale");
      }
      for (const float divisor : {3.0f, 7.0f, 0.1f}) {  // ring.cpp's data[i] /= divisor
        DeviceBuffer<float> d(x);
        gpu::divide(d.data() + off, divisor, n, nullptr);
        std::vector<float> expected = x;
        for (int64_t i = 0; i < n; ++i) expected[off + i] /= divisor;
        require_same(d.download(), expected, "divide");
      }
    }
  }
}

TEST_CASE("gpu::count_nonfinite counts NaN and Inf exactly and adds to the count",
          "[gpu][kernels]") {
  for (const int64_t n : kSizes) {
    INFO("n " << n);
    std::vector<float> x = random_floats(static_cast<size_t>(n), 11, -1e38f, 1e38f);
    std::mt19937 rng(static_cast<uint32_t>(n));
    // About one in 50 values non-finite, at random places, plus the salted specials.
    for (float& v : x) {
      const auto r = rng() % 150;
      if (r == 0) v = kNaN;
      if (r == 1) v = kInf;
      if (r == 2) v = -kInf;
    }
    add_specials(x);
    const auto expected = static_cast<unsigned long long>(
        std::count_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); }));
    DeviceBuffer<float> d(x);
    DeviceBuffer<unsigned long long> count(std::vector<unsigned long long>{5});
    gpu::count_nonfinite(d.data(), n, count.data(), nullptr);
    CHECK(count.download()[0] == 5 + expected);
    gpu::count_nonfinite(d.data(), n, count.data(), nullptr);  // accumulates, never resets
    CHECK(count.download()[0] == 5 + 2 * expected);
  }
}

// ---------------------------------------------------------------------------------------
// ReLU and the dense bias: exact (comparisons and one addition).
// ---------------------------------------------------------------------------------------

TEST_CASE("gpu::relu_forward and relu_backward equal the CPU's bit for bit", "[gpu][kernels]") {
  for (const int64_t n : kSizes) {
    INFO("n " << n);
    const auto len = static_cast<size_t>(n);
    std::vector<float> x = random_floats(len, 21);
    std::vector<float> dy = random_floats(len, 22);
    add_specials(x);  // NaN passes through, -0 becomes +0, denormals kept
    add_specials(dy);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<float> d_y(len);
    DeviceBuffer<float> d_dy(dy);
    DeviceBuffer<float> d_dx(len);
    gpu::relu_forward(d_x.data(), d_y.data(), n, nullptr);
    gpu::relu_backward(d_y.data(), d_dy.data(), d_dx.data(), n, nullptr);
    std::vector<float> y(len);
    std::vector<float> dx(len);
    ringtrain::relu_forward(x.data(), y.data(), n);
    ringtrain::relu_backward(y.data(), dy.data(), dx.data(), n);
    // Bits, NaN payloads included: ReLU copies values, it does no arithmetic on them.
    const std::vector<float> gy = d_y.download();
    const std::vector<float> gdx = d_dx.download();
    REQUIRE(std::memcmp(gy.data(), y.data(), len * sizeof(float)) == 0);
    require_same(gdx, dx, "relu_backward");
  }
}

TEST_CASE("gpu::bias_add equals y + bias bit for bit", "[gpu][kernels]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {0, 5},      {5, 0},       {1, 1},
      {3, 7},      {128, 10},    {1000, 33},
      {4097, 256}, {1, 3000001}, {(int64_t{1} << 20) + 1, 3}};
  for (const auto& [rows, cols] : shapes) {
    INFO("rows " << rows << ", cols " << cols);
    const auto n = static_cast<size_t>(rows * cols);
    std::vector<float> y = random_floats(n, 31);
    std::vector<float> bias = random_floats(static_cast<size_t>(cols), 32);
    add_specials(y);
    DeviceBuffer<float> d_y(y);
    DeviceBuffer<float> d_bias(bias);
    gpu::bias_add(d_y.data(), d_bias.data(), rows, cols, nullptr);
    // The twin: dense_forward's broadcast of b, as y[r, c] + b[c] (dense_forward itself adds
    // the GEMM onto the bias, another order, so it is not the comparison here).
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) y[r * cols + c] += bias[c];
    }
    require_same(d_y.download(), y, "bias_add");
  }
}

// ---------------------------------------------------------------------------------------
// The bias gradient: a float column sum in another order than Eigen's, so a tolerance; and
// determinism, bit for bit.
// ---------------------------------------------------------------------------------------

TEST_CASE("gpu::bias_grad matches dense_backward's db and is deterministic", "[gpu][kernels]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},
                                                           {1, 17},
                                                           {2, 3},
                                                           {7, 3},
                                                           {128, 10},
                                                           {1000, 33},
                                                           {1024, 5},
                                                           {1025, 5},
                                                           {256, 512},
                                                           {100352, 8},
                                                           {100352, 16},
                                                           {3, 100000},
                                                           {65537, 17},
                                                           {(int64_t{1} << 20) + 7, 1},
                                                           {(int64_t{1} << 26) + 3, 2}};
  for (const auto& [rows, cols] : shapes) {
    INFO("rows " << rows << ", cols " << cols);
    std::vector<float> dy = random_floats(static_cast<size_t>(rows * cols), 41);
    DeviceBuffer<float> d_dy(dy);
    DeviceBuffer<float> d_db(static_cast<size_t>(cols));
    d_db.fill_bytes(0xff);  // NaN: every value must be overwritten
    gpu::bias_grad(d_dy.data(), d_db.data(), rows, cols, nullptr);
    const std::vector<float> db = d_db.download();

    // The CPU twin: dense_backward's db (x and w are zeros of in = 1; only db matters).
    std::vector<float> cpu_db(static_cast<size_t>(cols));
    {
      const std::vector<float> x(static_cast<size_t>(rows), 0.0f);
      const std::vector<float> w(static_cast<size_t>(cols), 0.0f);
      std::vector<float> dw(static_cast<size_t>(cols));
      ringtrain::dense_backward<float>(x.data(), w.data(), dy.data(), dw.data(), cpu_db.data(),
                                       nullptr, rows, 1, cols);
    }
    // Any order of float additions of `rows` values is within (1 + u)^(rows - 1) - 1 times
    // sum|dy| of the exact sum (u = 2^-24; each addition multiplies a partial sum's error by at
    // most 1 + u: Higham, Accuracy and Stability, 4.2, whose closed form gamma_{rows - 1} needs
    // (rows - 1) u < 1 and turns negative beyond 2^24 rows), so two orders are within twice
    // that of each other; the double sum stands in for the exact one. Past about 2^24 rows the
    // bound is vacuous: such a shape checks the indexing, that every value is written and the
    // determinism, not the rounding.
    for (int64_t c = 0; c < cols; ++c) {
      double exact = 0.0;
      double magnitude = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        exact += dy[r * cols + c];
        magnitude += std::abs(dy[r * cols + c]);
      }
      const double bound = any_order_sum_bound(rows, magnitude);
      INFO("column " << c);
      REQUIRE(std::abs(db[c] - exact) <= bound + 1e-30);
      REQUIRE(std::abs(static_cast<double>(db[c]) - cpu_db[c]) <= 2 * bound + 1e-30);
    }
    if (rows == 1) require_same(db, dy, "bias_grad of one row is that row");

    // Same input, same bits.
    d_db.fill_bytes(0);
    gpu::bias_grad(d_dy.data(), d_db.data(), rows, cols, nullptr);
    const std::vector<float> again = d_db.download();
    REQUIRE(std::memcmp(again.data(), db.data(), db.size() * sizeof(float)) == 0);

    // The split form with its workspace: the same bounds, same bits on a second run, and the
    // one-pass form's bits when no workspace is needed (rows <= 1024).
    const int64_t ws_floats = gpu::bias_grad_workspace_floats(rows, cols);
    CHECK((ws_floats == 0) == (rows <= 1024));
    DeviceBuffer<float> d_ws(static_cast<size_t>(ws_floats));
    d_db.fill_bytes(0xff);
    gpu::bias_grad(d_dy.data(), d_db.data(), rows, cols, d_ws.data(), ws_floats, nullptr);
    const std::vector<float> split = d_db.download();
    for (int64_t c = 0; c < cols; ++c) {
      double exact = 0.0;
      double magnitude = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        exact += dy[r * cols + c];
        magnitude += std::abs(dy[r * cols + c]);
      }
      INFO("split form, column " << c);
      REQUIRE(std::abs(split[c] - exact) <= any_order_sum_bound(rows, magnitude) + 1e-30);
    }
    if (ws_floats == 0) {
      REQUIRE(std::memcmp(split.data(), db.data(), db.size() * sizeof(float)) == 0);
    }
    d_db.fill_bytes(0);
    gpu::bias_grad(d_dy.data(), d_db.data(), rows, cols, d_ws.data(), ws_floats, nullptr);
    const std::vector<float> split_again = d_db.download();
    REQUIRE(std::memcmp(split_again.data(), split.data(), split.size() * sizeof(float)) == 0);
    if (ws_floats > 0) {  // too small a workspace is refused before any launch
      CHECK_THROWS_AS(
          gpu::bias_grad(d_dy.data(), d_db.data(), rows, cols, d_ws.data(), ws_floats - 1, nullptr),
          ringtrain::Error);
    }
  }

  SECTION("no rows: zeros (the sum of nothing)") {
    DeviceBuffer<float> d_db(5);
    d_db.fill_bytes(0xff);
    gpu::bias_grad(nullptr, d_db.data(), 0, 5, nullptr);
    CHECK(d_db.download() == std::vector<float>(5, 0.0f));
  }
}

// ---------------------------------------------------------------------------------------
// Softmax cross-entropy: expf/logf differ from glibc's by an ulp or two, so the loss and the
// gradient get a relative tolerance; the arg-max involves no arithmetic, so `correct` is exact.
// ---------------------------------------------------------------------------------------

namespace {

struct XentResult {
  gpu::XentStats stats;
  std::vector<float> dlogits;
};

XentResult run_gpu_xent(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                        int64_t rows, int64_t classes, bool want_dlogits = true) {
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> d_labels(labels);
  DeviceBuffer<float> d_dlogits(want_dlogits ? logits.size() : 0);
  d_dlogits.fill_bytes(0xff);
  DeviceBuffer<gpu::XentStats> d_stats(1);
  d_stats.fill_bytes(0xff);  // garbage the launcher must replace
  gpu::softmax_xent(d_logits.data(), d_labels.data(), want_dlogits ? d_dlogits.data() : nullptr,
                    rows, classes, d_stats.data(), nullptr);
  return XentResult{d_stats.download()[0], d_dlogits.download()};
}

// logits ~ N(0, 3^2), labels uniform; every fifth row gets a tie for its maximum (a copy of
// the max at another class), so the first-maximum rule is exercised on real data.
void make_xent_input(int64_t rows, int64_t classes, uint32_t seed, std::vector<float>& logits,
                     std::vector<int32_t>& labels) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  logits.resize(static_cast<size_t>(rows * classes));
  for (float& z : logits) z = normal(rng);
  labels.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    labels[r] = static_cast<int32_t>(rng() % static_cast<uint32_t>(classes));
    if (r % 5 == 0 && classes > 1) {
      float* z = logits.data() + r * classes;
      const int64_t top = std::max_element(z, z + classes) - z;
      const int64_t other = static_cast<int64_t>(rng() % static_cast<uint32_t>(classes));
      z[other] = z[top];
      if (r % 10 == 0) labels[r] = static_cast<int32_t>(std::max(top, other));  // the later tie
    }
  }
}

}  // namespace

TEST_CASE("gpu::softmax_xent matches the CPU's loss, gradient and correct count",
          "[gpu][kernels]") {
  // classes <= 32: a thread per row; more: a warp per row. rows * classes above 2^20 twice.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1},    {1, 10},    {7, 10},   {128, 10},  {1000, 10},   {33, 32},    {5, 33},
      {64, 100}, {64, 1000}, {3, 5000}, {2049, 31}, {200000, 10}, {1200, 1000}};
  for (const auto& [rows, classes] : shapes) {
    INFO("rows " << rows << ", classes " << classes);
    std::vector<float> logits;
    std::vector<int32_t> labels;
    make_xent_input(rows, classes, static_cast<uint32_t>(rows * 7 + classes), logits, labels);
    const XentResult gpu_result = run_gpu_xent(logits, labels, rows, classes);

    std::vector<float> cpu_dlogits(logits.size());
    int64_t cpu_correct = -1;
    const double cpu_mean = ringtrain::softmax_xent<float>(
        logits.data(), labels.data(), cpu_dlogits.data(), rows, classes, &cpu_correct);

    CHECK(gpu_result.stats.bad_labels == 0);
    CHECK(static_cast<int64_t>(gpu_result.stats.correct) == cpu_correct);
    // Loss: each row's log-sum-exp differs by a few float ulps (the GPU's expf is within 2 ulp,
    // logf within 1, glibc's within 1; the warp path also sums in another order): about 1e-6
    // of a loss of order 1, so 1e-5 relative leaves a margin.
    CHECK_THAT(gpu_result.stats.loss_sum / static_cast<double>(rows),
               Catch::Matchers::WithinRel(cpu_mean, 1e-5));
    // Gradient: exp of an argument that differs by a few ulps of log_sum (up to ~10 here)
    // is a few 1e-6 relative; at the label, (p - 1) / rows cancels, so the absolute part is
    // 1e-5 of 1 / rows.
    const double inv_rows = 1.0 / static_cast<double>(rows);
    require_close(gpu_result.dlogits, cpu_dlogits, 1e-5, 1e-5 * inv_rows, "dlogits");

    // No dlogits: the same statistics.
    const XentResult no_grad = run_gpu_xent(logits, labels, rows, classes, false);
    CHECK(std::bit_cast<uint64_t>(no_grad.stats.loss_sum) ==
          std::bit_cast<uint64_t>(gpu_result.stats.loss_sum));
    CHECK(no_grad.stats.correct == gpu_result.stats.correct);

    // Determinism: the same input gives the same bits, loss sum included.
    const XentResult again = run_gpu_xent(logits, labels, rows, classes);
    CHECK(std::bit_cast<uint64_t>(again.stats.loss_sum) ==
          std::bit_cast<uint64_t>(gpu_result.stats.loss_sum));
    CHECK(std::memcmp(again.dlogits.data(), gpu_result.dlogits.data(),
                      again.dlogits.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("gpu::softmax_xent counts bad labels and stays in bounds", "[gpu][kernels]") {
  for (const int64_t classes : {int64_t{10}, int64_t{40}}) {  // both kernel variants
    INFO("classes " << classes);
    const int64_t rows = 50;
    std::vector<float> logits;
    std::vector<int32_t> labels;
    make_xent_input(rows, classes, 51, logits, labels);
    const std::vector<int64_t> bad_rows = {0, 7, 31, 49};
    const int32_t bad_values[] = {-1, static_cast<int32_t>(classes),
                                  std::numeric_limits<int32_t>::max(),
                                  std::numeric_limits<int32_t>::min()};
    for (size_t i = 0; i < bad_rows.size(); ++i) labels[bad_rows[i]] = bad_values[i];
    const XentResult result = run_gpu_xent(logits, labels, rows, classes);
    CHECK(result.stats.bad_labels == bad_rows.size());

    // The good rows alone, on the CPU: the same loss sum and correct count.
    std::vector<float> good_logits;
    std::vector<int32_t> good_labels;
    for (int64_t r = 0; r < rows; ++r) {
      if (std::find(bad_rows.begin(), bad_rows.end(), r) != bad_rows.end()) continue;
      good_logits.insert(good_logits.end(), logits.begin() + r * classes,
                         logits.begin() + (r + 1) * classes);
      good_labels.push_back(labels[r]);
    }
    const auto good = static_cast<int64_t>(good_labels.size());
    int64_t cpu_correct = -1;
    const double cpu_mean = ringtrain::softmax_xent<float>(good_logits.data(), good_labels.data(),
                                                           nullptr, good, classes, &cpu_correct);
    CHECK(static_cast<int64_t>(result.stats.correct) == cpu_correct);
    CHECK_THAT(result.stats.loss_sum,
               Catch::Matchers::WithinRel(cpu_mean * static_cast<double>(good), 1e-5));

    // Every row's gradient against a double reference: (softmax - onehot) / rows for a good
    // row, softmax / rows for a bad one.
    const double inv_rows = 1.0 / static_cast<double>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* z = logits.data() + r * classes;
      const double max = *std::max_element(z, z + classes);
      double sum = 0.0;
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
      const int32_t label = labels[r];
      for (int64_t c = 0; c < classes; ++c) {
        const double expected = (std::exp(z[c] - max) / sum - (label == c ? 1.0 : 0.0)) * inv_rows;
        INFO("row " << r << ", class " << c);
        REQUIRE(std::abs(result.dlogits[r * classes + c] - expected) <=
                1e-5 * (std::abs(expected) + inv_rows));
      }
    }
  }
}

TEST_CASE("gpu::softmax_xent's arg-max is the CPU's first maximum, NaN and ties included",
          "[gpu][kernels]") {
  for (const int64_t classes : {int64_t{10}, int64_t{40}}) {
    INFO("classes " << classes);
    std::vector<std::vector<float>> rows_values;
    std::vector<int32_t> labels;
    auto row = [&](std::vector<std::pair<int64_t, float>> sets, int32_t label) {
      std::vector<float> z(static_cast<size_t>(classes));
      // Negative background values, below every value set on purpose.
      for (int64_t c = 0; c < classes; ++c) z[c] = -1.0f - static_cast<float>(c % 7) * 0.1f;
      for (const auto& [c, v] : sets) z[c] = v;
      rows_values.push_back(z);
      labels.push_back(label);
    };
    const int32_t last = static_cast<int32_t>(classes - 1);
    row({{2, 5.0f}, {last, 5.0f}}, 2);     // tie: the first wins -> correct
    row({{2, 5.0f}, {last, 5.0f}}, last);  // tie, label on the second -> not correct
    row({{3, kNaN}, {5, 9.0f}}, 5);        // NaN elsewhere never wins -> correct
    row({{3, 9.0f}, {5, kNaN}}, 3);        // NaN after the max -> correct
    row({{0, kNaN}, {5, 9.0f}}, 0);        // z[0] NaN: the CPU's argmax stays 0 -> correct
    row({{0, kNaN}, {5, 9.0f}}, 5);        // ... so the max elsewhere is not it
    row({{0, -0.0f}, {1, 0.0f}}, 0);       // -0 == +0 is a tie: the first (-0) wins
    row({{last, kInf}}, last);             // +Inf is a maximum like any other
    {
      std::vector<std::pair<int64_t, float>> all_minus_inf;
      for (int64_t c = 0; c < classes; ++c) all_minus_inf.push_back({c, -kInf});
      row(all_minus_inf, 0);  // all -Inf: argmax 0
    }
    row({{last - 1, 1e30f}, {last, 1e30f}}, last - 1);  // a tie at the last two classes
    std::vector<float> logits;
    for (const auto& z : rows_values) logits.insert(logits.end(), z.begin(), z.end());
    const auto rows = static_cast<int64_t>(labels.size());

    const XentResult result = run_gpu_xent(logits, labels, rows, classes);
    int64_t cpu_correct = -1;
    std::vector<float> cpu_dlogits(logits.size());
    const double cpu_mean = ringtrain::softmax_xent<float>(
        logits.data(), labels.data(), cpu_dlogits.data(), rows, classes, &cpu_correct);
    CHECK(cpu_correct == 8);  // the expectations above, as the CPU sees them
    CHECK(static_cast<int64_t>(result.stats.correct) == cpu_correct);
    CHECK(result.stats.bad_labels == 0);
    CHECK(std::isnan(result.stats.loss_sum) == std::isnan(cpu_mean));  // NaN rows: NaN loss
    // Row by row, the gradient is NaN exactly where the CPU's is.
    for (size_t i = 0; i < logits.size(); ++i) {
      INFO("value " << i);
      REQUIRE(std::isnan(result.dlogits[i]) == std::isnan(cpu_dlogits[i]));
    }
  }
}

TEST_CASE("gpu::softmax_xent of no rows writes zero statistics", "[gpu][kernels]") {
  DeviceBuffer<gpu::XentStats> d_stats(1);
  d_stats.fill_bytes(0xff);
  gpu::softmax_xent(nullptr, nullptr, nullptr, 0, 10, d_stats.data(), nullptr);
  const gpu::XentStats stats = d_stats.download()[0];
  CHECK(stats.loss_sum == 0.0);
  CHECK(stats.correct == 0);
  CHECK(stats.bad_labels == 0);
}

// ---------------------------------------------------------------------------------------
// Optimizers and EMA: several steps against make_optimizer's CPU step and WeightEma.
// ---------------------------------------------------------------------------------------

namespace {

const std::vector<int64_t> kParamSizes = {1, 7, 1000, 4099, (int64_t{1} << 20) + 5};
const float kLrs[] = {0.1f, 0.05f, 0.2f, 0.01f, 0.1f};

// The host reference: GCC's contraction of optim.cpp's loops (kernels/optim.cu), with std::fma.
void reference_sgd(std::vector<float>& w, const std::vector<float>& grad, std::vector<float>& v,
                   float lr, const ringtrain::OptimizerConfig& config) {
  for (size_t i = 0; i < w.size(); ++i) {
    const float g = std::fma(config.weight_decay, w[i], grad[i]);
    if (config.momentum == 0.0f) {
      w[i] = std::fma(-lr, g, w[i]);
    } else {
      const float vi = std::fma(config.momentum, v[i], g);
      v[i] = vi;
      w[i] = config.nesterov ? std::fma(-lr, std::fma(config.momentum, vi, g), w[i])
                             : std::fma(-lr, vi, w[i]);
    }
  }
}

// How far, per value, a CPU build that rounds each product of the fused reference's
// fma(a, b, c) separately can drift from it, carried from step to step (first-order error
// analysis in double, u = 2^-24 per rounding, counting each side's own roundings of the same
// operation: the two evaluations round different inputs). The drift can exceed any relative
// tolerance: with weight decay, g = grad + wd * w may cancel to nearly 0, where one extra
// rounding of wd * w changes g completely, and the update divides m ~ g by sqrt(v) + eps ~ eps.
struct AdamDrift {
  std::vector<double> w, m, v;
  explicit AdamDrift(size_t n) : w(n, 0.0), m(n, 0.0), v(n, 0.0) {}
};

void add_adam_drift(AdamDrift& d, size_t i, float w_old, float m_old, float v_old, float g, float m,
                    float v, float update, float w_new, const gpu::AdamConstants& k) {
  const double u = kUnitRoundoff;
  const double wd = k.weight_decay, b1 = k.beta1, c1 = k.one_minus_beta1, b2 = k.beta2,
               c2 = k.one_minus_beta2;
  const double ag = std::abs(static_cast<double>(g));
  // g: the separate product's rounding, and each side's rounding of the sum
  const double dg = wd * d.w[i] + u * std::abs(wd * w_old) + 2 * u * ag;
  // m = b1 m + fl(c1 g): the separate product b1 m, each side's c1 g and sum
  const double dm = b1 * d.m[i] + c1 * dg + 3 * u * b1 * std::abs(m_old) + 4 * u * c1 * ag;
  // v = b2 v + fl(g fl(c2 g)): the separate b2 v, each side's two products and sum
  const double dv =
      b2 * d.v[i] + c2 * (2 * ag * dg + dg * dg) + 3 * u * b2 * v_old + 6 * u * c2 * ag * ag;
  // |sqrt(v') - sqrt(v)| for |v' - v| <= dv: at most dv / (sqrt(v) + sqrt(max(v - dv, 0)))
  // and at most sqrt(dv); then each side's rounding of its square root.
  const double root = std::sqrt(static_cast<double>(v));
  const double below = std::sqrt(std::max(static_cast<double>(v) - dv, 0.0));
  const double droot =
      (root + below > 0 ? std::min(std::sqrt(dv), dv / (root + below)) : std::sqrt(dv)) +
      2 * u * root;
  // denom = fl(inv_sqrt_bias2 sqrt(v)) + eps: the separate product and each side's sum
  const double denom = k.inv_sqrt_bias2 * root + k.epsilon;
  const double ddenom = k.inv_sqrt_bias2 * droot + 3 * u * denom;
  // update = fl(step_size m) / denom, each side rounding both: |m'/d' - m/d| <=
  // (|m| dd + d dm) / (d (d - dd)) for dd < d
  const double dupdate = ddenom < denom ? k.step_size * (std::abs(m) * ddenom + denom * dm) /
                                                  (denom * (denom - ddenom)) +
                                              4 * u * std::abs(update)
                                        : HUGE_VAL;
  d.m[i] = dm;
  d.v[i] = dv;
  d.w[i] = d.w[i] + dupdate + 2 * u * std::abs(w_new);  // each side's rounding of w - update
}

void reference_adam(std::vector<float>& w, const std::vector<float>& grad, std::vector<float>& m,
                    std::vector<float>& v, const gpu::AdamConstants& k, AdamDrift& drift) {
  for (size_t i = 0; i < w.size(); ++i) {
    const float w_old = w[i], m_old = m[i], v_old = v[i];
    const float g = std::fma(k.weight_decay, w[i], grad[i]);
    const float one_minus_beta1_g = k.one_minus_beta1 * g;
    const float mi = std::fma(k.beta1, m[i], one_minus_beta1_g);
    const float one_minus_beta2_g = k.one_minus_beta2 * g;
    const float g_term = g * one_minus_beta2_g;
    const float vi = std::fma(k.beta2, v[i], g_term);
    m[i] = mi;
    v[i] = vi;
    const float numerator = k.step_size * mi;
    const float denom = std::fma(k.inv_sqrt_bias2, std::sqrt(vi), k.epsilon);
    const float update = numerator / denom;
    w[i] = w[i] - update;
    add_adam_drift(drift, i, w_old, m_old, v_old, g, mi, vi, update, w[i], k);
  }
}

// Whether this build's CPU optimizer contracts as GCC does with FMA (-march=native on an
// FMA-capable x86-64, the default build): probed once on SGD with weight decay, whose step
// takes no host-computed constants (so a wrong adam_constants or ema_factors cannot hide
// behind a failed probe).
bool cpu_contracts_like_gcc() {
  static const bool contracts = [] {
    ringtrain::OptimizerConfig config;
    config.momentum = 0.9f;
    config.weight_decay = 0.01f;
    const size_t n = 4096;
    std::vector<float> w = random_floats(n, 7);
    std::vector<float> ref = w;
    std::vector<float> v(n, 0.0f);
    auto opt = ringtrain::make_optimizer(config, static_cast<int64_t>(n));
    for (uint32_t step = 0; step < 3; ++step) {
      const std::vector<float> grad = random_floats(n, 8 + step);
      opt->step(w, grad, 0.1f);
      reference_sgd(ref, grad, v, 0.1f, config);
    }
    return all_same(w, ref);
  }();
  return contracts;
}

// GPU == the fused host reference always. Then GPU == CPU bit for bit when the CPU build
// contracts like GCC with FMA; otherwise (a WARN) GPU within `tolerance` of the CPU.
void compare_three(std::span<const float> gpu_values, std::span<const float> reference,
                   std::span<const float> cpu_values,
                   const std::function<double(size_t)>& tolerance,
                   const std::string& tolerance_name, const std::string& what) {
  require_same(gpu_values, reference, what + ": GPU vs the fused host reference");
  if (cpu_contracts_like_gcc()) {
    require_same(gpu_values, cpu_values, what + ": GPU vs CPU");
  } else {
    WARN(what << ": this build's CPU optimizer does not contract a * b + c as GCC does with "
                 "FMA (RINGTRAIN_NATIVE=OFF or another compiler?); GPU vs CPU within "
              << tolerance_name);
    require_within(gpu_values, cpu_values, tolerance, tolerance_name, what + ": GPU vs CPU");
  }
}

// SGD and the weight average: each step may round a separately rounded product differently
// from a fused one, about an ulp of |w| or of the update, so over 5 steps 1e-5 relative plus
// 1e-6 absolute (the values are of order 1, the updates of order lr) is a wide margin.
void compare_three(std::span<const float> gpu_values, std::span<const float> reference,
                   std::span<const float> cpu_values, const std::string& what) {
  compare_three(
      gpu_values, reference, cpu_values,
      [&](size_t i) { return 1e-5 * std::abs(double{cpu_values[i]}) + 1e-6; }, "rel 1e-5 abs 1e-6",
      what);
}

// Adam: twice the carried drift bound (AdamDrift), the factor 2 for the second-order terms
// that the first-order bound leaves out.
void compare_three(std::span<const float> gpu_values, std::span<const float> reference,
                   std::span<const float> cpu_values, std::span<const double> drift,
                   const std::string& what) {
  REQUIRE(drift.size() == cpu_values.size());
  compare_three(
      gpu_values, reference, cpu_values, [&](size_t i) { return 2 * drift[i] + 1e-30; },
      "twice the drift bound of separately rounded products", what);
}

}  // namespace

TEST_CASE("gpu::sgd_update matches make_optimizer's SGD over several steps", "[gpu][kernels]") {
  struct Case {
    const char* name;
    float momentum, weight_decay;
    bool nesterov;
  };
  const Case cases[] = {{"plain", 0.0f, 0.0f, false},
                        {"plain + weight decay", 0.0f, 5e-4f, false},
                        {"momentum", 0.9f, 0.0f, false},
                        {"momentum + weight decay", 0.9f, 5e-4f, false},
                        {"nesterov + weight decay", 0.9f, 1e-2f, true},
                        {"nesterov, momentum 0.5", 0.5f, 0.0f, true}};
  for (const Case& c : cases) {
    for (const int64_t n : kParamSizes) {
      INFO(c.name << ", n " << n);
      ringtrain::OptimizerConfig config;
      config.kind = "sgd";
      config.momentum = c.momentum;
      config.weight_decay = c.weight_decay;
      config.nesterov = c.nesterov;
      const auto len = static_cast<size_t>(n);
      std::vector<float> w_cpu = random_floats(len, 61);
      std::vector<float> w_ref = w_cpu;
      std::vector<float> v_ref(len, 0.0f);
      auto cpu = ringtrain::make_optimizer(config, n);
      DeviceBuffer<float> d_w(w_cpu);
      DeviceBuffer<float> d_grad(len);
      DeviceBuffer<float> d_v(std::vector<float>(len, 0.0f));
      float* velocity = c.momentum > 0.0f ? d_v.data() : nullptr;
      for (size_t step = 0; step < std::size(kLrs); ++step) {
        INFO("step " << step + 1);
        const std::vector<float> grad = random_floats(len, 70 + static_cast<uint32_t>(step));
        d_grad.upload(grad);
        gpu::sgd_update(d_w.data(), d_grad.data(), velocity, n, kLrs[step], c.weight_decay,
                        c.momentum, c.nesterov, nullptr);
        cpu->step(w_cpu, grad, kLrs[step]);
        reference_sgd(w_ref, grad, v_ref, kLrs[step], config);
        compare_three(d_w.download(), w_ref, w_cpu, "weights");
        if (c.momentum > 0.0f) {
          compare_three(d_v.download(), v_ref, cpu->state().at(0), "velocity");
        }
      }
    }
  }
}

TEST_CASE("gpu::adam_update matches make_optimizer's Adam over several steps", "[gpu][kernels]") {
  struct Case {
    const char* name;
    float beta1, beta2, epsilon, weight_decay;
  };
  const Case cases[] = {{"defaults", 0.9f, 0.999f, 1e-8f, 0.0f},
                        {"weight decay, other betas", 0.8f, 0.99f, 1e-6f, 1e-2f}};
  for (const Case& c : cases) {
    for (const int64_t n : kParamSizes) {
      INFO(c.name << ", n " << n);
      ringtrain::OptimizerConfig config;
      config.kind = "adam";
      config.beta1 = c.beta1;
      config.beta2 = c.beta2;
      config.epsilon = c.epsilon;
      config.weight_decay = c.weight_decay;
      const auto len = static_cast<size_t>(n);
      std::vector<float> w_cpu = random_floats(len, 81);
      std::vector<float> w_ref = w_cpu;
      std::vector<float> m_ref(len, 0.0f);
      std::vector<float> v_ref(len, 0.0f);
      auto cpu = ringtrain::make_optimizer(config, n);
      DeviceBuffer<float> d_w(w_cpu);
      DeviceBuffer<float> d_grad(len);
      DeviceBuffer<float> d_m(m_ref);
      DeviceBuffer<float> d_v(v_ref);
      AdamDrift drift(len);
      for (size_t step = 0; step < std::size(kLrs); ++step) {
        INFO("step " << step + 1);
        std::vector<float> grad = random_floats(len, 90 + static_cast<uint32_t>(step));
        if (len > 3) grad[3] = 0.0f;  // a zero gradient: v may stay 0, the eps term decides
        d_grad.upload(grad);
        const gpu::AdamConstants k =
            gpu::adam_constants(kLrs[step], c.beta1, c.beta2, c.epsilon, c.weight_decay,
                                static_cast<int64_t>(step) + 1);
        gpu::adam_update(d_w.data(), d_grad.data(), d_m.data(), d_v.data(), n, k, nullptr);
        cpu->step(w_cpu, grad, kLrs[step]);
        reference_adam(w_ref, grad, m_ref, v_ref, k, drift);
        compare_three(d_w.download(), w_ref, w_cpu, drift.w, "weights");
        const auto state = cpu->state();
        compare_three(d_m.download(), m_ref, state.at(0), drift.m, "first moment");
        compare_three(d_v.download(), v_ref, state.at(1), drift.v, "second moment");
      }
    }
  }
}

TEST_CASE("gpu::ema_update with gpu::ema_factors matches WeightEma", "[gpu][kernels]") {
  for (const float decay : {0.999f, 0.5f, 0.0f}) {
    for (const int64_t n : kParamSizes) {
      INFO("decay " << decay << ", n " << n);
      const auto len = static_cast<size_t>(n);
      const std::vector<float> w0 = random_floats(len, 101);
      ringtrain::WeightEma cpu(decay, w0);
      std::vector<float> ref = w0;
      DeviceBuffer<float> d_shadow(w0);
      DeviceBuffer<float> d_w(len);
      // 12 updates: past the point where (1 + t) / (10 + t) overtakes a decay of 0.5.
      for (int64_t t = 0; t < 12; ++t) {
        INFO("update " << t + 1);
        const std::vector<float> w = random_floats(len, 110 + static_cast<uint32_t>(t));
        d_w.upload(w);
        const gpu::EmaFactors f = gpu::ema_factors(decay, t);
        gpu::ema_update(d_shadow.data(), d_w.data(), n, f.keep, f.take, nullptr);
        cpu.update(w);
        for (size_t i = 0; i < len; ++i) {
          const float taken = f.take * w[i];
          ref[i] = std::fma(f.keep, ref[i], taken);
        }
        const std::span<const float> shadow = cpu.shadow();
        compare_three(d_shadow.download(), ref, std::vector<float>(shadow.begin(), shadow.end()),
                      "shadow");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Edge cases of the launchers themselves.
// ---------------------------------------------------------------------------------------

TEST_CASE("every launcher treats zero sizes as no-ops", "[gpu][kernels]") {
  DeviceBuffer<unsigned long long> count(std::vector<unsigned long long>{3});
  gpu::bias_add(nullptr, nullptr, 0, 0, nullptr);
  gpu::bias_add(nullptr, nullptr, 4, 0, nullptr);
  gpu::bias_grad(nullptr, nullptr, 0, 0, nullptr);
  gpu::relu_forward(nullptr, nullptr, 0, nullptr);
  gpu::relu_backward(nullptr, nullptr, nullptr, 0, nullptr);
  gpu::sgd_update(nullptr, nullptr, nullptr, 0, 0.1f, 0.0f, 0.0f, false, nullptr);
  gpu::adam_update(nullptr, nullptr, nullptr, nullptr, 0,
                   gpu::adam_constants(0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1), nullptr);
  gpu::ema_update(nullptr, nullptr, 0, 0.9f, 0.1f, nullptr);
  gpu::add_inplace(nullptr, nullptr, 0, nullptr);
  gpu::scale(nullptr, 2.0f, 0, nullptr);
  gpu::divide(nullptr, 2.0f, 0, nullptr);
  gpu::count_nonfinite(nullptr, 0, count.data(), nullptr);
  device_sync();
  CHECK(count.download()[0] == 3);
  CHECK_THROWS_AS(gpu::scale(nullptr, 2.0f, -1, nullptr), ringtrain::Error);
  CHECK_THROWS_AS(gpu::adam_constants(0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 0), ringtrain::Error);
}

TEST_CASE("the elementwise kernels index buffers above 2^32 values with int64",
          "[gpu][kernels][large]") {
  // 2^32 + 64 floats (17 GB): past both the int32 and the uint32 range of an index.
  const int64_t n = (int64_t{1} << 32) + 64;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  RINGTRAIN_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < static_cast<size_t>(n) * sizeof(float) + (size_t{4} << 30)) {
    WARN("skipped: " << free_bytes / (1 << 20) << " MiB free on the GPU, this case needs "
                     << static_cast<size_t>(n) * sizeof(float) / (1 << 20) + 4096 << " MiB");
    return;
  }
  DeviceBuffer<float> x(static_cast<size_t>(n));
  x.fill_bytes(0);
  // Probes around 2^31 and 2^32 and at the very end.
  const std::vector<int64_t> probes = {0,
                                       (int64_t{1} << 31) - 2,
                                       (int64_t{1} << 31) + 1,
                                       (int64_t{1} << 32) - 1,
                                       (int64_t{1} << 32) + 5,
                                       n - 1};
  auto put = [&](int64_t i, float v) {
    RINGTRAIN_CHECK_CUDA(cudaMemcpy(x.data() + i, &v, sizeof(float), cudaMemcpyHostToDevice));
  };
  auto get = [&](int64_t i) { return x.download_range(static_cast<size_t>(i), 1)[0]; };
  for (size_t p = 0; p < probes.size(); ++p) put(probes[p], static_cast<float>(p + 1));

  gpu::scale(x.data(), 2.0f, n, nullptr);
  for (size_t p = 0; p < probes.size(); ++p) {
    CHECK(get(probes[p]) == 2.0f * static_cast<float>(p + 1));
  }

  // bias_add over [n / 8, 8]: rows * cols above 2^32 takes the int64 kernel.
  const std::vector<float> bias = {10, 20, 30, 40, 50, 60, 70, 80};
  DeviceBuffer<float> d_bias(bias);
  gpu::bias_add(x.data(), d_bias.data(), n / 8, 8, nullptr);
  for (size_t p = 0; p < probes.size(); ++p) {
    CHECK(get(probes[p]) == 2.0f * static_cast<float>(p + 1) + bias[probes[p] % 8]);
  }
  CHECK(get(12345) == bias[12345 % 8]);

  // add_inplace of the upper half into the lower: both halves above 2^31 values.
  const int64_t upper = n / 2;
  put(upper + 3, 0.5f);
  const float low = get(3);
  gpu::add_inplace(x.data(), x.data() + upper, upper, nullptr);
  CHECK(get(3) == low + 0.5f);

  DeviceBuffer<unsigned long long> count(std::vector<unsigned long long>{0});
  put((int64_t{1} << 32) + 7, kNaN);
  put(n - 2, -kInf);
  gpu::count_nonfinite(x.data(), n, count.data(), nullptr);
  CHECK(count.download()[0] == 2);
}

// ---------------------------------------------------------------------------------------
// Filter layout transposes (layout.h, the cuDNN conv path): values only move, so bit for bit.
// ---------------------------------------------------------------------------------------

TEST_CASE("gpu::transpose_hwio_to_krsc and back give the host permutation and the same bits",
          "[gpu][kernels]") {
  struct Filter {
    int64_t taps, cin, cout;
  };
  // The cnn's filters (1 -> 8, 8 -> 16), a generic one, degenerate ones, and one above a
  // capped grid (4096 x 256 threads), so the grid-stride loop goes round.
  const Filter filters[] = {{9, 1, 8}, {9, 8, 16}, {9, 3, 5},     {1, 1, 1},
                            {4, 7, 3}, {9, 1, 1},  {9, 256, 512}, {9, 1000, 131}};
  uint32_t seed = 900;
  for (const Filter& f : filters) {
    INFO("taps " << f.taps << ", cin " << f.cin << ", cout " << f.cout);
    const size_t n = static_cast<size_t>(f.taps * f.cin * f.cout);
    std::vector<float> hwio = random_floats(n, seed++);
    add_specials(hwio);  // NaN payloads, -0, denormals must move unchanged
    std::vector<float> expected_krsc(n);
    for (int64_t tap = 0; tap < f.taps; ++tap)
      for (int64_t ci = 0; ci < f.cin; ++ci)
        for (int64_t co = 0; co < f.cout; ++co)
          expected_krsc[static_cast<size_t>((co * f.taps + tap) * f.cin + ci)] =
              hwio[static_cast<size_t>((tap * f.cin + ci) * f.cout + co)];
    DeviceBuffer<float> source(hwio);
    DeviceBuffer<float> krsc(n);
    DeviceBuffer<float> back(n);
    krsc.fill_bytes(0xff);
    back.fill_bytes(0xff);
    gpu::transpose_hwio_to_krsc(source.data(), krsc.data(), f.taps, f.cin, f.cout, nullptr);
    gpu::transpose_krsc_to_hwio(krsc.data(), back.data(), f.taps, f.cin, f.cout, nullptr);
    const std::vector<float> got_krsc = krsc.download();
    const std::vector<float> got_back = back.download();
    // memcmp: the transposes copy bits, NaN payloads included.
    CHECK(std::memcmp(got_krsc.data(), expected_krsc.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(got_back.data(), hwio.data(), n * sizeof(float)) == 0);
  }
  // Zero sizes launch nothing (null pointers fine); negative sizes throw.
  gpu::transpose_hwio_to_krsc(nullptr, nullptr, 9, 0, 8, nullptr);
  gpu::transpose_krsc_to_hwio(nullptr, nullptr, 0, 4, 8, nullptr);
  device_sync();
  CHECK_THROWS_AS(gpu::transpose_hwio_to_krsc(nullptr, nullptr, 9, -1, 8, nullptr),
                  ringtrain::Error);
  CHECK_THROWS_AS(gpu::transpose_krsc_to_hwio(nullptr, nullptr, 9, 1, -8, nullptr),
                  ringtrain::Error);
}
