// End-to-end training on the real default data (Fashion-MNIST from Debian's package): the loss
// falls, the accuracy passes a stated bar, and the same seed gives the same bits.
#include <cstring>
#include <filesystem>

#include <catch2/catch.hpp>

#include "ringtrain/data.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/train.h"

using namespace ringtrain;

namespace {

const MnistData& fashion() {
  static const MnistData data = [] {
    const std::string dir = "/usr/share/datasets/fashion-mnist";
    if (!std::filesystem::exists(dir)) {
      FAIL("Fashion-MNIST is missing from " << dir << ": run scripts/install_deps.sh");
    }
    return load_mnist_dir(dir);
  }();
  return data;
}

struct RunResult {
  std::vector<float> params;
  double first_loss = 0.0;  // mean over the first 20 steps
  double last_loss = 0.0;   // mean over the last 20 steps
  double test_accuracy = 0.0;
};

// Trains `steps` steps with the app's loop structure: epoch sampler, batches, train_step.
RunResult train(const std::string& model_name, const OptimizerConfig& optimizer_config, float lr,
                int64_t batch_size, int64_t steps, uint64_t seed) {
  const MnistData& data = fashion();
  set_cpu_threads(1);  // Eigen would otherwise start one OpenMP thread per core
  auto model = make_model({.name = model_name});
  model->init_params(seed);
  auto optimizer = make_optimizer(optimizer_config, model->num_params());
  EpochSampler sampler(data.train.count, seed);
  const int64_t steps_per_epoch = data.train.count / batch_size;
  Batch batch;
  StepWorkspace workspace;
  Context ctx;
  RunResult result;
  for (int64_t step = 0; step < steps; ++step) {
    const auto order = sampler.order(step / steps_per_epoch);
    make_batch(data.train,
               order.subspan(static_cast<size_t>((step % steps_per_epoch) * batch_size),
                             static_cast<size_t>(batch_size)),
               batch.images, batch.labels);
    const StepStats stats = train_step(*model, *optimizer, batch, lr, workspace, ctx);
    if (step < 20) result.first_loss += stats.loss / 20.0;
    if (step >= steps - 20) result.last_loss += stats.loss / 20.0;
  }
  Batch scratch;
  result.test_accuracy = evaluate(*model, data.test, 0, 2000, 500, scratch, ctx).accuracy();
  result.params.assign(model->params().data(), model->params().data() + model->num_params());
  return result;
}

}  // namespace

TEST_CASE("mlp trains on Fashion-MNIST: loss falls, accuracy >= 78% after 400 steps", "[train]") {
  const RunResult run = train("mlp", {.kind = "adam"}, 1e-3f, 64, 400, 7);
  INFO("first loss " << run.first_loss << ", last loss " << run.last_loss << ", accuracy "
                     << run.test_accuracy);
  CHECK(run.last_loss < 0.5 * run.first_loss);
  // 400 Adam steps of 64 images reach about 82% on the first 2000 test images; chance is 10%.
  CHECK(run.test_accuracy >= 0.78);
}

TEST_CASE("cnn trains on Fashion-MNIST: loss falls, accuracy >= 70% after 300 steps", "[train]") {
  const RunResult run = train("cnn", {.kind = "sgd", .momentum = 0.9f}, 0.02f, 64, 300, 7);
  INFO("first loss " << run.first_loss << ", last loss " << run.last_loss << ", accuracy "
                     << run.test_accuracy);
  CHECK(run.last_loss < 0.6 * run.first_loss);
  CHECK(run.test_accuracy >= 0.70);
}

TEST_CASE("the same seed gives bitwise identical parameters and another seed does not", "[train]") {
  for (const char* name : {"mlp", "cnn"}) {
    INFO("model " << name);
    const OptimizerConfig sgd{.kind = "sgd", .momentum = 0.9f, .weight_decay = 1e-4f};
    const RunResult a = train(name, sgd, 0.01f, 32, 60, 11);
    const RunResult b = train(name, sgd, 0.01f, 32, 60, 11);
    const RunResult c = train(name, sgd, 0.01f, 32, 60, 12);
    REQUIRE(a.params.size() == b.params.size());
    CHECK(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.params.data(), c.params.data(), a.params.size() * sizeof(float)) != 0);
  }
}
