// GradSync's host engine: how gradient ranges become buckets, and that buckets are averaged in
// order, during backward when overlapping, after it when not, with errors carried back to
// finish().
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "support/fn_allreduce.h"

using namespace ringtrain;

namespace {
std::vector<GradRange> ranges_of(std::initializer_list<int64_t> sizes) {
  std::vector<GradRange> ranges;
  int64_t begin = 0, layer = static_cast<int64_t>(sizes.size());
  for (int64_t size : sizes) {
    ranges.push_back({static_cast<int>(--layer), begin, begin + size});
    begin += size;
  }
  return ranges;
}

// A host GradSync over `ranges` whose allreduce is `fn`, with bucket limits first / rest.
struct TestSync {
  TestSync(float* grads, const std::vector<GradRange>& ranges, int64_t first, int64_t rest,
           testing::FnAllreduce::Fn fn, bool overlap)
      : allreduce(std::move(fn)),
        sync(make_grad_sync(
            grads, ranges, allreduce,
            {.first_bucket_elements = first, .bucket_elements = rest, .overlap = overlap},
            Context{})) {}
  GradSync* operator->() { return sync.get(); }
  CommStats wait() {
    sync->finish();
    return sync->stats();
  }
  testing::FnAllreduce allreduce;
  std::unique_ptr<GradSync> sync;
};
}  // namespace

TEST_CASE("assign_buckets closes a bucket at the first layer boundary past its limit",
          "[grad_sync]") {
  const auto ranges = ranges_of({10, 100, 5, 5, 300, 50});
  SECTION("a small first bucket, then the threshold") {
    const auto buckets = assign_buckets(ranges, 20, 100);
    REQUIRE(buckets.size() == 3);
    CHECK(buckets[0].begin == 0);
    CHECK(buckets[0].end == 110);  // 10 < 20, 10 + 100 >= 20
    CHECK(buckets[1].end == 420);  // 5 + 5 + 300 >= 100
    CHECK(buckets[2].end == 470);  // the rest
  }
  SECTION("a limit of 0 puts everything in one bucket") {
    const auto buckets = assign_buckets(ranges, 0, 0);
    REQUIRE(buckets.size() == 1);
    CHECK(buckets[0].end == 470);
  }
  SECTION("a limit of 1 gives one bucket per layer") {
    CHECK(assign_buckets(ranges, 1, 1).size() == ranges.size());
  }
  SECTION("buckets tile the buffer and never split a layer") {
    const auto buckets = assign_buckets(ranges, 7, 60);
    int64_t next = 0;
    for (const Bucket& bucket : buckets) {
      CHECK(bucket.begin == next);
      CHECK(std::any_of(ranges.begin(), ranges.end(),
                        [&](const GradRange& r) { return r.end == bucket.end; }));
      next = bucket.end;
    }
    CHECK(next == 470);
  }
  CHECK(assign_buckets({}, 10, 10).empty());
  const std::vector<GradRange> gap = {{1, 0, 10}, {0, 11, 20}};
  CHECK_THROWS_AS(assign_buckets(gap, 10, 10), Error);
}

TEST_CASE("buckets are averaged in index order, each exactly once per step", "[grad_sync]") {
  for (bool overlap : {true, false}) {
    INFO((overlap ? "overlapped" : "after backward"));
    std::vector<float> grads(470, 1.0f);
    const auto ranges = ranges_of({10, 100, 5, 5, 300, 50});
    std::mutex mutex;
    std::vector<std::pair<int64_t, int64_t>> calls;
    TestSync sync(
        grads.data(), ranges, 20, 100,
        [&](float* data, int64_t count) {
          std::lock_guard lock(mutex);
          calls.emplace_back(data - grads.data(), count);
          for (int64_t i = 0; i < count; ++i) data[i] *= 2.0f;
        },
        overlap);
    for (int step = 0; step < 3; ++step) {
      sync->begin_backward();
      for (const GradRange& range : ranges) sync->mark_ready(range);
      const CommStats stats = sync.wait();
      CHECK(stats.comm_ms >= 0.0);
      CHECK(stats.exposed_ms >= 0.0);
    }
    const std::vector<std::pair<int64_t, int64_t>> one_step = {{0, 110}, {110, 310}, {420, 50}};
    REQUIRE(calls.size() == 9);
    for (size_t i = 0; i < calls.size(); ++i) CHECK(calls[i] == one_step[i % 3]);
    CHECK(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 8.0f; }));
  }
}

TEST_CASE("with overlap a bucket is averaged while backward is still running", "[grad_sync]") {
  std::vector<float> grads(30, 0.0f);
  const auto ranges = ranges_of({10, 10, 10});
  std::atomic<int> reduced{0};
  TestSync sync(
      grads.data(), ranges, 1, 1, [&](float*, int64_t) { ++reduced; }, true);
  sync->begin_backward();
  sync->mark_ready(ranges[0]);
  // "Backward" of the next layers is still going on; the first bucket must not wait for it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (reduced == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(reduced == 1);
  sync->mark_ready(ranges[1]);
  sync->mark_ready(ranges[2]);
  sync.wait();
  CHECK(reduced == 3);

  // Without overlap nothing moves before wait().
  std::atomic<int> late{0};
  TestSync after(
      grads.data(), ranges, 1, 1, [&](float*, int64_t) { ++late; }, false);
  after->begin_backward();
  for (const GradRange& range : ranges) after->mark_ready(range);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(late == 0);
  const CommStats stats = after.wait();
  CHECK(late == 3);
  CHECK(stats.exposed_ms >= stats.comm_ms);  // all of it is exposed by construction
}

TEST_CASE("a failed average reaches finish(); misuse is refused", "[grad_sync]") {
  std::vector<float> grads(20, 0.0f);
  const auto ranges = ranges_of({10, 10});
  for (bool overlap : {true, false}) {
    TestSync sync(
        grads.data(), ranges, 1, 1, [](float*, int64_t) { RINGTRAIN_FAIL("the wire is down"); },
        overlap);
    sync->begin_backward();
    for (const GradRange& range : ranges) sync->mark_ready(range);
    CHECK_THROWS_WITH(sync.wait(), Catch::Contains("the wire is down"));
  }
  TestSync sync(
      grads.data(), ranges, 1, 1, [](float*, int64_t) {}, true);
  sync->begin_backward();
  CHECK_THROWS_AS(sync->mark_ready(ranges[1]), Error);  // out of backward order
  CHECK_THROWS_AS(sync.wait(), Error);                  // before every gradient was reported
}

TEST_CASE("a large layer reports its gradients in row blocks, each final when reported",
          "[grad_sync]") {
  // dense(784->4096) holds 3.2 M weights: above the 2 Mi threshold, so it reports 256-row blocks.
  auto model = make_model({.name = "mlp", .hidden = {4096}});
  model->init_params(3);
  const std::vector<GradRange> pieces = model->grad_ranges();
  REQUIRE(pieces.size() == 1 + 4);  // the output layer, then 784 rows in blocks of 256
  CHECK(pieces[1].end - pieces[1].begin == 256 * 4096);
  CHECK(pieces.back().end == model->num_params());

  Tensor images(Shape{8, 28, 28, 1});
  for (int64_t i = 0; i < images.numel(); ++i) images[i] = static_cast<float>(i % 255) / 255.0f;
  Context ctx;
  const Tensor& logits = model->forward(images, ctx);
  Tensor dlogits(logits.shape());
  for (int64_t i = 0; i < dlogits.numel(); ++i) dlogits[i] = static_cast<float>(i % 7) - 3.0f;

  std::vector<GradRange> reported;
  std::vector<std::vector<float>> at_report;
  model->backward(dlogits, ctx, [&](const GradRange& range) {
    reported.push_back(range);
    at_report.emplace_back(model->grads().data() + range.begin, model->grads().data() + range.end);
  });
  REQUIRE(reported.size() == pieces.size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    CHECK(reported[k].begin == pieces[k].begin);
    CHECK(reported[k].end == pieces[k].end);
    // Nothing in a reported range changes afterwards.
    CHECK(std::equal(at_report[k].begin(), at_report[k].end(),
                     model->grads().data() + reported[k].begin));
  }
}
