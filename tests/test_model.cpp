// Tests for model.h and the parameter file of train.h: the two models' parameter counts and
// their errors, the flat layout in backward order, the grad-ready callback's growing prefix,
// that the gradient buffer is exactly the per-layer math laid out in that order (and agrees
// with finite differences of the whole model's loss), Glorot initialisation, and the
// save_params / load_params round trip and its errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/context.h"
#include "ringtrain/model.h"
#include "ringtrain/ops.h"
#include "ringtrain/train.h"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using ringtrain::Context;
using ringtrain::GradRange;
using ringtrain::Model;
using ringtrain::ModelSpec;
using ringtrain::ParamView;
using ringtrain::Shape;
using ringtrain::Tensor;

constexpr int64_t kMlpParams = 784 * 500 + 500 + 500 * 500 + 500 + 500 * 10 + 10;
constexpr int64_t kCnnParams = 3 * 3 * 1 * 8 + 8 + 3 * 3 * 8 * 16 + 16 + 784 * 10 + 10;
constexpr int64_t kBatch = 4;

size_t size_of(int64_t n) {
  return static_cast<size_t>(n);
}

std::unique_ptr<Model> make(const std::string& name, std::vector<int64_t> hidden = {}) {
  ModelSpec spec;
  spec.name = name;
  spec.hidden = std::move(hidden);
  return ringtrain::make_model(spec);
}

// A batch of kBatch images [B, 28, 28, 1] with values in [0, 1), and labels in [0, 10).
struct RandomBatch {
  Tensor images{Shape{kBatch, 28, 28, 1}};
  std::vector<int32_t> labels;
  explicit RandomBatch(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (int64_t i = 0; i < images.numel(); ++i) images[i] = pixel(rng);
    std::uniform_int_distribution<int32_t> label(0, 9);
    for (int64_t i = 0; i < kBatch; ++i) labels.push_back(label(rng));
  }
};

// The layers that own parameters, in the order the flat layout lists them.
std::vector<int> layers_in_layout(const Model& model) {
  std::vector<int> layers;
  for (const ParamView& view : model.param_views()) {
    if (layers.empty() || layers.back() != view.layer) layers.push_back(view.layer);
  }
  return layers;
}

// Glorot fans of a weight from its shape: dense [in, out]; conv [3, 3, cin, cout] uses the
// receptive field times the channels, as TensorFlow does.
std::pair<int64_t, int64_t> glorot_fans(const Shape& shape) {
  if (shape.rank() == 2) return {shape[0], shape[1]};
  REQUIRE(shape.rank() == 4);
  return {shape[0] * shape[1] * shape[2], shape[0] * shape[1] * shape[3]};
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A fresh directory under the system's temporary directory, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("ringtrain_test_model_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::span<const float> span_of(const Tensor& t) {
  return {t.data(), size_of(t.numel())};
}

}  // namespace

TEST_CASE("make_model: parameter counts of mlp, cnn and a wider mlp", "[model]") {
  CHECK(make("mlp")->num_params() == kMlpParams);
  CHECK(make("cnn")->num_params() == kCnnParams);
  CHECK(make("mlp", {500, 500})->num_params() == kMlpParams);
  CHECK(make("mlp", {4096, 4096})->num_params() ==
        784 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10);
  CHECK(make("mlp", {32})->num_params() == 784 * 32 + 32 + 32 * 10 + 10);
  for (const char* name : {"mlp", "cnn"}) {
    auto model = make(name);
    CHECK(model->output_shape() == Shape{10});
    CHECK(model->input_shape() == (Shape{28, 28, 1}));
    CHECK(model->grads().numel() == model->num_params());
  }
}

TEST_CASE("make_model: an unknown name or --hidden with cnn throws", "[model]") {
  CHECK_THROWS_AS(make("resnet"), ringtrain::Error);
  CHECK_THROWS_WITH(make("resnet"), Contains("--model") && Contains("resnet"));
  CHECK_THROWS_AS(make("cnn", {64}), ringtrain::Error);
  CHECK_THROWS_WITH(make("cnn", {64}), Contains("--hidden"));
  CHECK_THROWS_WITH(make("mlp", {64, 0}), Contains("--hidden"));
}

TEST_CASE("the flat layout is contiguous and starts with the last layer", "[model]") {
  for (const char* name : {"mlp", "cnn"}) {
    INFO("model " << name);
    auto model = make(name);
    const auto& views = model->param_views();
    REQUIRE(views.size() == 6);  // three layers with a weight and a bias each
    int64_t end = 0;
    for (const ParamView& view : views) {
      INFO(view.name);
      CHECK(view.offset == end);
      CHECK(view.size == view.shape.numel());
      end = view.offset + view.size;
    }
    CHECK(end == model->num_params());
    // Offset 0 is the last layer's (a dense layer) weight; then its bias; layers descend.
    CHECK(views[0].layer == model->num_layers() - 1);
    CHECK(views[0].offset == 0);
    CHECK(views[0].shape[1] == 10);
    CHECK(ends_with(views[0].name, ".weight"));
    CHECK(views[0].name.find("dense") != std::string::npos);
    CHECK(views[1].layer == views[0].layer);
    CHECK(ends_with(views[1].name, ".bias"));
    const std::vector<int> layers = layers_in_layout(*model);
    CHECK(std::is_sorted(layers.rbegin(), layers.rend()));
    CHECK(std::set<int>(layers.begin(), layers.end()).size() == layers.size());
  }
  // The mlp's layout, spelled out: dense 500->10, dense 500->500, dense 784->500.
  auto mlp = make("mlp");
  const auto& views = mlp->param_views();
  CHECK(views[0].shape == (Shape{500, 10}));
  CHECK(views[1].shape == Shape{10});
  CHECK(views[2].shape == (Shape{500, 500}));
  CHECK(views[3].shape == Shape{500});
  CHECK(views[4].shape == (Shape{784, 500}));
  CHECK(views[5].shape == Shape{500});
}

TEST_CASE("backward reports each layer's finished gradients as a growing prefix", "[model]") {
  for (const char* name : {"mlp", "cnn"}) {
    INFO("model " << name);
    auto model = make(name);
    model->init_params(7);
    Context ctx;
    const RandomBatch batch(11);
    const Tensor& logits = model->forward(batch.images, ctx);
    Tensor dlogits(logits.shape());
    ringtrain::softmax_xent(logits.data(), batch.labels.data(), dlogits.data(), kBatch, 10,
                            static_cast<int64_t*>(nullptr));

    // Poison the gradients: a range reported as ready must already hold its final values.
    model->grads().fill(std::numeric_limits<float>::quiet_NaN());
    std::vector<GradRange> ranges;
    std::vector<std::vector<float>> at_report;
    model->backward(dlogits, ctx, [&](const GradRange& range) {
      ranges.push_back(range);
      const float* g = model->grads().data();
      at_report.emplace_back(g + range.begin, g + range.end);
    });

    const std::vector<int> layers = layers_in_layout(*model);
    REQUIRE(ranges.size() == layers.size());
    int64_t end = 0;
    for (size_t k = 0; k < ranges.size(); ++k) {
      const GradRange& range = ranges[k];
      INFO("report " << k << ": layer " << range.layer << " [" << range.begin << ", " << range.end
                     << ")");
      CHECK(range.layer == layers[k]);  // backward order: the layout's order
      CHECK(range.begin == end);
      CHECK(range.end > range.begin);
      // The range is exactly that layer's views.
      int64_t layer_begin = std::numeric_limits<int64_t>::max(), layer_end = 0;
      for (const ParamView& view : model->param_views()) {
        if (view.layer != range.layer) continue;
        layer_begin = std::min(layer_begin, view.offset);
        layer_end = std::max(layer_end, view.offset + view.size);
      }
      CHECK(range.begin == layer_begin);
      CHECK(range.end == layer_end);
      const float* final_grads = model->grads().data() + range.begin;
      const auto& seen = at_report[k];
      CHECK(std::none_of(seen.begin(), seen.end(), [](float g) { return std::isnan(g); }));
      CHECK(std::memcmp(seen.data(), final_grads, seen.size() * sizeof(float)) == 0);
      end = range.end;
    }
    CHECK(end == model->num_params());

    // Without a callback backward gives the same gradients.
    std::vector<float> with_callback(model->grads().data(),
                                     model->grads().data() + model->num_params());
    model->grads().fill(std::numeric_limits<float>::quiet_NaN());
    model->backward(dlogits, ctx);
    CHECK(std::memcmp(with_callback.data(), model->grads().data(),
                      with_callback.size() * sizeof(float)) == 0);
  }
}

namespace {

// Images and labels for `rows` rows, from `seed`.
struct Rows {
  Tensor images;
  std::vector<int32_t> labels;
  Rows(int64_t rows, uint64_t seed) : images(Shape{rows, 28, 28, 1}) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = pixel(rng);
    for (int64_t r = 0; r < rows; ++r) labels.push_back(static_cast<int32_t>(rng() % 10));
  }
};

bool same_floats(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, size_of(n) * sizeof(float)) == 0;
}

}  // namespace

// The property --reproducible's stacked micro-shards rest on (Model::can_stack_micro_shards):
// Eigen's GEMMs compute each row of a batch the same way for any multiple of 4 rows, so one
// forward and backward over k stacked micro-shards gives each micro-shard's logits, and each
// layer's input and output gradient (from which the exact sum computes the parameter
// gradients, dense_terms.h), bit for bit as k separate passes do. It follows from Eigen's
// blocking (see Dense::rows_independent), not from one machine's rounding, so it must hold on
// any CPU.
TEST_CASE("stacked micro-shards give each one's logits and layer rows bit for bit", "[model]") {
  // As --reproducible runs: one thread (a threaded GEMM splits its work by the sizes) and the
  // fixed cache sizes.
  ringtrain::set_cpu_threads(1);
  ringtrain::fix_cpu_gemm_blocking();
  // {4, 8}: the 4->8 layer of 8 rows is just at Eigen's GEMM threshold (the sizes add up to 20).
  const std::vector<std::vector<int64_t>> shapes = {{500, 500}, {40, 24}, {1024, 300}, {4, 8}};
  for (const auto& hidden : shapes) {
    for (const int64_t rows : {4, 8, 12, 16}) {
      for (const int64_t shards : {1, 2, 3, 7}) {
        INFO("hidden " << hidden[0] << "," << hidden[1] << ", " << shards << " micro-shards of "
                       << rows << " rows");
        auto model = make("mlp", hidden);
        model->init_params(3);
        Context ctx;
        const bool stackable = model->can_stack_micro_shards(rows);
        // 4 and 12 rows of 10 logits are 160 and 480 bytes: the second micro-shard would
        // start off a 64-byte boundary. 8 and 16 rows of every width here are whole lines.
        CHECK(stackable == (rows % 8 == 0));
        if (!stackable) continue;
        Rows data(rows * shards, 17 + static_cast<uint64_t>(rows));
        // [layer] -> the rows of x, then of dy, of every micro-shard in turn.
        using Kept = std::map<int, std::pair<std::vector<float>, std::vector<float>>>;
        const auto keep = [](Kept& kept) {
          return [&kept](int layer, const Tensor& x, const Tensor& dy) {
            auto& [xs, dys] = kept[layer];
            xs.insert(xs.end(), x.data(), x.data() + x.numel());
            dys.insert(dys.end(), dy.data(), dy.data() + dy.numel());
          };
        };

        // One micro-shard after another, each alone.
        Kept alone;
        std::vector<float> alone_logits;
        for (int64_t j = 0; j < shards; ++j) {
          const Tensor images =
              Tensor::view(data.images.data() + j * rows * 784, Shape{rows, 28, 28, 1});
          const Tensor& logits = model->forward(images, ctx);
          alone_logits.insert(alone_logits.end(), logits.data(), logits.data() + logits.numel());
          Tensor dlogits(logits.shape());
          ringtrain::softmax_xent(logits.data(), data.labels.data() + j * rows, dlogits.data(),
                                  rows, 10, static_cast<int64_t*>(nullptr));
          model->backward_inputs(dlogits, ctx, keep(alone));
        }

        // Stacked: one forward, the loss per micro-shard, one backward.
        const Tensor& logits = model->forward(data.images, ctx);
        REQUIRE(same_floats(logits.data(), alone_logits.data(), logits.numel()));
        Tensor dlogits(logits.shape());
        for (int64_t j = 0; j < shards; ++j)
          ringtrain::softmax_xent(logits.data() + j * rows * 10, data.labels.data() + j * rows,
                                  dlogits.data() + j * rows * 10, rows, 10,
                                  static_cast<int64_t*>(nullptr));
        model->grads().fill(std::numeric_limits<float>::quiet_NaN());
        Kept stacked;
        model->backward_inputs(dlogits, ctx, keep(stacked));
        CHECK(stacked.size() == 3);  // the three dense layers
        for (const auto& [layer, rows_of] : alone) {
          INFO("layer " << layer);
          REQUIRE(stacked.count(layer) == 1);
          const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
            return a.size() == b.size() &&
                   same_floats(a.data(), b.data(), static_cast<int64_t>(a.size()));
          };
          CHECK(same_bits(rows_of.first, stacked[layer].first));
          CHECK(same_bits(rows_of.second, stacked[layer].second));
        }
        // The gradient buffer is not written.
        CHECK(std::all_of(model->grads().data(), model->grads().data() + model->num_params(),
                          [](float g) { return std::isnan(g); }));
      }
    }
  }
  // Convolutions are not stacked, nor are rows that are not a multiple of 4, nor products that
  // Eigen computes outside its GEMM: sizes adding up to less than 20 (2->2 on 8 rows), a
  // single output column (a layer of width 1).
  CHECK_FALSE(make("cnn")->can_stack_micro_shards(8));
  CHECK_FALSE(make("mlp")->can_stack_micro_shards(6));
  CHECK_FALSE(make("mlp", {2, 2})->can_stack_micro_shards(8));
  CHECK(make("mlp", {2, 2})->can_stack_micro_shards(16));
  CHECK_FALSE(make("mlp", {16, 1})->can_stack_micro_shards(16));
}

TEST_CASE("the mlp's gradient buffer is the per-layer math, concatenated in layout order",
          "[model]") {
  using ringtrain::dense_backward;
  using ringtrain::dense_forward;
  using ringtrain::relu_backward;
  using ringtrain::relu_forward;
  auto model = make("mlp");
  model->init_params(3);
  Context ctx;
  const RandomBatch batch(5);
  const Tensor& logits = model->forward(batch.images, ctx);
  Tensor dlogits(logits.shape());
  ringtrain::softmax_xent(logits.data(), batch.labels.data(), dlogits.data(), kBatch, 10,
                          static_cast<int64_t*>(nullptr));
  model->backward(dlogits, ctx);

  // The same network by hand from ops.h, reading the weights through param_views:
  // x[4,784] -> dense w1[784,500] -> relu -> dense w2[500,500] -> relu -> dense w3[500,10].
  const auto& views = model->param_views();
  const float* p = model->params().data();
  const float *w3 = p + views[0].offset, *b3 = p + views[1].offset;
  const float *w2 = p + views[2].offset, *b2 = p + views[3].offset;
  const float *w1 = p + views[4].offset, *b1 = p + views[5].offset;
  const float* x = batch.images.data();
  std::vector<float> h1(size_of(kBatch * 500)), h2(h1.size()), out(size_of(kBatch * 10));
  dense_forward(x, w1, b1, h1.data(), kBatch, 784, 500);
  relu_forward(h1.data(), h1.data(), kBatch * 500);
  dense_forward(h1.data(), w2, b2, h2.data(), kBatch, 500, 500);
  relu_forward(h2.data(), h2.data(), kBatch * 500);
  dense_forward(h2.data(), w3, b3, out.data(), kBatch, 500, 10);
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == logits.data()[i]);

  std::vector<float> expected(size_of(model->num_params()));
  float* g = expected.data();
  std::vector<float> dh2(h2.size()), dh1(h1.size());
  dense_backward(h2.data(), w3, dlogits.data(), g + views[0].offset, g + views[1].offset,
                 dh2.data(), kBatch, 500, 10);
  relu_backward(h2.data(), dh2.data(), dh2.data(), kBatch * 500);
  dense_backward(h1.data(), w2, dh2.data(), g + views[2].offset, g + views[3].offset, dh1.data(),
                 kBatch, 500, 500);
  relu_backward(h1.data(), dh1.data(), dh1.data(), kBatch * 500);
  dense_backward(x, w1, dh1.data(), g + views[4].offset, g + views[5].offset,
                 static_cast<float*>(nullptr), kBatch, 784, 500);

  // The model runs the same functions on the same shapes, so the bits match.
  const float* actual = model->grads().data();
  int64_t mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) mismatches += actual[i] != expected[i] ? 1 : 0;
  CHECK(mismatches == 0);
}

TEST_CASE("the mlp's gradients agree with finite differences of its loss (float)", "[model]") {
  // Float forward passes make this a loose check: the logits carry rounding noise of ~1e-7,
  // which a central difference divides by 2 eps, and eps cannot be large because a step may
  // carry a hidden unit across ReLU's kink. With eps = 1e-3 the noise is ~1e-4 absolute on
  // gradients of ~1e-3 to 1e-1, so: |a - n| <= 2e-2 max(|a|, |n|) + 2e-4 (the largest error
  // seen is 6e-5, 15% of its bound). The loss is taken in double from the float logits so the
  // loss's own float rounding adds nothing. The exact layout check is the case above.
  constexpr float kStep = 1e-3f;
  constexpr double kRel = 2e-2, kAbs = 2e-4;
  auto model = make("mlp");
  model->init_params(9);
  Context ctx;
  const RandomBatch batch(13);
  const auto loss = [&] {
    const Tensor& logits = model->forward(batch.images, ctx);
    std::vector<double> z(logits.data(), logits.data() + logits.numel());
    return ringtrain::softmax_xent(z.data(), batch.labels.data(), static_cast<double*>(nullptr),
                                   kBatch, 10, static_cast<int64_t*>(nullptr));
  };
  {
    const Tensor& logits = model->forward(batch.images, ctx);
    Tensor dlogits(logits.shape());
    ringtrain::softmax_xent(logits.data(), batch.labels.data(), dlogits.data(), kBatch, 10,
                            static_cast<int64_t*>(nullptr));
    model->backward(dlogits, ctx);
  }
  const std::vector<float> grads(model->grads().data(),
                                 model->grads().data() + model->num_params());

  // From every parameter tensor: its entry with the largest gradient and 4 random ones.
  std::mt19937_64 rng(17);
  std::vector<int64_t> picks;
  const auto by_magnitude = [](float a, float b) { return std::abs(a) < std::abs(b); };
  for (const ParamView& view : model->param_views()) {
    const auto begin = grads.begin() + view.offset;
    picks.push_back(std::max_element(begin, begin + view.size, by_magnitude) - grads.begin());
    std::uniform_int_distribution<int64_t> entry(view.offset, view.offset + view.size - 1);
    for (int k = 0; k < 4; ++k) picks.push_back(entry(rng));
  }
  float* params = model->params().data();
  for (const int64_t i : picks) {
    const float saved = params[i];
    params[i] = saved + kStep;
    const double plus = loss();
    params[i] = saved - kStep;
    const double minus = loss();
    params[i] = saved;
    const double numeric = (plus - minus) / (2.0 * static_cast<double>(kStep));
    const double analytic = static_cast<double>(grads[size_of(i)]);
    INFO("parameter " << i << ": analytic " << analytic << ", numeric " << numeric);
    CHECK(std::abs(analytic - numeric) <=
          kRel * std::max(std::abs(analytic), std::abs(numeric)) + kAbs);
  }
}

TEST_CASE("init_params: seeded Glorot-uniform weights and zero biases", "[model]") {
  for (const char* name : {"mlp", "cnn"}) {
    INFO("model " << name);
    auto a = make(name), b = make(name), c = make(name);
    a->init_params(42);
    b->init_params(42);
    c->init_params(43);
    const size_t bytes = size_of(a->num_params()) * sizeof(float);
    CHECK(std::memcmp(a->params().data(), b->params().data(), bytes) == 0);
    CHECK(std::memcmp(a->params().data(), c->params().data(), bytes) != 0);
    // Re-initialising overwrites whatever was there.
    b->params().fill(1.0f);
    b->init_params(42);
    CHECK(std::memcmp(a->params().data(), b->params().data(), bytes) == 0);

    for (const ParamView& view : a->param_views()) {
      INFO(view.name);
      const float* p = a->params().data() + view.offset;
      const float* q = c->params().data() + view.offset;
      const auto n = size_of(view.size);
      if (ends_with(view.name, ".bias")) {
        CHECK(std::all_of(p, p + n, [](float v) { return v == 0.0f; }));
        continue;
      }
      REQUIRE(ends_with(view.name, ".weight"));
      CHECK(std::memcmp(p, q, n * sizeof(float)) != 0);  // each tensor depends on the seed
      const auto [fan_in, fan_out] = glorot_fans(view.shape);
      const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
      const auto [lo, hi] = std::minmax_element(p, p + n);
      CHECK(static_cast<double>(*lo) >= -static_cast<double>(static_cast<float>(limit)));
      CHECK(static_cast<double>(*hi) <= static_cast<double>(static_cast<float>(limit)));
      // It fills the range (so the limit is not a smaller one) and is not constant.
      CHECK(static_cast<double>(*hi) > 0.9 * limit);
      CHECK(static_cast<double>(*lo) < -0.9 * limit);
      // Mean 0 and second moment limit^2 / 3, within 5 standard errors of a uniform sample.
      double sum = 0.0, sum_sq = 0.0;
      for (size_t i = 0; i < n; ++i) {
        sum += static_cast<double>(p[i]);
        sum_sq += static_cast<double>(p[i]) * static_cast<double>(p[i]);
      }
      const double count = static_cast<double>(n);
      CHECK(std::abs(sum / count) < 5.0 * limit / std::sqrt(3.0 * count));
      CHECK(std::abs(sum_sq / count - limit * limit / 3.0) <
            5.0 * limit * limit * std::sqrt(4.0 / 45.0 / count));
    }
  }
}

TEST_CASE("Model::forward rejects inputs of the wrong shape", "[model]") {
  for (const char* name : {"mlp", "cnn"}) {
    INFO("model " << name);
    auto model = make(name);
    model->init_params(1);
    Context ctx;
    CHECK_THROWS_AS(model->forward(Tensor(Shape{2, 28, 27, 1}), ctx), ringtrain::Error);
    CHECK_THROWS_AS(model->forward(Tensor(Shape{2, 785}), ctx), ringtrain::Error);
    CHECK_THROWS_AS(model->forward(Tensor(Shape{784}), ctx), ringtrain::Error);
    CHECK_THROWS_WITH(model->forward(Tensor(Shape{2, 28, 27, 1}), ctx),
                      Contains("[28, 28, 1]") && Contains("[2, 28, 27, 1]"));
    // The right shape works, flattened or not, and gives [B, 10].
    CHECK(model->forward(Tensor(Shape{3, 28, 28, 1}), ctx).shape() == (Shape{3, 10}));
    CHECK(model->forward(Tensor(Shape{2, 784}), ctx).shape() == (Shape{2, 10}));
  }
}

TEST_CASE("save_params / load_params round-trip bit-exactly in the documented format", "[model]") {
  const TempDir dir;
  const fs::path path = dir.path / "params.bin";
  auto model = make("mlp");
  model->init_params(21);
  const int64_t n = model->num_params();
  ringtrain::save_params(path.string(), span_of(model->params()));

  CHECK(fs::file_size(path) == size_of(16 + 4 * n));
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() == size_of(16 + 4 * n));
  CHECK(bytes.substr(0, 8) == "RTPARAMS");
  uint64_t count = 0;
  for (int k = 7; k >= 0; --k) {  // little-endian
    count = (count << 8) | static_cast<uint8_t>(bytes[size_of(8 + k)]);
  }
  CHECK(count == static_cast<uint64_t>(n));
  CHECK(std::memcmp(bytes.data() + 16, model->params().data(), size_of(n) * sizeof(float)) == 0);

  const std::vector<float> loaded = ringtrain::load_params(path.string());
  REQUIRE(loaded.size() == size_of(n));
  CHECK(std::memcmp(loaded.data(), model->params().data(), loaded.size() * sizeof(float)) == 0);

  // Saving again over an existing file replaces it; an empty buffer is a valid file too.
  auto cnn = make("cnn");
  cnn->init_params(22);
  ringtrain::save_params(path.string(), span_of(cnn->params()));
  const std::vector<float> reloaded = ringtrain::load_params(path.string());
  REQUIRE(reloaded.size() == size_of(cnn->num_params()));
  CHECK(std::memcmp(reloaded.data(), cnn->params().data(), reloaded.size() * sizeof(float)) == 0);
  ringtrain::save_params(path.string(), std::span<const float>());
  CHECK(fs::file_size(path) == 16);
  CHECK(ringtrain::load_params(path.string()).empty());
}

TEST_CASE("load_params names the file it cannot read as parameters", "[model]") {
  const TempDir dir;
  const fs::path text = dir.path / "notes.txt";
  write_bytes(text, "these are not the parameters you are looking for\n");
  CHECK_THROWS_AS(ringtrain::load_params(text.string()), ringtrain::Error);
  CHECK_THROWS_WITH(ringtrain::load_params(text.string()), Contains(text.string()));

  const fs::path tiny = dir.path / "tiny.bin";
  write_bytes(tiny, "RTP");
  CHECK_THROWS_WITH(ringtrain::load_params(tiny.string()), Contains(tiny.string()));

  // The right header, but the count claims more values than the file holds.
  const fs::path truncated = dir.path / "truncated.bin";
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  ringtrain::save_params(truncated.string(), values);
  std::string bytes = read_bytes(truncated);
  bytes.resize(bytes.size() - 2);
  write_bytes(truncated, bytes);
  CHECK_THROWS_WITH(ringtrain::load_params(truncated.string()), Contains(truncated.string()));

  const fs::path missing = dir.path / "missing.bin";
  CHECK_THROWS_WITH(ringtrain::load_params(missing.string()), Contains(missing.string()));

  // A count so large that 16 + 4 * count wraps around to the file's real size.
  const fs::path lying = dir.path / "lying.bin";
  std::string header = "RTPARAMS";
  const uint64_t huge = uint64_t{1} << 62;
  header.append(reinterpret_cast<const char*>(&huge), sizeof(huge));
  write_bytes(lying, header);
  CHECK_THROWS_AS(ringtrain::load_params(lying.string()), ringtrain::Error);
  CHECK_THROWS_WITH(ringtrain::load_params(lying.string()), Contains(lying.string()));
}

TEST_CASE("save_params into a missing directory throws and leaves nothing behind", "[model]") {
  const TempDir dir;
  const fs::path missing_dir = dir.path / "no_such_dir";
  const fs::path path = missing_dir / "params.bin";
  const std::vector<float> values = {1.0f, -2.0f};
  CHECK_THROWS_AS(ringtrain::save_params(path.string(), values), ringtrain::Error);
  CHECK_THROWS_WITH(ringtrain::save_params(path.string(), values),
                    Contains(path.string()) && Contains("--save-params"));
  CHECK_FALSE(fs::exists(missing_dir));
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
  CHECK(fs::is_empty(dir.path));
}
