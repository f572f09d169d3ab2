// GPU training equals CPU training to a tolerance for k steps: the same model, seed, batches
// and optimizer on both devices, parameters compared after each of k steps. Runs only where a
// GPU is visible (main.cpp skips otherwise).
//
// Tolerances: SGD (with momentum) is linear in the gradients, so the per-step float
// differences (cuBLAS's summation order, ~1e-6 relative) stay small: max |gpu - cpu| <= 1e-4
// after 5 steps. Adam divides by sqrt(v): a gradient near 0 whose last bits differ can move
// its weight by up to 2 lr per step, so Adam is checked by the mean difference (<= 1e-5) and
// the bound 2 lr k on the largest.
#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "device_buffer.h"
#include "gather.h"
#include "kernels.h"
#include "ringtrain/allreduce.h"
#include "ringtrain/gpu_context.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/optim_math.h"
#include "ringtrain/train.h"

using namespace ringtrain;
using ringtrain::test::DeviceBuffer;

namespace {

GpuContext& gpu_context() {
  static GpuContext context(0);
  return context;
}

Batch synthetic_batch(int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> label(0, 9);
  Batch batch;
  batch.images = Tensor(Shape{rows, 28, 28, 1});
  for (int64_t i = 0; i < batch.images.numel(); ++i) batch.images[i] = pixel(gen);
  for (int64_t r = 0; r < rows; ++r) batch.labels.push_back(label(gen));
  return batch;
}

struct Difference {
  double max = 0.0, mean = 0.0;
};
Difference compare(const std::vector<float>& cpu, const std::vector<float>& gpu) {
  Difference d;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double e = std::abs(static_cast<double>(cpu[i]) - gpu[i]);
    d.max = std::max(d.max, e);
    d.mean += e;
  }
  d.mean /= static_cast<double>(cpu.size());
  return d;
}

void train_both(const std::string& model_name, const OptimizerConfig& config, float lr, int steps,
                bool adam) {
  Context& gctx = gpu_context().context();
  Context cctx;
  ModelSpec spec{.name = model_name};
  if (model_name == "mlp") spec.hidden = {128, 64};
  auto cpu = make_model(spec);
  spec.device = Device::kCuda;
  auto gpu = make_model(spec);
  cpu->init_params(42);
  gpu->init_params(42);
  REQUIRE(cpu->params_to_host() == gpu->params_to_host());  // the same bits on both devices
  auto cpu_opt = make_optimizer(config, cpu->num_params(), cctx);
  auto gpu_opt = make_optimizer(config, gpu->num_params(), gctx);
  StepWorkspace cpu_ws, gpu_ws;
  for (int step = 0; step < steps; ++step) {
    const Batch batch = synthetic_batch(32, 1000 + static_cast<uint32_t>(step));
    const StepStats c = train_step(*cpu, *cpu_opt, batch, lr, cpu_ws, cctx);
    const StepStats g = train_step(*gpu, *gpu_opt, batch, lr, gpu_ws, gctx);
    INFO(model_name << " " << config.kind << " step " << step << ": loss cpu " << c.loss << " gpu "
                    << g.loss);
    CHECK(std::abs(c.loss - g.loss) <= 1e-4 * (1.0 + std::abs(c.loss)));
    CHECK(c.correct == g.correct);
    const Difference d = compare(cpu->params_to_host(), gpu->params_to_host());
    INFO("max difference " << d.max << ", mean " << d.mean);
    if (adam) {
      CHECK(d.mean <= 1e-5);
      CHECK(d.max <= 2.0 * lr * (step + 1));
    } else {
      CHECK(d.max <= 1e-4);
    }
  }
  // The optimizer state leaves the device through explicit copies, in the CPU's layout.
  const auto cpu_state = state_to_host(*cpu_opt);
  const auto gpu_state = state_to_host(*gpu_opt);
  REQUIRE(cpu_state.size() == gpu_state.size());
  for (size_t b = 0; b < cpu_state.size(); ++b) CHECK(cpu_state[b].size() == gpu_state[b].size());
}

}  // namespace

TEST_CASE("GPU mlp training equals CPU training for 5 steps (SGD momentum, Adam)",
          "[gpu][training]") {
  train_both("mlp", {.kind = "sgd", .momentum = 0.9f, .weight_decay = 1e-4f}, 0.05f, 5, false);
  train_both("mlp", {.kind = "adam"}, 1e-3f, 5, true);
}

TEST_CASE("GPU cnn training equals CPU training for 5 steps (SGD, Adam)", "[gpu][training]") {
  train_both("cnn", {.kind = "sgd", .momentum = 0.5f, .nesterov = true}, 0.05f, 5, false);
  train_both("cnn", {.kind = "adam"}, 1e-3f, 5, true);
}

TEST_CASE("a GPU run is deterministic: the same bits twice", "[gpu][training]") {
  Context& ctx = gpu_context().context();
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    auto model = make_model({.name = "cnn", .device = Device::kCuda});
    model->init_params(7);
    auto opt = make_optimizer({.kind = "adam"}, model->num_params(), ctx);
    StepWorkspace ws;
    for (int step = 0; step < 3; ++step)
      train_step(*model, *opt, synthetic_batch(16, 50 + static_cast<uint32_t>(step)), 1e-3f, ws,
                 ctx);
    if (run == 0) {
      first = model->params_to_host();
    } else {
      CHECK(model->params_to_host() == first);
    }
  }
}

TEST_CASE("the device step's guard sees the loss and the gradients' finite count",
          "[gpu][training]") {
  Context& ctx = gpu_context().context();
  auto model = make_model({.name = "mlp", .hidden = {32}, .device = Device::kCuda});
  model->init_params(1);
  const std::vector<float> before = model->params_to_host();
  auto opt = make_optimizer({}, model->num_params(), ctx);
  StepWorkspace ws;
  Batch batch = synthetic_batch(8, 3);
  batch.images[0] = std::nanf("");
  bool called = false;
  const StepStats stats = train_step(*model, *opt, batch, 0.1f, ws, ctx, nullptr,
                                     [&](const StepStats& s, std::span<const float> grads) {
                                       called = true;
                                       CHECK(grads.empty());
                                       REQUIRE(s.grads_finite.has_value());
                                       CHECK_FALSE(*s.grads_finite);
                                       CHECK_FALSE(std::isfinite(s.loss));
                                       return false;
                                     });
  CHECK(called);
  CHECK_FALSE(stats.updated);
  CHECK(model->params_to_host() == before);  // skipped: nothing changed
}

namespace {

// A stand-in for a device Allreduce: run() scales the bucket by `factor` with a kernel queued on
// the communication stream, as the NCCL kinds queue theirs, and records which buckets it got.
class ScalingAllreduce final : public Allreduce {
 public:
  ScalingAllreduce(const Context& ctx, const float& factor)
      : stream_(static_cast<cudaStream_t>(ctx.comm_stream)), factor_(factor) {}
  void run(float* data, size_t count, ReduceOp op) override {
    REQUIRE(op == ReduceOp::kAvg);  // on the test's thread: the stream engine has none
    gpu::scale(data, factor_, static_cast<int64_t>(count), stream_);
    runs.push_back({data, count});
  }
  AllreduceKind kind() const override { return AllreduceKind::kDeviceRing; }
  void reserve(size_t count) override { reserved = std::max(reserved, count); }
  int size() const override { return 2; }

  std::vector<std::pair<const float*, size_t>> runs;
  size_t reserved = 0;

 private:
  cudaStream_t stream_;
  const float& factor_;
};

}  // namespace

TEST_CASE("the stream GradSync: the optimizer waits for the communication stream",
          "[gpu][grad_sync]") {
  Context& ctx = gpu_context().context();
  // Two identical replicas; one averages through the stream engine whose "allreduce" is a
  // kernel on the communication stream, the other has none.
  auto plain = make_model({.name = "mlp", .hidden = {256, 256}, .device = Device::kCuda});
  auto bucketed = make_model({.name = "mlp", .hidden = {256, 256}, .device = Device::kCuda});
  plain->init_params(9);
  bucketed->init_params(9);
  auto plain_opt = make_optimizer({}, plain->num_params(), ctx);
  auto bucketed_opt = make_optimizer({}, bucketed->num_params(), ctx);
  float factor = 1.0f;  // the identity first: the same bits as without the engine
  ScalingAllreduce allreduce(ctx, factor);
  const auto sync = make_grad_sync(
      bucketed->grads().data(), bucketed->grad_ranges(), allreduce,
      {.first_bucket_elements = 1000, .bucket_elements = 50000, .overlap = true}, ctx);
  CHECK(sync->device() == Device::kCuda);
  CHECK(sync->overlap());
  const std::vector<Bucket>& buckets = sync->buckets();
  REQUIRE(buckets.size() > 2);
  size_t largest = 0;
  for (const Bucket& b : buckets) largest = std::max(largest, static_cast<size_t>(b.size()));
  CHECK(allreduce.reserved == largest);  // every scratch sized before the first step
  StepWorkspace plain_ws, bucketed_ws;
  for (int step = 0; step < 3; ++step) {
    const Batch batch = synthetic_batch(16, 70 + static_cast<uint32_t>(step));
    train_step(*plain, *plain_opt, batch, 0.1f, plain_ws, ctx);
    allreduce.runs.clear();
    const StepStats s = train_step(*bucketed, *bucketed_opt, batch, 0.1f, bucketed_ws, ctx, &*sync);
    CHECK(s.comm.comm_ms >= 0.0);
    CHECK(s.comm.exposed_ms >= 0.0);
    CHECK(bucketed->params_to_host() == plain->params_to_host());
    // Each bucket once, in index order.
    REQUIRE(allreduce.runs.size() == buckets.size());
    for (size_t k = 0; k < buckets.size(); ++k) {
      CHECK(allreduce.runs[k].first == bucketed->grads().data() + buckets[k].begin);
      CHECK(allreduce.runs[k].second == static_cast<size_t>(buckets[k].size()));
    }
  }
  // Scaling the gradients to zero on the communication stream must leave plain SGD's weights
  // untouched: it would not if the update ran before the "averaging" finished.
  factor = 0.0f;
  const std::vector<float> before = bucketed->params_to_host();
  train_step(*bucketed, *bucketed_opt, synthetic_batch(16, 99), 0.1f, bucketed_ws, ctx, &*sync);
  CHECK(bucketed->params_to_host() == before);
}

namespace {

// Trains `model_name` for the given batch sizes, eagerly or with captured graphs, evaluating a
// larger batch after step `eval_after` (-1: never): the evaluation grows the activations, so a
// graph run must notice and recapture. Returns the parameters and every step's statistics.
struct GraphRun {
  std::vector<float> params;
  std::vector<StepStats> steps;
  int64_t captures = 0;
};
GraphRun train_graph_or_eager(const std::string& model_name, const OptimizerConfig& config,
                              const std::vector<int64_t>& batch_sizes, int eval_after,
                              bool graphs) {
  Context& ctx = gpu_context().context();
  ModelSpec spec{.name = model_name, .device = Device::kCuda};
  if (model_name == "mlp") spec.hidden = {128, 64};
  auto model = make_model(spec);
  model->init_params(11);
  auto opt = make_optimizer(config, model->num_params(), ctx);
  StepWorkspace ws;
  ws.cuda_graph = graphs;
  GraphRun run;
  for (size_t step = 0; step < batch_sizes.size(); ++step) {
    // A learning rate that changes every step: it must reach the optimizer, outside the graph.
    const float lr = 0.01f / static_cast<float>(step + 1);
    run.steps.push_back(train_step(
        *model, *opt, synthetic_batch(batch_sizes[step], 300 + static_cast<uint32_t>(step)), lr, ws,
        ctx));
    if (static_cast<int>(step) == eval_after) {
      Batch eval_batch = synthetic_batch(100, 9);
      (void)evaluate_batch_device(*model, eval_batch, ctx);
    }
  }
  run.params = model->params_to_host();
  run.captures = step_graph_captures(ws);
  return run;
}

void check_graph_equals_eager(const std::string& model_name, const OptimizerConfig& config,
                              const std::vector<int64_t>& batch_sizes, int eval_after,
                              const std::vector<bool>& expected_replays,
                              int64_t expected_captures) {
  INFO(model_name << " " << config.kind);
  const GraphRun eager = train_graph_or_eager(model_name, config, batch_sizes, eval_after, false);
  const GraphRun graph = train_graph_or_eager(model_name, config, batch_sizes, eval_after, true);
  REQUIRE(graph.steps.size() == expected_replays.size());
  for (size_t step = 0; step < graph.steps.size(); ++step) {
    INFO("step " << step);
    CHECK(!eager.steps[step].graph_replayed.has_value());
    CHECK(graph.steps[step].graph_replayed == std::optional<bool>(expected_replays[step]));
    // The same kernels with the same arguments: the same bits.
    CHECK(graph.steps[step].loss == eager.steps[step].loss);
    CHECK(graph.steps[step].correct == eager.steps[step].correct);
  }
  CHECK(graph.captures == expected_captures);
  CHECK(eager.captures == 0);
  CHECK(graph.params == eager.params);
}

}  // namespace

TEST_CASE("a step replayed from a CUDA graph gives the eager step's bits", "[gpu][graphs]") {
  // Step 0 eager (allocates), step 1 captures and replays, later steps replay.
  const std::vector<int64_t> batches(6, 32);
  const std::vector<bool> replays = {false, true, true, true, true, true};
  check_graph_equals_eager("mlp", {.kind = "sgd", .momentum = 0.9f}, batches, -1, replays, 1);
  check_graph_equals_eager("mlp", {.kind = "adam"}, batches, -1, replays, 1);
  check_graph_equals_eager("cnn", {.kind = "sgd", .momentum = 0.9f, .nesterov = true}, batches, -1,
                           replays, 1);
  check_graph_equals_eager("cnn", {.kind = "adam"}, batches, -1, replays, 1);
}

TEST_CASE("a step graph is recaptured when buffers move or the batch shape changes",
          "[gpu][graphs]") {
  // The evaluation after step 2 grows the activations (batch 100 > 32): step 3 must not replay
  // the old graph (it would write freed memory); it runs eagerly and step 4 recaptures.
  check_graph_equals_eager("cnn", {.kind = "sgd"}, {32, 32, 32, 32, 32, 32}, 2,
                           {false, true, true, false, true, true}, 2);
  // A smaller batch (an epoch's last, say) runs eagerly in the buffers it shrank into (nothing
  // is allocated), so the next batch of the usual shape finds its graph still valid.
  check_graph_equals_eager("mlp", {.kind = "sgd"}, {32, 32, 32, 16, 32, 32, 32}, -1,
                           {false, true, true, false, true, true, true}, 1);
  // Two sizes alternating after a first eager step of each: each new shape is eager once, then
  // captured (one graph at a time, so every switch recaptures).
  check_graph_equals_eager("mlp", {.kind = "sgd"}, {32, 16, 16, 32, 32}, -1,
                           {false, false, true, false, true}, 2);
}

TEST_CASE("a device weight average follows the host one", "[gpu][ema]") {
  Context& ctx = gpu_context().context();
  auto model = make_model({.name = "cnn", .device = Device::kCuda});
  model->init_params(5);
  auto opt = make_optimizer({.kind = "sgd", .momentum = 0.9f}, model->num_params(), ctx);
  const Tensor& params = model->params();
  WeightEma device_ema(0.99f, params.data(), params.numel(), ctx.stream);
  WeightEma host_ema(0.99f, model->params_to_host());
  // The kernel's exact arithmetic (kernels/optim.cu: fma(keep, shadow, take * w)), on the host.
  std::vector<float> reference = model->params_to_host();
  CHECK(device_ema.device() == Device::kCuda);
  CHECK_THROWS_WITH(device_ema.shadow(), Catch::Contains("shadow_to_host"));
  StepWorkspace ws;
  for (int64_t step = 0; step < 4; ++step) {
    train_step(*model, *opt, synthetic_batch(16, 70 + static_cast<uint32_t>(step)), 0.05f, ws, ctx);
    const EmaFactors f = ema_factors(0.99f, step);
    device_ema.update({params.data(), static_cast<size_t>(params.numel())});
    const std::vector<float> w = model->params_to_host();
    host_ema.update(w);
    for (size_t i = 0; i < w.size(); ++i)
      reference[i] = std::fma(f.keep, reference[i], f.take * w[i]);
  }
  CHECK(device_ema.updates() == 4);
  const std::vector<float> device_shadow = device_ema.shadow_to_host();
  CHECK(device_shadow == reference);
  // The host loop is the same expression; whether the host compiler fuses it as the kernel
  // does depends on its target (kernels/README.md), so it is compared to float rounding.
  const Difference d = compare(
      std::vector<float>(host_ema.shadow().begin(), host_ema.shadow().end()), device_shadow);
  CHECK(d.max <= 1e-6);
  CHECK(device_shadow != model->params_to_host());  // it is an average, not a copy
  // A checkpoint's shadow goes back to the device as it was.
  WeightEma restored(0.99f, params.data(), params.numel(), ctx.stream);
  restored.restore(device_shadow, device_ema.updates());
  CHECK(restored.shadow_to_host() == device_shadow);
  CHECK(restored.updates() == 4);
}

namespace {

// A data set of random bytes in MNIST's image shape.
Dataset random_dataset(int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255), label(0, 9);
  Dataset data;
  data.count = count;
  data.rows = 28;
  data.cols = 28;
  data.images.resize(static_cast<size_t>(count * 28 * 28));
  for (uint8_t& b : data.images) b = static_cast<uint8_t>(byte(gen));
  for (int64_t i = 0; i < count; ++i) data.labels.push_back(static_cast<uint8_t>(label(gen)));
  return data;
}

}  // namespace

TEST_CASE("gpu::gather_batch makes make_batch's batch, bit for bit", "[gpu][gather]") {
  const Dataset data = random_dataset(40, 3);
  // Repeats and the last sample included, as an epoch's order never has but a caller may.
  const std::vector<int64_t> indices = {39, 0, 7, 7, 21, 39, 3};
  Tensor host_images;
  std::vector<int32_t> host_labels;
  make_batch(data, indices, host_images, host_labels);
  DeviceBuffer<uint8_t> d_data(data.images), d_labels(data.labels);
  std::vector<int32_t> indices32(indices.begin(), indices.end());
  DeviceBuffer<int32_t> d_indices(indices32);
  const auto rows = static_cast<int64_t>(indices.size());
  DeviceBuffer<float> d_images(static_cast<size_t>(rows * 784));
  DeviceBuffer<int32_t> d_out_labels(indices.size());
  gpu::gather_batch(d_data.data(), d_labels.data(), d_indices.data(), rows, 784, kPixelScale,
                    d_images.data(), d_out_labels.data(), nullptr);
  const std::vector<float> images = d_images.download();
  CHECK(images == std::vector<float>(host_images.data(), host_images.data() + rows * 784));
  CHECK(d_out_labels.download() == host_labels);
}

TEST_CASE("--data-on-gpu steps equal host-batch steps, eager and from graphs", "[gpu][gather]") {
  Context& ctx = gpu_context().context();
  const Dataset data = random_dataset(200, 4);
  const auto device_data = upload_dataset(data, 10);
  CHECK(device_dataset_bytes(*device_data) == 200 * (784 + 1));
  for (const bool graphs : {false, true}) {
    INFO("graphs " << graphs);
    auto host_model = make_model({.name = "cnn", .device = Device::kCuda});
    auto gather_model = make_model({.name = "cnn", .device = Device::kCuda});
    host_model->init_params(8);
    gather_model->init_params(8);
    const OptimizerConfig config{.kind = "sgd", .momentum = 0.9f};
    auto host_opt = make_optimizer(config, host_model->num_params(), ctx);
    auto gather_opt = make_optimizer(config, gather_model->num_params(), ctx);
    StepWorkspace host_ws, gather_ws;
    gather_ws.cuda_graph = graphs;
    Batch batch;
    for (int64_t step = 0; step < 5; ++step) {
      std::vector<int64_t> indices;
      for (int64_t r = 0; r < 24; ++r) indices.push_back((step * 37 + r * 11) % data.count);
      make_batch(data, indices, batch.images, batch.labels);
      const StepStats h = train_step(*host_model, *host_opt, batch, 0.05f, host_ws, ctx);
      const StepStats g = train_step(*gather_model, *gather_opt, StepInput(*device_data, indices),
                                     0.05f, gather_ws, ctx);
      CHECK(g.loss == h.loss);
      CHECK(g.correct == h.correct);
      if (graphs) CHECK(g.graph_replayed == std::optional<bool>(step > 0));
    }
    CHECK(gather_model->params_to_host() == host_model->params_to_host());
    // An index outside the data set is refused on the host, before anything is queued.
    const std::vector<int64_t> bad = {0, 200};
    CHECK_THROWS_WITH(
        train_step(*gather_model, *gather_opt, StepInput(*device_data, bad), 0.05f, gather_ws, ctx),
        Catch::Contains("outside the data set"));
  }
  Dataset bad_labels = random_dataset(5, 5);
  bad_labels.labels[3] = 10;
  CHECK_THROWS_WITH(upload_dataset(bad_labels, 10), Catch::Contains("label 10 of sample 3"));
}

TEST_CASE("a device step runs the host's work once, while it is queued", "[gpu][training]") {
  Context& ctx = gpu_context().context();
  auto model = make_model({.name = "mlp", .hidden = {64}, .device = Device::kCuda});
  model->init_params(2);
  auto opt = make_optimizer({.kind = "sgd"}, model->num_params(), ctx);
  StepWorkspace ws;
  int calls = 0;
  ws.while_device_runs = [&calls] { ++calls; };
  for (int step = 0; step < 3; ++step)
    train_step(*model, *opt, synthetic_batch(8, static_cast<uint32_t>(step)), 0.01f, ws, ctx);
  CHECK(calls == 3);
  // With the --check-finite guard there are two waits; the work still runs once.
  const BeforeUpdateFn guard = [](const StepStats&, std::span<const float>) { return true; };
  train_step(*model, *opt, synthetic_batch(8, 9), 0.01f, ws, ctx, nullptr, guard);
  CHECK(calls == 4);
}
