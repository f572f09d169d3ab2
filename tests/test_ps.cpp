// Tests for ps.h, the parameter server without a transport: the shard plan (contiguous ranges
// cut at tensor boundaries, greedy to the nearest boundary, refusals), and ShardServer in both
// modes -- sync (the average of the first R gradients for the current version, summed in worker
// order so that arrival order cannot change a bit; late gradients dropped and counted) and
// async (applied on arrival within the staleness bound, rejected beyond it) -- plus start()
// and the claim the whole design rests on: sharding an elementwise optimizer changes no
// arithmetic, so the shards' concatenation equals the unsharded update bit for bit.
//
// Expected values come from an independent source wherever one exists: numbers worked out by
// hand (dyadic, so that float arithmetic is exact whatever the compiler fuses) or a separate
// optimizer from make_optimizer fed the average computed here. Comparing against a reference
// optimizer rather than re-typing `w - lr * g` keeps the comparison bitwise even when
// -march=native contracts the update into a fused multiply-add in one place and not another.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/exact_sum.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/ps.h"

namespace {

using Catch::Matchers::Contains;
using ringtrain::from_fixed_point;
using ringtrain::GradRange;
using ringtrain::kStalenessBins;
using ringtrain::make_optimizer;
using ringtrain::OptimizerConfig;
using ringtrain::plan_shards;
using ringtrain::PsMode;
using ringtrain::ShardRange;
using ringtrain::ShardServer;
using ringtrain::ShardServerConfig;
using ringtrain::split_segments;

// ---- helpers ----

// The first index at which a and b differ in their bits, or -1 when they are identical (same
// length, same bytes). memcmp rather than ==, so that -0.0f vs 0.0f or a NaN would count.
int64_t first_difference(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

std::vector<float> to_vector(std::span<const float> values) {
  return {values.begin(), values.end()};
}

// n floats uniform in [lo, hi) from `seed`: the same numbers on every run.
std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

OptimizerConfig sgd(float momentum = 0.0f) {
  OptimizerConfig config;
  config.kind = "sgd";
  config.momentum = momentum;
  return config;
}

// A server over [0, n) with a fresh optimizer, started at `start` (no state, step 0,
// version 0): the common set-up of the ShardServer cases.
std::unique_ptr<ShardServer> make_server(const ShardServerConfig& config,
                                         const std::vector<float>& start,
                                         const OptimizerConfig& optimizer = sgd()) {
  const auto n = static_cast<int64_t>(start.size());
  auto server =
      std::make_unique<ShardServer>(config, ShardRange{0, n}, make_optimizer(optimizer, n));
  server->start(start, {}, 0, 0);
  return server;
}

// What a transport does for one push: receive the gradient into the buffer the server names,
// then hand it over.
// A push's outcome, its answer list copied: the server's own view of it lasts only until the
// next push, and the tests keep outcomes across pushes.
struct Outcome {
  bool accepted = false;
  bool applied = false;
  int64_t staleness = 0;
  std::vector<int> answer;
};

Outcome push(ShardServer& server, int worker, int64_t version, std::span<const float> gradient,
             float lr) {
  const std::span<float> buffer = server.gradient_buffer(worker, version);
  REQUIRE(buffer.size() == gradient.size());
  std::copy(gradient.begin(), gradient.end(), buffer.begin());
  const ShardServer::PushOutcome outcome = server.push(worker, version, lr);
  return {outcome.accepted, outcome.applied, outcome.staleness,
          std::vector<int>(outcome.answer.begin(), outcome.answer.end())};
}

// The answer list is a set of workers; its order is not part of the contract.
std::vector<int> sorted(std::vector<int> workers) {
  std::sort(workers.begin(), workers.end());
  return workers;
}

// Prefix sums of the tensor sizes: the only places a shard may begin or end.
std::vector<int64_t> boundaries(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> cuts = {0};
  for (const int64_t size : sizes) cuts.push_back(cuts.back() + size);
  return cuts;
}

// The plan's invariants, whatever the sizes: one range per server, contiguous from 0 to the
// total with no gap or overlap, every range non-empty and cut at tensor boundaries.
void check_plan_invariants(const std::vector<ShardRange>& plan, const std::vector<int64_t>& sizes,
                           int servers) {
  const std::vector<int64_t> cuts = boundaries(sizes);
  REQUIRE(plan.size() == static_cast<size_t>(servers));
  CHECK(plan.front().begin == 0);
  CHECK(plan.back().end == cuts.back());
  for (size_t s = 0; s < plan.size(); ++s) {
    INFO("shard " << s << " = [" << plan[s].begin << ", " << plan[s].end << ")");
    CHECK(plan[s].size() > 0);
    if (s > 0) CHECK(plan[s].begin == plan[s - 1].end);
    CHECK(std::binary_search(cuts.begin(), cuts.end(), plan[s].begin));
    CHECK(std::binary_search(cuts.begin(), cuts.end(), plan[s].end));
  }
}

// Writes a plan as [b, e) pairs, so that a failed comparison shows both plans.
std::vector<std::pair<int64_t, int64_t>> as_pairs(const std::vector<ShardRange>& plan) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const ShardRange& r : plan) pairs.emplace_back(r.begin, r.end);
  return pairs;
}

std::vector<ShardRange> plan(const std::vector<int64_t>& sizes, int servers) {
  return plan_shards(std::span<const int64_t>(sizes), servers);
}

}  // namespace

// ---- plan_shards ----

TEST_CASE("plan_shards: the MNIST MLP over 1, 2 and 3 servers, worked out by hand", "[ps]") {
  // The flat buffer is in backward order (model.h): the last layer's tensors come first,
  // weight before bias. dense(500->10): 5000 + 10, dense(500->500): 250000 + 500,
  // dense(784->500): 392000 + 500; 648010 in all.
  auto model = ringtrain::make_model({.name = "mlp"});
  const std::vector<int64_t> sizes = ringtrain::tensor_sizes(*model);
  REQUIRE(sizes == std::vector<int64_t>{5000, 10, 250000, 500, 392000, 500});
  REQUIRE(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) == model->num_params());

  // 1 server holds everything.
  CHECK(as_pairs(plan(sizes, 1)) == std::vector<std::pair<int64_t, int64_t>>{{0, 648010}});
  // 2 servers, target 324005: the boundaries 5000, 5010, 255010, 255510, 647510 are 319005,
  // 318995, 68995, 68495 and 323505 away, so the cut is at 255510.
  CHECK(as_pairs(plan(sizes, 2)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 255510}, {255510, 648010}});
  // 3 servers, targets 216003.3 and 432006.7. Shard 0 may take tensors 0..3 (two must stay):
  // 255010 is nearest (39006.7 away; 255510 is 39506.7). Shard 1 must take the 500 (its
  // first tensor) and stops there: 255510 is 176496.7 from its target, 647510 is 215503.3.
  // Nearest-boundary greed thus gives the middle server a single bias.
  CHECK(as_pairs(plan(sizes, 3)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 255010}, {255010, 255510}, {255510, 648010}});
  for (int servers = 1; servers <= 6; ++servers) {
    INFO(servers << " servers");
    check_plan_invariants(plan(sizes, servers), sizes, servers);
  }
}

TEST_CASE("plan_shards: the MLP's tensors in forward order, worked out by hand", "[ps]") {
  // The same sizes the other way round (the first layer first), a second hand-checked case
  // where the dominant tensor comes first and the cut lands just after it.
  const std::vector<int64_t> sizes = {392000, 500, 250000, 500, 5000, 10};
  CHECK(as_pairs(plan(sizes, 1)) == std::vector<std::pair<int64_t, int64_t>>{{0, 648010}});
  // Target 324005: 392000 (67995 away) is nearer than 392500 (68495).
  CHECK(as_pairs(plan(sizes, 2)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 392000}, {392000, 648010}});
  // Targets 216003.3, 432006.7: shard 0 stops at 392000; shard 1 takes the 500 (392500, 39506.7
  // away) and not the 250000 (642500, 210493.3 away).
  CHECK(as_pairs(plan(sizes, 3)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 392000}, {392000, 392500}, {392500, 648010}});
}

TEST_CASE("plan_shards: greedy cuts at the boundary nearest each target", "[ps]") {
  // sizes 5 6 4 3 8 4 (total 30); boundaries 5 11 15 18 26 30.
  const std::vector<int64_t> sizes = {5, 6, 4, 3, 8, 4};
  SECTION("2 servers: target 15 is itself a boundary") {
    CHECK(as_pairs(plan(sizes, 2)) == std::vector<std::pair<int64_t, int64_t>>{{0, 15}, {15, 30}});
  }
  SECTION("3 servers: the cuts overshoot or undershoot, whichever is nearer") {
    // Shard 0, target 10: 5 (5 away), 11 (1 away), 15 (5 away): ends at 11, past the target.
    // Shard 1, target 20: 15 (5), 18 (2), 26 (6): ends at 18, short of the target.
    CHECK(as_pairs(plan(sizes, 3)) ==
          std::vector<std::pair<int64_t, int64_t>>{{0, 11}, {11, 18}, {18, 30}});
  }
  SECTION("as many servers as tensors: one tensor each") {
    CHECK(as_pairs(plan(sizes, 6)) == std::vector<std::pair<int64_t, int64_t>>{
                                          {0, 5}, {5, 11}, {11, 15}, {15, 18}, {18, 26}, {26, 30}});
  }
  // Stopping short of the target: 6 (4 away), 9 (1 away), 12 (2 away) -> ends at 9.
  CHECK(as_pairs(plan({6, 3, 3, 8}, 2)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 9}, {9, 20}});
  // Going past it: 6 (4 away), 11 (1 away) -> ends at 11.
  CHECK(as_pairs(plan({6, 5, 9}, 2)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 11}, {11, 20}});
}

TEST_CASE("plan_shards: every server gets a tensor even when one tensor dominates", "[ps]") {
  // The first tensor alone overshoots both targets (334 and 668); the greedy walk must still
  // stop there and leave one tensor for each later server.
  CHECK(as_pairs(plan({1000, 1, 1}, 3)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 1000}, {1000, 1001}, {1001, 1002}});
  // The dominant tensor last: the greedy walk must not hand it (and everything) to shard 0.
  CHECK(as_pairs(plan({1, 1, 1000}, 3)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {2, 1002}});
  // In the middle: shard 0 must leave two tensors, so it holds the first alone; shard 1 must
  // leave one, so it holds the 1000 alone.
  CHECK(as_pairs(plan({1, 1000, 1}, 3)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 1001}, {1001, 1002}});
  for (const auto& sizes : std::vector<std::vector<int64_t>>{
           {1000, 1, 1}, {1, 1, 1000}, {1, 1000, 1}, {1, 1, 1, 1, 100000}, {7}}) {
    for (int servers = 1; servers <= static_cast<int>(sizes.size()); ++servers) {
      INFO(sizes.size() << " tensors over " << servers << " servers");
      check_plan_invariants(plan(sizes, servers), sizes, servers);
    }
  }
}

TEST_CASE("plan_shards: random sizes always give a valid plan", "[ps]") {
  // The invariants over many shapes, including servers == tensors (every shard one tensor)
  // and sizes spanning five orders of magnitude.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> count(1, 12);
  std::uniform_int_distribution<int> exponent(0, 5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> sizes(static_cast<size_t>(count(rng)));
    for (int64_t& size : sizes) {
      int64_t scale = 1;
      for (int e = exponent(rng); e > 0; --e) scale *= 10;
      size = scale + static_cast<int64_t>(rng() % 97);
    }
    const int servers = 1 + static_cast<int>(rng() % sizes.size());
    INFO("trial " << trial << ": " << sizes.size() << " tensors over " << servers << " servers");
    check_plan_invariants(plan(sizes, servers), sizes, servers);
  }
}

TEST_CASE("plan_shards: more servers than tensors, or none, is refused naming --num-ps", "[ps]") {
  const std::vector<int64_t> mlp = {5000, 10, 250000, 500, 392000, 500};
  // Every server must hold a tensor; the message should tell the user the largest that works.
  REQUIRE_THROWS_AS(plan(mlp, 7), ringtrain::Error);
  REQUIRE_THROWS_WITH(plan(mlp, 7), Contains("--num-ps") && Contains("6"));
  REQUIRE_THROWS_WITH(plan({1, 2}, 3), Contains("--num-ps"));
  REQUIRE_THROWS_WITH(plan(mlp, 0), Contains("--num-ps"));
  REQUIRE_THROWS_WITH(plan(mlp, -1), Contains("--num-ps"));
  REQUIRE_THROWS_WITH(plan({}, 1), Contains("--num-ps"));
  // The largest allowed count is accepted.
  REQUIRE_NOTHROW(plan(mlp, 6));
}

TEST_CASE("plan_shards: the contiguous plan balances better than round-robin by tensor", "[ps]") {
  // Round-robin (tensor i to server i % servers) ignores sizes; the plan's point is to weigh
  // them. Compare the largest server's load, which bounds a step's time.
  const auto round_robin_max = [](const std::vector<int64_t>& sizes, int servers) {
    std::vector<int64_t> load(static_cast<size_t>(servers), 0);
    for (size_t i = 0; i < sizes.size(); ++i) load[i % static_cast<size_t>(servers)] += sizes[i];
    return *std::max_element(load.begin(), load.end());
  };
  const auto plan_max = [](const std::vector<int64_t>& sizes, int servers) {
    int64_t largest = 0;
    for (const ShardRange& r : plan(sizes, servers)) largest = std::max(largest, r.size());
    return largest;
  };
  // The MLP over 2 servers: round-robin puts all three weight matrices on server 0 (647000);
  // the plan's largest shard is 392500.
  const std::vector<int64_t> mlp = {5000, 10, 250000, 500, 392000, 500};
  CHECK(round_robin_max(mlp, 2) == 647000);
  CHECK(plan_max(mlp, 2) == 392500);
  // The hand example over 3 servers: round-robin loads 8, 14, 8; the plan 11, 7, 12.
  const std::vector<int64_t> small = {5, 6, 4, 3, 8, 4};
  CHECK(round_robin_max(small, 3) == 14);
  CHECK(plan_max(small, 3) == 12);
}

// ---- ShardServer, sync mode ----

TEST_CASE("ShardServer sync, R = workers = 3: hand-worked average, applied on the third push",
          "[ps]") {
  // Dyadic numbers: the sums, the division by 3 of a multiple of 3, lr * mean and the
  // subtraction are all exact in float, so the result can be written down.
  const std::vector<float> start = {1.0f, -2.0f, 0.5f, 8.0f};
  const std::vector<std::vector<float>> g = {
      {1.0f, 3.0f, -0.75f, 0.0f},
      {2.0f, -6.0f, 0.25f, 1.5f},
      {3.0f, 0.0f, -0.25f, 1.5f},
  };  // mean: {2, -1, -0.25, 1}
  auto server =
      make_server({.mode = PsMode::kSync, .workers = 3, .replicas_to_aggregate = 3}, start);
  for (int w = 0; w < 2; ++w) {
    const auto outcome = push(*server, w, 0, g[static_cast<size_t>(w)], 0.25f);
    CHECK(outcome.accepted);
    CHECK_FALSE(outcome.applied);
    CHECK(outcome.answer.empty());  // nobody hears back before the aggregate is complete
    CHECK(server->version() == 0);
    CHECK(to_vector(server->params()) == start);
  }
  const auto outcome = push(*server, 2, 0, g[2], 0.25f);
  CHECK(outcome.accepted);
  CHECK(outcome.applied);
  CHECK(outcome.staleness == 0);
  CHECK(sorted(outcome.answer) == std::vector<int>{0, 1, 2});
  CHECK(server->version() == 1);
  // start - 0.25 * mean
  CHECK(to_vector(server->params()) == std::vector<float>{0.5f, -1.75f, 0.5625f, 7.75f});
  CHECK(server->optimizer().steps_taken() == 1);
  CHECK(server->stats().updates == 1);
  CHECK(server->stats().gradients == 3);
  CHECK(server->stats().aggregated == 3);
  CHECK(server->stats().dropped_stale == 0);
  CHECK(server->applied_per_worker() == std::vector<int64_t>{1, 1, 1});
}

TEST_CASE("ShardServer sync: the average is summed in worker order, whatever the arrival order",
          "[ps]") {
  // Random gradients of mixed magnitude, so that float addition's order shows in the bits.
  constexpr size_t kN = 257;  // not a multiple of any vector width
  const float lr = 0.1f;
  const std::vector<float> start = random_floats(kN, 1);
  const std::vector<std::vector<float>> g = {random_floats(kN, 2, -1e3f, 1e3f),
                                             random_floats(kN, 3, -1e-2f, 1e-2f),
                                             random_floats(kN, 4, -10.0f, 10.0f)};
  // The specified average: ((g0 + g1) + g2) / 3 in float.
  std::vector<float> mean(kN);
  for (size_t j = 0; j < kN; ++j) mean[j] = ((g[0][j] + g[1][j]) + g[2][j]) / 3.0f;
  // The test can tell orders apart only if another order gives other bits somewhere.
  size_t order_sensitive = 0;
  for (size_t j = 0; j < kN; ++j)
    if (((g[2][j] + g[0][j]) + g[1][j]) / 3.0f != mean[j]) ++order_sensitive;
  REQUIRE(order_sensitive > 0);
  // Dividing by 3 and multiplying by 1/3 differ somewhere too: the divisor is checked.
  size_t division_sensitive = 0;
  for (size_t j = 0; j < kN; ++j)
    if (((g[0][j] + g[1][j]) + g[2][j]) * (1.0f / 3.0f) != mean[j]) ++division_sensitive;
  REQUIRE(division_sensitive > 0);

  // The reference: plain SGD applied to that average by a separate optimizer.
  std::vector<float> expected = start;
  make_optimizer(sgd(), static_cast<int64_t>(kN))->step(expected, mean, lr);
  REQUIRE(first_difference(expected, start) != -1);  // the update moved something

  const ShardServerConfig config{.mode = PsMode::kSync, .workers = 3, .replicas_to_aggregate = 3};
  for (const std::vector<int>& order :
       {std::vector<int>{0, 1, 2}, std::vector<int>{2, 0, 1}, std::vector<int>{1, 2, 0}}) {
    INFO("arrival order " << order[0] << order[1] << order[2]);
    auto server = make_server(config, start);
    Outcome last;
    for (const int w : order) last = push(*server, w, 0, g[static_cast<size_t>(w)], lr);
    CHECK(last.applied);
    CHECK(sorted(last.answer) == std::vector<int>{0, 1, 2});
    CHECK(server->version() == 1);
    CHECK(first_difference(server->params(), expected) == -1);
  }
}

TEST_CASE("ShardServer sync, R = 2 of 3: backup workers, the late gradient dropped", "[ps]") {
  constexpr size_t kN = 33;
  const float lr = 0.05f;
  const std::vector<float> start = random_floats(kN, 10);
  const std::vector<std::vector<float>> g = {random_floats(kN, 11), random_floats(kN, 12),
                                             random_floats(kN, 13)};
  auto server =
      make_server({.mode = PsMode::kSync, .workers = 3, .replicas_to_aggregate = 2}, start);

  // Version 0: workers 2 and 1 arrive first; the update uses exactly their average.
  auto first = push(*server, 2, 0, g[2], lr);
  CHECK(first.accepted);
  CHECK_FALSE(first.applied);
  CHECK(first.answer.empty());
  auto second = push(*server, 1, 0, g[1], lr);
  CHECK(second.accepted);
  CHECK(second.applied);
  CHECK(sorted(second.answer) == std::vector<int>{1, 2});
  CHECK(server->version() == 1);
  std::vector<float> mean(kN);
  for (size_t j = 0; j < kN; ++j) mean[j] = (g[1][j] + g[2][j]) / 2.0f;
  std::vector<float> expected = start;
  make_optimizer(sgd(), static_cast<int64_t>(kN))->step(expected, mean, lr);
  CHECK(first_difference(server->params(), expected) == -1);

  // Worker 0's gradient for version 0 arrives after the update: dropped, answered at once
  // (with the current parameters, so that it can catch up), and the parameters untouched.
  // A huge gradient would show if it leaked into the parameters.
  const std::vector<float> poison(kN, 1e30f);
  auto late = push(*server, 0, 0, poison, lr);
  CHECK_FALSE(late.accepted);
  CHECK_FALSE(late.applied);
  CHECK(late.staleness == 1);
  CHECK(late.answer == std::vector<int>{0});
  CHECK(server->version() == 1);
  CHECK(first_difference(server->params(), expected) == -1);
  CHECK(server->stats().dropped_stale == 1);
  CHECK(server->stats().gradients == 3);
  CHECK(server->stats().aggregated == 2);
  CHECK(server->stats().updates == 1);
  CHECK(server->applied_per_worker() == std::vector<int64_t>{0, 1, 1});

  // Nor did the dropped gradient land in a slot of the next version: version 1 aggregates
  // workers 0 and 1 afresh, and worker 2 is the late one this time.
  push(*server, 0, 1, g[0], lr);
  auto update = push(*server, 1, 1, g[1], lr);
  CHECK(update.applied);
  CHECK(sorted(update.answer) == std::vector<int>{0, 1});
  for (size_t j = 0; j < kN; ++j) mean[j] = (g[0][j] + g[1][j]) / 2.0f;
  auto reference = make_optimizer(sgd(), static_cast<int64_t>(kN));
  reference->step(expected, mean, lr);
  CHECK(first_difference(server->params(), expected) == -1);
  auto late2 = push(*server, 2, 1, poison, lr);
  CHECK_FALSE(late2.accepted);
  CHECK(late2.answer == std::vector<int>{2});
  CHECK(first_difference(server->params(), expected) == -1);
  CHECK(server->version() == 2);
  CHECK(server->stats().dropped_stale == 2);
  CHECK(server->stats().aggregated == 4);
  CHECK(server->stats().updates == 2);
  CHECK(server->applied_per_worker() == std::vector<int64_t>{1, 2, 1});
}

TEST_CASE("ShardServer sync: a future version, a double push or an unknown worker throws", "[ps]") {
  const std::vector<float> start = {1.0f, 2.0f};
  const std::vector<float> grad = {0.5f, 0.5f};
  auto server =
      make_server({.mode = PsMode::kSync, .workers = 3, .replicas_to_aggregate = 3}, start);
  // A gradient computed on parameters the server has not produced yet: the worker and the
  // server disagree about the run.
  REQUIRE_THROWS_WITH(push(*server, 0, 1, grad, 0.1f),
                      Contains("version 1") && Contains("only at 0"));
  CHECK(server->version() == 0);
  CHECK(server->stats().gradients == 0);  // refused before it counted

  // The same worker twice for one version would count its gradient twice in the average.
  push(*server, 0, 0, grad, 0.1f);
  REQUIRE_THROWS_WITH(server->push(0, 0, 0.1f), Contains("worker 0 pushed twice"));
  CHECK(server->version() == 0);
  CHECK(to_vector(server->params()) == start);
  // The transport asks for the buffer first: refused there, before a second gradient could
  // overwrite the one held for this version.
  REQUIRE_THROWS_WITH(server->gradient_buffer(0, 0), Contains("worker 0 pushed twice"));
  CHECK(server->stats().gradients == 1);  // the refused duplicate is not counted

  REQUIRE_THROWS_WITH(server->gradient_buffer(3, 0), Contains("unknown worker 3"));
  REQUIRE_THROWS_WITH(server->gradient_buffer(-1, 0), Contains("unknown worker -1"));
  REQUIRE_THROWS_WITH(server->push(3, 0, 0.1f), Contains("unknown worker 3"));

  // The refusals left the held gradient and the server usable: workers 1 and 2 complete the
  // aggregate of {0, 1, 2}, and the mean is still 0.5 (not 2/3 * 0.5 or 4/3 * 0.5).
  push(*server, 1, 0, grad, 0.1f);
  const auto outcome = push(*server, 2, 0, grad, 0.5f);
  CHECK(outcome.applied);
  CHECK(server->version() == 1);
  CHECK(to_vector(server->params()) == std::vector<float>{0.75f, 1.75f});
  // After the update, the version the worker pushed for is in the past: no longer a double.
  push(*server, 0, 1, grad, 0.1f);
  CHECK(server->stats().aggregated == 3);
}

TEST_CASE("ShardServer: invalid configurations are refused naming the flag", "[ps]") {
  const auto make = [](const ShardServerConfig& config) {
    return ShardServer(config, ShardRange{0, 4}, make_optimizer(sgd(), 4));
  };
  REQUIRE_THROWS_WITH(make({.mode = PsMode::kSync, .workers = 3, .replicas_to_aggregate = 4}),
                      Contains("--replicas-to-aggregate"));
  REQUIRE_THROWS_WITH(make({.mode = PsMode::kSync, .workers = 3, .replicas_to_aggregate = 0}),
                      Contains("--replicas-to-aggregate"));
  REQUIRE_THROWS_WITH(make({.mode = PsMode::kAsync, .workers = 2, .max_staleness = -1}),
                      Contains("--max-staleness"));
  REQUIRE_THROWS_WITH(make({.mode = PsMode::kSync, .workers = 0}), Contains("worker"));
  REQUIRE_NOTHROW(make({.mode = PsMode::kAsync, .workers = 2, .max_staleness = 0}));
}

// ---- ShardServer, async mode ----

TEST_CASE("ShardServer async, S = 1: applied within the bound, rejected beyond it", "[ps]") {
  constexpr size_t kN = 19;
  const float lr = 0.125f;
  const std::vector<float> start = random_floats(kN, 20);
  const std::vector<std::vector<float>> g = {random_floats(kN, 21), random_floats(kN, 22)};
  auto server = make_server({.mode = PsMode::kAsync, .workers = 2, .max_staleness = 1}, start);
  auto reference = make_optimizer(sgd(), static_cast<int64_t>(kN));
  std::vector<float> expected = start;

  // Worker 0 at the current version: applied on arrival, answered alone.
  auto fresh = push(*server, 0, 0, g[0], lr);
  CHECK(fresh.accepted);
  CHECK(fresh.applied);
  CHECK(fresh.staleness == 0);
  CHECK(fresh.answer == std::vector<int>{0});
  CHECK(server->version() == 1);
  reference->step(expected, g[0], lr);
  CHECK(first_difference(server->params(), expected) == -1);

  // Worker 1 computed on version 0, now exactly S = 1 behind: still applied, as it is.
  auto stale = push(*server, 1, 0, g[1], lr);
  CHECK(stale.accepted);
  CHECK(stale.applied);
  CHECK(stale.staleness == 1);
  CHECK(stale.answer == std::vector<int>{1});
  CHECK(server->version() == 2);
  reference->step(expected, g[1], lr);
  CHECK(first_difference(server->params(), expected) == -1);

  // Worker 0 again on version 0: 2 behind, over the bound. Rejected, parameters untouched,
  // but still answered (the worker recomputes on the parameters the answer carries).
  const std::vector<float> poison(kN, 1e30f);
  auto rejected = push(*server, 0, 0, poison, lr);
  CHECK_FALSE(rejected.accepted);
  CHECK_FALSE(rejected.applied);
  CHECK(rejected.staleness == 2);
  CHECK(rejected.answer == std::vector<int>{0});
  CHECK(server->version() == 2);
  CHECK(first_difference(server->params(), expected) == -1);

  // Async has no "pushed twice" rule: the same worker may push again at the current version.
  push(*server, 0, 2, g[0], lr);
  reference->step(expected, g[0], lr);
  CHECK(first_difference(server->params(), expected) == -1);
  CHECK(server->version() == 3);

  const ringtrain::PsServerStats& stats = server->stats();
  CHECK(stats.updates == 3);
  CHECK(stats.gradients == 4);
  CHECK(stats.rejected_stale == 1);
  CHECK(stats.dropped_stale == 0);
  CHECK(stats.aggregated == 0);
  CHECK(stats.max_staleness == 1);  // the largest accepted, not the rejected 2
  CHECK(stats.staleness[0] == 2);
  CHECK(stats.staleness[1] == 1);
  CHECK(stats.staleness[2] == 0);  // rejected gradients are not in the histogram
  CHECK(server->applied_per_worker() == std::vector<int64_t>{2, 1});
  CHECK(ringtrain::describe_staleness(stats) == "0: 2, 1: 1 (max 1)");
  // A future version is as wrong in async mode as in sync mode.
  REQUIRE_THROWS_WITH(push(*server, 1, 4, g[1], lr), Contains("version 4"));
}

TEST_CASE("ShardServer async, S = 0: only gradients on the current parameters apply", "[ps]") {
  const std::vector<float> start = {4.0f, -4.0f};
  auto server = make_server({.mode = PsMode::kAsync, .workers = 2, .max_staleness = 0}, start);
  CHECK(push(*server, 0, 0, std::vector<float>{1.0f, 2.0f}, 0.5f).applied);
  CHECK(to_vector(server->params()) == std::vector<float>{3.5f, -5.0f});
  const auto late = push(*server, 1, 0, std::vector<float>{1.0f, 1.0f}, 0.5f);
  CHECK_FALSE(late.accepted);
  CHECK(late.answer == std::vector<int>{1});
  CHECK(to_vector(server->params()) == std::vector<float>{3.5f, -5.0f});
  CHECK(server->stats().rejected_stale == 1);
  CHECK(ringtrain::describe_staleness(server->stats()) == "0: 1 (max 0)");
}

TEST_CASE("describe_staleness: empty, gaps, and the open-ended last bin", "[ps]") {
  ringtrain::PsServerStats stats;
  // An empty histogram (sync mode, or async with every gradient rejected) says so, instead
  // of printing an empty bin 0.
  CHECK(ringtrain::describe_staleness(stats) == "none (max 0)");
  stats.staleness[0] = 120;
  stats.staleness[1] = 80;
  stats.staleness[3] = 3;  // bin 2 is empty but still listed, so the columns line up
  stats.max_staleness = 3;
  CHECK(ringtrain::describe_staleness(stats) == "0: 120, 1: 80, 2: 0, 3: 3 (max 3)");

  // A staleness beyond the last bin lands in it, marked "+", while max keeps the true value.
  const std::vector<float> start = {0.0f};
  auto server = make_server({.mode = PsMode::kAsync, .workers = 2, .max_staleness = 100}, start);
  for (int64_t v = 0; v < 70; ++v)
    REQUIRE(push(*server, 0, v, std::vector<float>{1.0f}, 0.0f).applied);
  const auto old = push(*server, 1, 0, std::vector<float>{1.0f}, 0.0f);
  CHECK(old.accepted);
  CHECK(old.staleness == 70);
  CHECK(server->stats().staleness[kStalenessBins - 1] == 1);
  CHECK(server->stats().max_staleness == 70);
  const std::string text = ringtrain::describe_staleness(server->stats());
  CHECK_THAT(text, Contains("0: 70, 1: 0") && Contains("63+: 1 (max 70)"));
}

// ---- start() ----

TEST_CASE("ShardServer start: restores parameters, momentum, step count and version", "[ps]") {
  constexpr size_t kN = 6;
  const std::vector<float> params = random_floats(kN, 30);
  const std::vector<float> velocity = random_floats(kN, 31);
  const std::vector<float> grad = random_floats(kN, 32);
  const float lr = 0.01f;
  ShardServer server({.mode = PsMode::kSync, .workers = 1, .replicas_to_aggregate = 1},
                     ShardRange{100, 100 + static_cast<int64_t>(kN)},
                     make_optimizer(sgd(0.9f), static_cast<int64_t>(kN)));
  REQUIRE(server.optimizer().state().size() == 1);  // momentum SGD has one buffer

  server.start(params, {velocity}, 7, 4);
  CHECK(to_vector(server.params()) == params);
  CHECK(to_vector(server.optimizer().state()[0]) == velocity);
  CHECK(server.optimizer().steps_taken() == 7);
  CHECK(server.version() == 4);

  // The next update continues from that state: the same as a momentum SGD given the same
  // velocity. (With the velocity left at zero the result would differ: checked below.)
  auto reference = make_optimizer(sgd(0.9f), static_cast<int64_t>(kN));
  std::copy(velocity.begin(), velocity.end(), reference->state()[0].begin());
  std::vector<float> expected = params;
  reference->step(expected, grad, lr);
  std::vector<float> without_velocity = params;
  make_optimizer(sgd(0.9f), static_cast<int64_t>(kN))->step(without_velocity, grad, lr);
  REQUIRE(first_difference(expected, without_velocity) != -1);

  // A gradient for a version before the start point is late, not applied.
  CHECK_FALSE(push(server, 0, 3, grad, lr).accepted);
  const auto outcome = push(server, 0, 4, grad, lr);
  CHECK(outcome.applied);
  CHECK(server.version() == 5);
  CHECK(server.optimizer().steps_taken() == 8);
  CHECK(first_difference(server.params(), expected) == -1);
  CHECK(first_difference(server.optimizer().state()[0], reference->state()[0]) == -1);

  // Sizes that do not fit the shard are refused, naming the shard.
  const std::vector<float> short_params(kN - 1, 0.0f);
  REQUIRE_THROWS_WITH(server.start(short_params, {velocity}, 0, 0),
                      Contains("[100, 106)") && Contains("5 parameters"));
  const std::vector<float> long_params(kN + 1, 0.0f);
  REQUIRE_THROWS_WITH(server.start(long_params, {velocity}, 0, 0), Contains("7 parameters"));
  REQUIRE_THROWS_WITH(server.start(params, {velocity, velocity}, 0, 0),
                      Contains("2 optimizer state buffers") && Contains("has 1"));
  const std::vector<float> short_velocity(kN - 2, 0.0f);
  REQUIRE_THROWS_WITH(server.start(params, {short_velocity}, 0, 0),
                      Contains("holds 4") && Contains("expected 6"));
}

TEST_CASE("ShardServer start: a restart discards a half-gathered aggregate", "[ps]") {
  // Pending gradients belong to the version they were computed for; starting again (a resumed
  // run) must not let one of them count towards the new version's average.
  const std::vector<float> start = {1.0f};
  auto server =
      make_server({.mode = PsMode::kSync, .workers = 2, .replicas_to_aggregate = 2}, start);
  push(*server, 0, 0, std::vector<float>{100.0f}, 1.0f);
  server->start(start, {}, 0, 0);
  // Worker 0 may push for version 0 again (no "pushed twice"), and the update is the average
  // of the two gradients pushed after the restart: (2 + 4) / 2 = 3.
  push(*server, 0, 0, std::vector<float>{2.0f}, 1.0f);
  CHECK(server->version() == 0);
  CHECK(push(*server, 1, 0, std::vector<float>{4.0f}, 1.0f).applied);
  CHECK(to_vector(server->params()) == std::vector<float>{-2.0f});
}

// ---- sharding changes no arithmetic ----

TEST_CASE("ShardServer: Adam over plan_shards' shards equals Adam on the whole buffer, bitwise",
          "[ps]") {
  // Fake tensors of 1000 parameters in all, odd sizes so that shards do not start or end on a
  // vector-width boundary; three servers each with their own Adam over their shard.
  const std::vector<int64_t> sizes = {300, 7, 450, 13, 200, 30};
  constexpr int kServers = 3;
  constexpr int kSteps = 3;
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  REQUIRE(total == 1000);
  const std::vector<ShardRange> shards = plan(sizes, kServers);
  check_plan_invariants(shards, sizes, kServers);

  OptimizerConfig adam;
  adam.kind = "adam";
  adam.weight_decay = 0.01f;
  const std::vector<float> start = random_floats(static_cast<size_t>(total), 40);
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < kSteps; ++t)
    grads.push_back(random_floats(static_cast<size_t>(total), 41 + static_cast<uint32_t>(t)));
  const float lrs[kSteps] = {0.01f, 0.003f, 0.02f};

  // The whole buffer, as the ring strategy would update it.
  std::vector<float> whole = start;
  auto whole_adam = make_optimizer(adam, total);
  for (int t = 0; t < kSteps; ++t) whole_adam->step(whole, grads[static_cast<size_t>(t)], lrs[t]);

  // Both modes: with one worker, sync (R = 1) and async (S = 0) must each do exactly one
  // optimizer step per push.
  for (const PsMode mode : {PsMode::kSync, PsMode::kAsync}) {
    INFO("mode " << ringtrain::to_string(mode));
    std::vector<std::unique_ptr<ShardServer>> servers;
    for (const ShardRange& range : shards) {
      servers.push_back(std::make_unique<ShardServer>(
          ShardServerConfig{
              .mode = mode, .workers = 1, .replicas_to_aggregate = 1, .max_staleness = 0},
          range, make_optimizer(adam, range.size())));
      servers.back()->start({start.data() + range.begin, static_cast<size_t>(range.size())}, {}, 0,
                            0);
    }
    for (int t = 0; t < kSteps; ++t) {
      for (size_t s = 0; s < servers.size(); ++s) {
        const ShardRange& range = shards[s];
        const std::span<const float> part(grads[static_cast<size_t>(t)].data() + range.begin,
                                          static_cast<size_t>(range.size()));
        const auto outcome = push(*servers[s], 0, t, part, lrs[t]);
        REQUIRE(outcome.applied);
        REQUIRE(outcome.answer == std::vector<int>{0});
      }
    }
    // Concatenate the shards' parameters and Adam moments and compare with the whole.
    std::vector<float> params;
    std::vector<float> m;
    std::vector<float> v;
    for (const auto& server : servers) {
      CHECK(server->version() == kSteps);
      CHECK(server->optimizer().steps_taken() == kSteps);
      params.insert(params.end(), server->params().begin(), server->params().end());
      const auto state = server->optimizer().state();
      REQUIRE(state.size() == 2);
      m.insert(m.end(), state[0].begin(), state[0].end());
      v.insert(v.end(), state[1].begin(), state[1].end());
    }
    CHECK(first_difference(params, whole) == -1);
    CHECK(first_difference(m, whole_adam->state()[0]) == -1);
    CHECK(first_difference(v, whole_adam->state()[1]) == -1);
  }
  // The comparison is not vacuous: three Adam steps moved every parameter.
  CHECK(first_difference(whole, start) != -1);
}

TEST_CASE("parse_ps_mode and to_string round-trip; anything else names --ps-mode", "[ps]") {
  CHECK(ringtrain::parse_ps_mode("sync") == PsMode::kSync);
  CHECK(ringtrain::parse_ps_mode("async") == PsMode::kAsync);
  CHECK(std::string(ringtrain::to_string(PsMode::kSync)) == "sync");
  CHECK(std::string(ringtrain::to_string(PsMode::kAsync)) == "async");
  REQUIRE_THROWS_WITH(ringtrain::parse_ps_mode("Sync"), Contains("--ps-mode"));
  REQUIRE_THROWS_WITH(ringtrain::parse_ps_mode(""), Contains("--ps-mode"));
}

TEST_CASE("split_segments: a segment that straddles two shards gives each its part", "[ps]") {
  // Shards cut at tensors [0, 6) [6, 10); segments [0, 4) [4, 8) [8, 10): the second straddles.
  const std::vector<ShardRange> shards = {{0, 6}, {6, 10}};
  const std::vector<GradRange> segments = {{0, 0, 4}, {1, 4, 8}, {1, 8, 10}};
  const auto pieces = split_segments(shards, segments);
  REQUIRE(pieces.size() == 2);
  REQUIRE(pieces[0].size() == 2);
  CHECK(
      (pieces[0][0].range.begin == 0 && pieces[0][0].range.end == 4 && pieces[0][0].segment == 0));
  CHECK(
      (pieces[0][1].range.begin == 4 && pieces[0][1].range.end == 6 && pieces[0][1].segment == 1));
  REQUIRE(pieces[1].size() == 2);
  CHECK(
      (pieces[1][0].range.begin == 6 && pieces[1][0].range.end == 8 && pieces[1][0].segment == 1));
  CHECK(
      (pieces[1][1].range.begin == 8 && pieces[1][1].range.end == 10 && pieces[1][1].segment == 2));
}

TEST_CASE("ShardServer exact: the integer sums of every worker, converted back once", "[ps]") {
  // Two workers, 4 micro-shards in all; one piece per half of the shard with its own shift.
  const std::vector<float> start = {1.0f, -2.0f, 0.5f, 8.0f};
  ShardServerConfig config{.mode = PsMode::kSync, .workers = 2, .replicas_to_aggregate = 2};
  config.exact_pieces = {{.range = {0, 2}, .segment = 0}, {.range = {2, 4}, .segment = 1}};
  config.exact_micro_shards = 4;
  auto server = make_server(config, start);
  REQUIRE(server->exact());
  const std::vector<std::vector<int64_t>> sums = {{4, -8, 1 << 20, 3}, {12, 0, 1 << 20, 5}};
  const std::vector<int32_t> shifts = {2, 20};
  for (int w = 0; w < 2; ++w) {
    const ShardServer::ExactPush buffer = server->exact_buffer(w, 0);
    std::copy(sums[static_cast<size_t>(w)].begin(), sums[static_cast<size_t>(w)].end(),
              buffer.sums.begin());
    std::copy(shifts.begin(), shifts.end(), buffer.shifts.begin());
    const auto outcome = server->push(w, 0, 1.0f);
    CHECK(outcome.accepted);
    CHECK(outcome.applied == (w == 1));
  }
  // The average: sum * 2^-shift / 4, as from_fixed_point computes it.
  std::vector<float> mean(4);
  const std::vector<int64_t> total = {16, -8, 2 << 20, 8};
  from_fixed_point({total.data(), 2}, 2, 4, {mean.data(), 2});
  from_fixed_point({total.data() + 2, 2}, 20, 4, {mean.data() + 2, 2});
  CHECK(mean == std::vector<float>{1.0f, -0.5f, 0.5f, 2.0f / (1 << 20)});
  std::vector<float> expected(4);
  for (size_t i = 0; i < 4; ++i) expected[i] = start[i] - mean[i];
  CHECK(to_vector(server->params()) == expected);
  // Workers that disagree on a scale are a bug, said as one.
  for (int w = 0; w < 2; ++w) {
    const ShardServer::ExactPush buffer = server->exact_buffer(w, 1);
    std::fill(buffer.sums.begin(), buffer.sums.end(), 0);
    buffer.shifts[0] = w == 0 ? 2 : 3;
    buffer.shifts[1] = 20;
    if (w == 0) {
      server->push(w, 1, 1.0f);
    } else {
      CHECK_THROWS_WITH(server->push(w, 1, 1.0f), Contains("other fixed-point scales"));
    }
  }
}
