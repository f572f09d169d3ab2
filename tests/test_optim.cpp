// Tests for optim.h: the optimizer updates, learning-rate schedules and weight EMA against
// numbers worked out by hand (in double, for a 3-element problem; the float code must agree to
// 1e-6 relative), every validation error naming its flag, and bitwise determinism.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/optim.h"

namespace {

using Catch::Matchers::WithinRel;
using ringtrain::LrSchedule;
using ringtrain::OptimizerConfig;

constexpr double kRel = 1e-6;

// The problem every hand-worked optimizer case uses: three weights, three steps.
constexpr std::array<float, 3> kW0 = {1.0f, -2.0f, 0.5f};
constexpr std::array<std::array<float, 3>, 3> kGrads = {{
    {0.1f, 0.2f, -0.3f},
    {0.4f, -0.1f, 0.2f},
    {-0.2f, 0.3f, 0.1f},
}};

void require_close(std::span<const float> actual, const std::array<double, 3>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("element " << i);
    CHECK_THAT(static_cast<double>(actual[i]), WithinRel(expected[i], kRel));
  }
}

// Runs the three steps of the shared problem at learning rate 0.1, checking the weights after
// each step against expected[step].
void run_hand_worked(ringtrain::Optimizer& opt,
                     const std::array<std::array<double, 3>, 3>& expected) {
  std::vector<float> w(kW0.begin(), kW0.end());
  for (size_t step = 0; step < kGrads.size(); ++step) {
    INFO("after step " << step + 1);
    opt.step(w, kGrads[step], 0.1f);
    require_close(w, expected[step]);
  }
  CHECK(opt.steps_taken() == 3);
}

}  // namespace

TEST_CASE("plain SGD (momentum 0, weight decay 0) is exactly w - lr * g", "[optim]") {
  auto opt = ringtrain::make_optimizer(OptimizerConfig{}, 3);
  CHECK(opt->name() == "sgd");
  CHECK(opt->state().empty());
  // Dyadic values: lr * g and w - lr * g are exact in float, with or without a fused
  // multiply-add, so == is the right comparison.
  std::vector<float> w = {1.0f, -0.5f, 3.0f};
  const std::vector<float> g = {1.5f, -2.0f, 0.125f};
  opt->step(w, g, 0.25f);
  CHECK(w == std::vector<float>{0.625f, 0.0f, 2.96875f});
  opt->step(w, g, 0.5f);
  CHECK(w == std::vector<float>{-0.125f, 1.0f, 2.90625f});
  CHECK(opt->steps_taken() == 2);
}

TEST_CASE("SGD with momentum and weight decay matches hand-worked steps", "[optim]") {
  // lr 0.1, momentum 0.9, weight decay 0.01. Element 0:
  //   step 1: g = 0.1 + 0.01 * 1 = 0.11;        v = 0.11;                  w = 1 - 0.011 = 0.989
  //   step 2: g = 0.4 + 0.01 * 0.989 = 0.40989;  v = 0.099 + 0.40989 = 0.50889;
  //           w = 0.989 - 0.050889 = 0.938111
  OptimizerConfig config;
  config.momentum = 0.9f;
  config.weight_decay = 0.01f;
  auto opt = ringtrain::make_optimizer(config, 3);
  run_hand_worked(*opt, {{
                            {0.989, -2.018, 0.5295},
                            {0.938111, -2.022182, 0.5355205},
                            {0.911372789, -2.05392362, 0.530403429},
                        }});
  const auto state = opt->state();
  REQUIRE(state.size() == 1);
  require_close(state[0], {0.26738211, 0.31741618, 0.051170705});
}

TEST_CASE("SGD with Nesterov momentum matches hand-worked steps", "[optim]") {
  // lr 0.1, momentum 0.9, weight decay 0.01. Element 0, step 1: g = 0.11, v = 0.11,
  // update g + 0.9 * v = 0.209, w = 1 - 0.0209 = 0.9791.
  OptimizerConfig config;
  config.momentum = 0.9f;
  config.weight_decay = 0.01f;
  config.nesterov = true;
  auto opt = ringtrain::make_optimizer(config, 3);
  run_hand_worked(*opt, {{
                            {0.9791, -2.0342, 0.55605},
                            {0.89232971, -2.02591502, 0.540888505},
                            {0.887422213, -2.08244008, 0.525715916},
                        }});
  const auto state = opt->state();
  REQUIRE(state.size() == 1);
  require_close(state[0], {0.266835197, 0.31723305, 0.0514633351});
}

TEST_CASE("Adam with weight decay and bias correction matches hand-worked steps", "[optim]") {
  // lr 0.1, betas 0.9 / 0.999, eps 1e-8, weight decay 0.05. Element 0, step 1:
  //   g = 0.1 + 0.05 * 1 = 0.15; m = 0.1 * 0.15 = 0.015; v = 0.001 * 0.0225 = 2.25e-5;
  //   mhat = 0.015 / 0.1 = 0.15; vhat = 2.25e-5 / 0.001 = 0.0225; sqrt(vhat) = 0.15;
  //   w = 1 - 0.1 * 0.15 / (0.15 + 1e-8) = 0.90000000667
  // (bias correction makes the first step lr * sign(g), the textbook check). The numbers
  // below are the same formulas in double, but with the constants the config really holds:
  // 0.999f is 0.99900001287..., so 1 - beta2 is 0.000999987, 1.3e-5 (relative) below 0.001, which
  // shows in v (w hardly moves: the bias correction 1 - beta2^t carries the same factor).
  OptimizerConfig config;
  config.kind = "adam";
  config.weight_decay = 0.05f;
  auto opt = ringtrain::make_optimizer(config, 3);
  CHECK(opt->name() == "adam");
  run_hand_worked(*opt, {{
                            {0.900000005, -2.09999999, 0.599999998},
                            {0.808087622, -2.06247796, 0.603633495},
                            {0.761387461, -2.08228186, 0.58445409},
                        }});
  const auto state = opt->state();
  REQUIRE(state.size() == 2);
  require_close(state[0], {0.0362404456, 0.0093376134, 0.0114431704});        // m
  require_close(state[1], {0.000245749606, 9.07220228e-05, 0.000145266335});  // v
}

TEST_CASE("optimizers are bitwise deterministic", "[optim]") {
  // 1027 elements: the vectorised body and the scalar tail of every loop both run.
  constexpr size_t n = 1027;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> w0(n);
  for (float& x : w0) x = dist(rng);
  std::vector<std::vector<float>> grads(5, std::vector<float>(n));
  for (auto& g : grads)
    for (float& x : g) x = dist(rng);

  OptimizerConfig sgd;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 1e-4f;
  OptimizerConfig nesterov = sgd;
  nesterov.nesterov = true;
  OptimizerConfig adam;
  adam.kind = "adam";
  adam.weight_decay = 1e-4f;
  for (const OptimizerConfig& config : {OptimizerConfig{}, sgd, nesterov, adam}) {
    INFO(config.kind << " momentum " << config.momentum << " nesterov " << config.nesterov);
    auto a = ringtrain::make_optimizer(config, static_cast<int64_t>(n));
    auto b = ringtrain::make_optimizer(config, static_cast<int64_t>(n));
    std::vector<float> wa = w0;
    std::vector<float> wb = w0;
    for (const auto& g : grads) {
      a->step(wa, g, 0.01f);
      b->step(wb, g, 0.01f);
    }
    CHECK(std::memcmp(wa.data(), wb.data(), n * sizeof(float)) == 0);
    CHECK(wa != w0);
    const auto sa = a->state();
    const auto sb = b->state();
    REQUIRE(sa.size() == sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      REQUIRE(sa[i].size() == n);
      CHECK(std::memcmp(sa[i].data(), sb[i].data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("optimizer settings are validated, naming the flag", "[optim]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto make = [](const OptimizerConfig& config) {
    return ringtrain::make_optimizer(config, 3);
  };
  OptimizerConfig c;

  c = {};
  c.kind = "rmsprop";
  REQUIRE_THROWS_AS(make(c), ringtrain::Error);
  REQUIRE_THROWS_WITH(make(c), Catch::Contains("--optimizer") && Catch::Contains("sgd") &&
                                   Catch::Contains("adam") && Catch::Contains("rmsprop"));
  for (float momentum : {-0.1f, 1.0f, nan}) {
    c = {};
    c.momentum = momentum;
    REQUIRE_THROWS_WITH(make(c), Catch::Contains("--momentum"));
  }
  for (float weight_decay : {-1e-4f, nan, std::numeric_limits<float>::infinity()}) {
    c = {};
    c.weight_decay = weight_decay;
    REQUIRE_THROWS_WITH(make(c), Catch::Contains("--weight-decay"));
  }
  for (float beta : {-0.1f, 1.0f, nan}) {
    c = {};
    c.kind = "adam";
    c.beta1 = beta;
    REQUIRE_THROWS_WITH(make(c), Catch::Contains("--adam-beta1"));
    c.beta1 = 0.9f;
    c.beta2 = beta;
    REQUIRE_THROWS_WITH(make(c), Catch::Contains("--adam-beta2"));
  }
  for (float epsilon : {0.0f, -1e-8f, nan}) {
    c = {};
    c.kind = "adam";
    c.epsilon = epsilon;
    REQUIRE_THROWS_WITH(make(c), Catch::Contains("--adam-epsilon"));
  }
  c = {};
  c.nesterov = true;  // with momentum 0
  REQUIRE_THROWS_WITH(make(c), Catch::Contains("--nesterov") && Catch::Contains("--momentum"));
  c.kind = "adam";
  c.momentum = 0.9f;
  REQUIRE_THROWS_WITH(make(c), Catch::Contains("--nesterov"));
  REQUIRE_THROWS_AS(ringtrain::make_optimizer(OptimizerConfig{}, -1), ringtrain::Error);

  // The edges that are allowed.
  c = {};
  c.momentum = 0.0f;
  c.weight_decay = 0.0f;
  REQUIRE_NOTHROW(make(c));
  c.kind = "adam";
  c.beta1 = 0.0f;
  c.beta2 = 0.0f;
  REQUIRE_NOTHROW(make(c));
  REQUIRE_NOTHROW(ringtrain::make_optimizer(OptimizerConfig{}, 0));
}

TEST_CASE("optimizer step rejects buffers of the wrong length and a bad rate", "[optim]") {
  for (const char* kind : {"sgd", "adam"}) {
    INFO(kind);
    OptimizerConfig config;
    config.kind = kind;
    auto opt = ringtrain::make_optimizer(config, 3);
    std::vector<float> w(3, 1.0f);
    std::vector<float> short_w(2, 1.0f);
    const std::vector<float> g(3, 0.5f);
    const std::vector<float> long_g(4, 0.5f);
    REQUIRE_THROWS_WITH(opt->step(short_w, g, 0.1f), Catch::Contains("2 parameters"));
    REQUIRE_THROWS_WITH(opt->step(w, long_g, 0.1f), Catch::Contains("4 gradients"));
    REQUIRE_THROWS_WITH(opt->step(w, g, -0.1f), Catch::Contains("learning rate"));
    REQUIRE_THROWS_WITH(opt->step(w, g, std::numeric_limits<float>::quiet_NaN()),
                        Catch::Contains("learning rate"));
    CHECK(opt->steps_taken() == 0);
    CHECK(w == std::vector<float>(3, 1.0f));
  }
}

TEST_CASE("constant learning rate", "[optim]") {
  LrSchedule s;
  s.base_lr = 0.05f;
  CHECK(ringtrain::learning_rate(s, 0) == 0.05f);
  CHECK(ringtrain::learning_rate(s, 123456) == 0.05f);
}

TEST_CASE("exponential learning rate, smooth and staircase", "[optim]") {
  // 0.01 * 0.99 ^ (step / 468.75), the defaults (468.75 = 60000 / 128: one MNIST epoch).
  LrSchedule s;
  s.kind = "exponential";
  s.base_lr = 0.01f;
  REQUIRE(s.decay_steps == 468.75);
  struct Point {
    int64_t step;
    double smooth;     // 0.99 ^ (step / 468.75)
    double staircase;  // 0.99 ^ floor(step / 468.75)
  };
  for (const Point& p :
       {Point{0, 0.01, 0.01}, Point{468, 0.0099001592, 0.01}, Point{469, 0.00989994693, 0.0099},
        Point{1000, 0.00978787502, 0.009801}, Point{4687, 0.0090439177, 0.00913517247}}) {
    INFO("step " << p.step);
    s.staircase = false;
    CHECK_THAT(static_cast<double>(ringtrain::learning_rate(s, p.step)), WithinRel(p.smooth, kRel));
    s.staircase = true;
    CHECK_THAT(static_cast<double>(ringtrain::learning_rate(s, p.step)),
               WithinRel(p.staircase, kRel));
  }
}

TEST_CASE("linear-warmup learning rate", "[optim]") {
  // target = 0.1 * 1024 / 256 = 0.4, reached at step 10; 0.1 + 0.3 * step / 10 before.
  LrSchedule s;
  s.kind = "linear-warmup";
  s.base_lr = 0.1f;
  s.global_batch = 1024;
  s.reference_batch = 256;
  s.warmup_steps = 10;
  const auto lr = [&s](int64_t step) {
    return static_cast<double>(ringtrain::learning_rate(s, step));
  };
  CHECK_THAT(lr(0), WithinRel(0.1, kRel));
  CHECK_THAT(lr(1), WithinRel(0.13, kRel));
  CHECK_THAT(lr(5), WithinRel(0.25, kRel));
  CHECK_THAT(lr(9), WithinRel(0.37, kRel));
  CHECK_THAT(lr(10), WithinRel(0.4, kRel));
  CHECK_THAT(lr(11), WithinRel(0.4, kRel));
  CHECK_THAT(lr(1000000), WithinRel(0.4, kRel));
  s.warmup_steps = 0;  // the target from the first step
  CHECK_THAT(lr(0), WithinRel(0.4, kRel));
}

TEST_CASE("learning-rate schedules are validated, naming the flag", "[optim]") {
  LrSchedule s;
  s.kind = "cosine";
  REQUIRE_THROWS_AS(ringtrain::validate(s), ringtrain::Error);
  REQUIRE_THROWS_WITH(ringtrain::validate(s),
                      Catch::Contains("--lr-schedule") && Catch::Contains("constant") &&
                          Catch::Contains("exponential") && Catch::Contains("linear-warmup"));
  // learning_rate() validates too, so a hand-built schedule cannot yield a silent NaN.
  REQUIRE_THROWS_WITH(ringtrain::learning_rate(s, 0), Catch::Contains("--lr-schedule"));

  for (float base_lr : {-0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    s = {};
    s.base_lr = base_lr;
    REQUIRE_THROWS_WITH(ringtrain::validate(s), Catch::Contains("--lr must"));
  }

  s = {};
  s.kind = "exponential";
  REQUIRE_NOTHROW(ringtrain::validate(s));
  s.decay_steps = 0.0;
  REQUIRE_THROWS_WITH(ringtrain::validate(s), Catch::Contains("--lr-decay-steps"));
  for (float rate : {0.0f, 1.5f, -0.5f}) {
    s = {};
    s.kind = "exponential";
    s.decay_rate = rate;
    REQUIRE_THROWS_WITH(ringtrain::validate(s), Catch::Contains("--lr-decay-rate"));
  }
  s.decay_rate = 1.0f;  // no decay at all is allowed
  REQUIRE_NOTHROW(ringtrain::validate(s));

  LrSchedule warm;
  warm.kind = "linear-warmup";
  warm.global_batch = 1024;
  warm.reference_batch = 256;
  warm.warmup_steps = 10;
  REQUIRE_NOTHROW(ringtrain::validate(warm));
  s = warm;
  s.warmup_steps = -1;
  REQUIRE_THROWS_WITH(ringtrain::validate(s), Catch::Contains("--warmup-steps"));
  s = warm;
  s.reference_batch = 0;
  REQUIRE_THROWS_WITH(ringtrain::validate(s), Catch::Contains("--reference-batch"));
  s = warm;
  s.global_batch = 0;
  REQUIRE_THROWS_WITH(ringtrain::validate(s), Catch::Contains("global batch"));

  REQUIRE_THROWS_WITH(ringtrain::learning_rate(warm, -1), Catch::Contains("step"));
  // A constant schedule ignores the warmup fields, so their zero defaults are fine.
  REQUIRE_NOTHROW(ringtrain::validate(LrSchedule{}));
}

TEST_CASE("weight EMA follows TensorFlow's num_updates schedule", "[optim]") {
  std::vector<float> p = {1.0f, 2.0f, 3.0f};
  ringtrain::WeightEma ema(0.99f, p);
  // The shadow starts as a copy, not a view.
  CHECK(std::vector<float>(ema.shadow().begin(), ema.shadow().end()) == p);
  p[0] = 100.0f;
  CHECK(ema.shadow()[0] == 1.0f);
  CHECK(ema.updates() == 0);

  // Update 1 (t = 0): decay_t = min(0.99, 1 / 10) = 0.1;
  //   shadow = 0.1 * {1, 2, 3} + 0.9 * {2, 4, -1} = {1.9, 3.8, -0.6}
  ema.update(std::vector<float>{2.0f, 4.0f, -1.0f});
  require_close(ema.shadow(), {1.9, 3.8, -0.6});
  // Update 2 (t = 1): decay_t = min(0.99, 2 / 11) = 0.181818...;
  //   shadow = (2/11) * {1.9, 3.8, -0.6} + (9/11) * {0, 1, 1}
  //          = {3.8/11, (7.6 + 9)/11, (-1.2 + 9)/11}
  ema.update(std::vector<float>{0.0f, 1.0f, 1.0f});
  require_close(ema.shadow(), {0.345454545, 1.50909091, 0.709090909});
  CHECK(ema.updates() == 2);
}

TEST_CASE("weight EMA decay is capped by the configured decay", "[optim]") {
  // decay 0.5: the first update uses min(0.5, 0.1) = 0.1; from t = 9 on, (1 + t) / (10 + t)
  // = 10 / 19 > 0.5, so the configured 0.5 applies.
  std::vector<float> one = {1.0f};
  const std::vector<float> zero = {0.0f};
  ringtrain::WeightEma first(0.5f, one);
  first.update(zero);
  CHECK_THAT(static_cast<double>(first.shadow()[0]), WithinRel(0.1, kRel));

  ringtrain::WeightEma later(0.5f, one);
  for (int i = 0; i < 9; ++i) later.update(one);
  REQUIRE(later.updates() == 9);
  later.update(zero);
  CHECK_THAT(static_cast<double>(later.shadow()[0]), WithinRel(0.5, kRel));
}

TEST_CASE("weight EMA checks its decay and the buffer length", "[optim]") {
  const std::vector<float> p = {1.0f, 2.0f};
  for (float decay : {1.0f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    REQUIRE_THROWS_WITH(ringtrain::WeightEma(decay, p), Catch::Contains("--ema-decay"));
  }
  REQUIRE_NOTHROW(ringtrain::WeightEma(0.0f, p));
  ringtrain::WeightEma ema(0.9f, p);
  REQUIRE_THROWS_WITH(ema.update(std::vector<float>{1.0f}), Catch::Contains("EMA update"));
  CHECK(ema.updates() == 0);
}
