// Device tensors and every layer's GPU math against its CPU twin (src/layers/), plus a
// finite-difference gradient check of a small model on the GPU. Runs only where a GPU is
// visible (main.cpp skips otherwise). Conv2D and MaxPool2D run under both --conv-impl values
// (ConvImpl::kDirect, the kernels of kernels/conv.h, and kCudnn, src/cuda/cudnn_layers.cpp).
//
// Tolerances: ReLU and MaxPool2D move values without arithmetic, so they must match the CPU
// bit for bit (ties included for the direct kernel: the gradient goes to the first maximum in
// row-major order; cuDNN does not document which of tied maxima it picks, so its backward is
// compared bit for bit on tie-free data and only checked for a valid choice on ties).
// Dense (cuBLAS, full float32) and Conv2D (both impls) sum the same products in another order
// (blocked GEMM, implicit GEMM, FMA contraction), so they match to
// |gpu - cpu| <= 1e-4 + 1e-4 |cpu|.
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/gpu_context.h"
#include "ringtrain/layers.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/train.h"

using namespace ringtrain;

namespace {

GpuContext& gpu_context() {
  static GpuContext context(0);
  return context;
}

constexpr ConvImpl kConvImpls[] = {ConvImpl::kDirect, ConvImpl::kCudnn};

// The GPU context's Context with Conv2D/MaxPool2D run by `impl`.
Context gpu_ctx(ConvImpl impl) {
  Context ctx = gpu_context().context();
  ctx.conv_impl = impl;
  return ctx;
}

std::vector<float> random_values(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

Tensor host_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t(shape);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

Tensor device_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t(shape, Device::kCuda);
  t.copy_from_host(values);
  return t;
}

// exact: bit-identical; otherwise |gpu - cpu| <= 1e-4 + 1e-4 |cpu|.
void check_close(const Tensor& cpu, const Tensor& gpu, bool exact, const char* what) {
  INFO(what);
  REQUIRE(cpu.shape() == gpu.shape());
  const std::vector<float> g = gpu.to_host();
  int64_t bad = 0;
  double worst = 0.0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double c = cpu[i], d = g[static_cast<size_t>(i)];
    const double err = std::abs(c - d);
    worst = std::max(worst, err);
    if (exact ? (c != d) : (err > 1e-4 + 1e-4 * std::abs(c))) ++bad;
  }
  INFO("largest difference " << worst);
  CHECK(bad == 0);
}

// Runs one layer on both devices with the same parameters, input and output gradient, and
// compares the output, the parameter gradients and the input gradient.
void compare_layer(const std::function<std::unique_ptr<Layer>()>& make, const Shape& sample,
                   int64_t batch, bool exact, const std::vector<float>* input = nullptr,
                   ConvImpl impl = ConvImpl::kDirect) {
  INFO("--conv-impl " << to_string(impl) << ", batch " << batch << ", sample " << sample.str());
  Context gctx = gpu_ctx(impl);
  Context cctx;
  auto cpu = make();
  auto gpu = make();
  std::vector<Tensor> cp, cg, gp, gg;
  uint32_t seed = 1;
  for (const ParamSpec& spec : cpu->param_specs()) {
    const auto values = random_values(spec.shape.numel(), seed++);
    cp.push_back(host_tensor(spec.shape, values));
    gp.push_back(device_tensor(spec.shape, values));
    cg.emplace_back(spec.shape);
    gg.emplace_back(spec.shape, Device::kCuda);
  }
  cpu->bind(cp, cg);
  gpu->bind(gp, gg);
  const Shape in_shape = sample.with_leading(batch);
  const auto x_values = input ? *input : random_values(in_shape.numel(), 100);
  const Tensor cx = host_tensor(in_shape, x_values);
  const Tensor gx = device_tensor(in_shape, x_values);
  Tensor cy, gy(Device::kCuda);
  cpu->forward(cx, cy, cctx);
  gpu->forward(gx, gy, gctx);
  check_close(cy, gy, exact, "forward output");
  const auto dy_values = random_values(cy.numel(), 200);
  const Tensor cdy = host_tensor(cy.shape(), dy_values);
  const Tensor gdy = device_tensor(cy.shape(), dy_values);
  cpu->backward_params(cx, cy, cdy, cctx, [](int64_t) {});
  gpu->backward_params(gx, gy, gdy, gctx, [](int64_t) {});
  Tensor cdx, gdx(Device::kCuda);
  cpu->backward_input(cx, cy, cdy, cdx, cctx);
  gpu->backward_input(gx, gy, gdy, gdx, gctx);
  gpu_context().synchronize();
  for (size_t k = 0; k < cg.size(); ++k) check_close(cg[k], gg[k], exact, "parameter gradient");
  check_close(cdx, gdx, exact, "input gradient");
}

}  // namespace

TEST_CASE("device tensors: zero-filled, explicit copies, fill, views", "[gpu][tensor]") {
  gpu_context();
  Tensor t(Shape{3, 5}, Device::kCuda);
  CHECK(t.device() == Device::kCuda);
  CHECK(t.to_host() == std::vector<float>(15, 0.0f));
  const auto values = random_values(15, 7);
  t.copy_from_host(values);
  CHECK(t.to_host() == values);
  t.fill(2.5f);
  CHECK(t.to_host() == std::vector<float>(15, 2.5f));
  Tensor view = Tensor::view(t.data() + 5, Shape{5}, Device::kCuda);
  view.fill(0.0f);
  const auto host = t.to_host();
  CHECK(host[4] == 2.5f);
  CHECK(host[5] == 0.0f);
  CHECK(host[10] == 2.5f);
  Tensor grown(Device::kCuda);
  grown.resize(Shape{1000});
  CHECK(grown.to_host() == std::vector<float>(1000, 0.0f));
}

TEST_CASE("GPU dense matches the CPU (cuBLAS, full float32)", "[gpu][layers]") {
  compare_layer([] { return make_dense(784, 500); }, Shape{784}, 64, false);
  compare_layer([] { return make_dense(500, 10); }, Shape{500}, 7, false);
  // Above 2 Mi weights the gradient is finished in row blocks: the same math in pieces.
  compare_layer([] { return make_dense(1024, 4096); }, Shape{1024}, 4, false);
}

TEST_CASE("GPU relu matches the CPU bit for bit", "[gpu][layers]") {
  compare_layer([] { return make_relu(); }, Shape{37}, 9, true);
}

TEST_CASE("GPU conv2d matches the CPU (the cnn's shapes and a generic one), direct and cuDNN",
          "[gpu][layers]") {
  for (const ConvImpl impl : kConvImpls) {
    // The cnn's two convolutions: 1 -> 8 channels on 28x28 (Cin = 1), 8 -> 16 on 14x14.
    // Batches up to 8, not the trainer's 64: dw sums B*H*W products per weight in one running
    // float sum on the CPU, whose own error (measured against a double sum on data like this)
    // grows with B: at B = 64 it exceeds the 1e-4 + 1e-4|cpu| tolerance on near-zero weights
    // of the 8 -> 16 layer, and at B = 32 it uses 97.5% of it on the 1 -> 8 layer, so a GPU
    // more accurate than the CPU could fail. At 8 it is about a quarter.
    for (const int64_t batch : {3, 5, 8}) {
      compare_layer([] { return make_conv2d(1, 8); }, Shape{28, 28, 1}, batch, false, nullptr,
                    impl);
      compare_layer([] { return make_conv2d(8, 16); }, Shape{14, 14, 8}, batch, false, nullptr,
                    impl);
    }
    compare_layer([] { return make_conv2d(3, 5); }, Shape{6, 9, 3}, 2, false, nullptr,
                  impl);  // CPU: im2col
  }
}

TEST_CASE("GPU conv2d through cuDNN gives the same bits run to run", "[gpu][layers]") {
  // Two runs of forward and both backward passes on the same data give the same bits (fixed
  // deterministic algorithms, no float atomics); the second run uses the cached plan.
  Context ctx = gpu_ctx(ConvImpl::kCudnn);
  const auto run = [&] {
    auto layer = make_conv2d(8, 16);
    std::vector<Tensor> params, grads;
    uint32_t seed = 1;
    for (const ParamSpec& spec : layer->param_specs()) {
      params.push_back(device_tensor(spec.shape, random_values(spec.shape.numel(), seed++)));
      grads.emplace_back(spec.shape, Device::kCuda);
    }
    layer->bind(params, grads);
    const Shape in_shape = Shape{14, 14, 8}.with_leading(64);
    const Tensor x = device_tensor(in_shape, random_values(in_shape.numel(), 100));
    Tensor y(Device::kCuda), dx(Device::kCuda);
    layer->forward(x, y, ctx);
    const Tensor dy = device_tensor(y.shape(), random_values(y.numel(), 200));
    layer->backward_params(x, y, dy, ctx, [](int64_t) {});
    layer->backward_input(x, y, dy, dx, ctx);
    gpu_context().synchronize();
    std::vector<float> all = y.to_host();
    for (const Tensor& g : grads) {
      const auto values = g.to_host();
      all.insert(all.end(), values.begin(), values.end());
    }
    const auto dx_values = dx.to_host();
    all.insert(all.end(), dx_values.begin(), dx_values.end());
    return all;
  };
  const std::vector<float> first = run();
  const std::vector<float> second = run();
  REQUIRE(first.size() == second.size());
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
}

namespace {

// True when some 2x2 window of x[B,H,W,C] holds two equal values (a tie for the maximum or not).
bool has_window_ties(const std::vector<float>& x, int64_t batch, int64_t height, int64_t width,
                     int64_t channels) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < height; i += 2)
      for (int64_t j = 0; j < width; j += 2)
        for (int64_t c = 0; c < channels; ++c) {
          float v[4];
          for (int k = 0; k < 4; ++k)
            v[k] = x[static_cast<size_t>(((b * height + i + k / 2) * width + j + k % 2) * channels +
                                         c)];
          for (int p = 0; p < 4; ++p)
            for (int q = p + 1; q < 4; ++q)
              if (v[p] == v[q]) return true;
        }
  return false;
}

}  // namespace

TEST_CASE("GPU maxpool2d matches the CPU bit for bit, ties to the first maximum", "[gpu][layers]") {
  compare_layer([] { return make_maxpool2d(); }, Shape{8, 6, 16}, 3, true);
  // Values from {0, 0.5, 1}: most windows hold ties.
  std::vector<float> ties = random_values(3 * 8 * 6 * 8, 11, 0.0f, 3.0f);
  for (float& v : ties) v = std::floor(v) * 0.5f;
  compare_layer([] { return make_maxpool2d(); }, Shape{8, 6, 8}, 3, true, &ties);
}

TEST_CASE("GPU maxpool2d matches the CPU bit for bit on tie-free data, direct and cuDNN",
          "[gpu][layers]") {
  struct Case {
    int64_t batch, height, width, channels;
  };
  // The cnn's two poolings (after conv 1 -> 8 on 28x28 and conv 8 -> 16 on 14x14), a generic one.
  const Case cases[] = {
      {3, 28, 28, 8}, {64, 28, 28, 8}, {3, 14, 14, 16}, {64, 14, 14, 16}, {3, 8, 6, 16}};
  uint32_t seed = 300;
  for (const Case& c : cases) {
    const auto x = random_values(c.batch * c.height * c.width * c.channels, seed++);
    // Random floats tie with probability ~2^-24 per pair; make sure this draw has none, so that
    // the first maximum is the only maximum and every implementation must agree.
    REQUIRE_FALSE(has_window_ties(x, c.batch, c.height, c.width, c.channels));
    for (const ConvImpl impl : kConvImpls) {
      compare_layer([] { return make_maxpool2d(); }, Shape{c.height, c.width, c.channels}, c.batch,
                    true, &x, impl);
    }
  }
}

TEST_CASE("GPU maxpool2d through cuDNN: ties give the forward's bits and one maximum the gradient",
          "[gpu][layers]") {
  // cuDNN does not document which of tied maxima receives the gradient (the CPU and the direct
  // kernel: the first in row-major order). Whatever it picks, the forward must equal the CPU's
  // bit for bit (the maximum is the same value), and each window's gradient must go whole to
  // exactly one position holding the maximum (any other split changes the gradient's sum). This
  // probes cuDNN's undocumented choice: a failure here means the cuDNN pooling backward is not
  // a valid gradient on tied data, not a tolerance problem.
  const int64_t batch = 3, height = 8, width = 6, channels = 8;
  std::vector<float> x = random_values(batch * height * width * channels, 11, 0.0f, 3.0f);
  for (float& v : x) v = std::floor(v) * 0.5f;  // values from {0, 0.5, 1}: most windows tie
  REQUIRE(has_window_ties(x, batch, height, width, channels));
  const Shape shape{batch, height, width, channels};
  Context cctx;
  Context gctx = gpu_ctx(ConvImpl::kCudnn);
  auto cpu = make_maxpool2d();
  auto gpu = make_maxpool2d();
  const Tensor cx = host_tensor(shape, x);
  const Tensor gx = device_tensor(shape, x);
  Tensor cy, gy(Device::kCuda), gdx(Device::kCuda);
  cpu->forward(cx, cy, cctx);
  gpu->forward(gx, gy, gctx);
  check_close(cy, gy, true, "forward output");
  // dy values distinct and nonzero, so a split or a duplicated gradient shows.
  std::vector<float> dy = random_values(cy.numel(), 12, 1.0f, 2.0f);
  const Tensor gdy = device_tensor(cy.shape(), dy);
  gpu->backward_input(gx, gy, gdy, gdx, gctx);
  gpu_context().synchronize();
  const std::vector<float> dx = gdx.to_host();
  int64_t bad_windows = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < height / 2; ++i)
      for (int64_t j = 0; j < width / 2; ++j)
        for (int64_t c = 0; c < channels; ++c) {
          const size_t out =
              static_cast<size_t>(((b * (height / 2) + i) * (width / 2) + j) * channels + c);
          int receivers = 0;
          bool valid = true;
          for (int k = 0; k < 4; ++k) {
            const size_t in = static_cast<size_t>(
                ((b * height + 2 * i + k / 2) * width + 2 * j + k % 2) * channels + c);
            if (dx[in] == 0.0f) continue;
            ++receivers;
            valid = valid && dx[in] == dy[out] && x[in] == cy[static_cast<int64_t>(out)];
          }
          if (receivers != 1 || !valid) ++bad_windows;
        }
  CHECK(bad_windows == 0);
}

TEST_CASE("GPU gradients agree with finite differences of the GPU loss", "[gpu][gradcheck]") {
  Context& ctx = gpu_context().context();
  // A small cnn: conv 1->2, relu, pool, flatten, dense 2*4*4 -> 3.
  Model model(Shape{8, 8, 1});
  model.add(make_conv2d(1, 2));
  model.add(make_relu());
  model.add(make_maxpool2d());
  model.add(make_flatten());
  model.add(make_dense(32, 3));
  model.finalize(Device::kCuda);
  model.init_params(5);
  Batch batch;
  batch.images = host_tensor(Shape{4, 8, 8, 1}, random_values(4 * 64, 3, 0.0f, 1.0f));
  batch.labels = {0, 1, 2, 1};
  // The analytic gradient: one step with a zero learning rate leaves the parameters alone.
  auto sgd = make_optimizer(OptimizerConfig{}, model.num_params(), ctx);
  StepWorkspace workspace;
  train_step(model, *sgd, batch, 0.0f, workspace, ctx);
  const std::vector<float> grads = model.grads().to_host();
  std::vector<float> params = model.params_to_host();
  const auto loss_at = [&](const std::vector<float>& p) {
    model.params_from_host(p);
    return evaluate_batch_device(model, batch, ctx).mean_loss();
  };
  // Central differences in float: h = 1e-2 keeps the rounding of the loss (~1e-7) well below
  // the difference; tolerance 2e-2 absolute + 5% relative (float, loose on purpose).
  const float h = 1e-2f;
  int checked = 0;
  for (size_t i = 0; i < params.size(); i += 3) {
    std::vector<float> p = params;
    p[i] = params[i] + h;
    const double up = loss_at(p);
    p[i] = params[i] - h;
    const double down = loss_at(p);
    const double numeric = (up - down) / (2.0 * static_cast<double>(h));
    INFO("parameter " << i << ": analytic " << grads[i] << " numeric " << numeric);
    CHECK(std::abs(numeric - grads[i]) <= 2e-2 + 5e-2 * std::abs(numeric));
    ++checked;
  }
  CHECK(checked > 20);
  model.params_from_host(params);
}
