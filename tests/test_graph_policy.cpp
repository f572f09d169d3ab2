// GraphCapturePolicy (graph_policy.h): the replay / capture / eager decisions of a device step
// under --cuda-graphs, driven by a simulated device whose activation buffers grow (and count an
// allocation) when a batch larger than any before arrives. The sequences are the ones the GPU
// tests (tests/gpu/test_gpu_training.cpp) expect from the real step.
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/graph_policy.h"

namespace {

struct SimKey {
  int64_t rows = 0;
  uint64_t allocations = 0;
  bool operator==(const SimKey&) const = default;
};

using Policy = ringtrain::GraphCapturePolicy<SimKey>;

// A device step's buffers: they grow (one allocation) when a batch needs more room.
struct SimDevice {
  int64_t capacity = 0;
  uint64_t allocations = 0;
  void fit(int64_t rows) {
    if (rows > capacity) {
      capacity = rows;
      ++allocations;
    }
  }
};

struct SimRun {
  Policy policy;
  SimDevice device;
  int captures = 0;
  bool capture_fails = false;
  std::string trace;  // one letter per step: E eager, R replay (C when it captured first)

  void step(int64_t rows) {
    const SimKey key{rows, device.allocations};
    Policy::Action action = policy.decide(key);
    if (action == Policy::Action::kCapture) {
      if (capture_fails) {
        policy.forget_eager();
        action = Policy::Action::kEager;
      } else {
        policy.captured(key);
        ++captures;
        trace += 'C';
        return;
      }
    }
    if (action == Policy::Action::kReplay) {
      trace += 'R';
      return;
    }
    device.fit(rows);  // an eager step makes what its shape needs
    policy.ran_eagerly(SimKey{rows, device.allocations});
    trace += 'E';
  }
  // An evaluation through the same buffers, with its own batch size.
  void evaluate(int64_t rows) { device.fit(rows); }
};

}  // namespace

TEST_CASE("a graph is captured on the second step of a shape and replayed after",
          "[graph_policy]") {
  SimRun run;
  for (int i = 0; i < 6; ++i) run.step(32);
  CHECK(run.trace == "ECRRRR");
  CHECK(run.captures == 1);
}

TEST_CASE("an evaluation that grows the buffers forces an eager step and a recapture",
          "[graph_policy]") {
  SimRun run;
  for (int i = 0; i < 3; ++i) run.step(32);
  run.evaluate(100);
  for (int i = 0; i < 3; ++i) run.step(32);
  CHECK(run.trace ==
        "ECREC"
        "R");
  CHECK(run.captures == 2);
  // An evaluation that fits in the buffers changes nothing.
  run.evaluate(50);
  run.step(32);
  CHECK(run.trace.back() == 'R');
}

TEST_CASE("a smaller batch runs eagerly and the usual shape's graph stays valid",
          "[graph_policy]") {
  SimRun run;
  for (const int64_t rows : {32, 32, 32, 16, 32, 32, 32}) run.step(rows);
  CHECK(run.trace == "ECRERRR");
  CHECK(run.captures == 1);
}

TEST_CASE("alternating shapes: each is eager once, then captured; one graph at a time",
          "[graph_policy]") {
  SimRun run;
  for (const int64_t rows : {32, 16, 16, 32, 32}) run.step(rows);
  CHECK(run.trace == "EECEC");
  CHECK(run.captures == 2);
}

TEST_CASE("a failed capture leaves the step eager", "[graph_policy]") {
  SimRun run;
  run.capture_fails = true;
  for (int i = 0; i < 4; ++i) run.step(32);
  CHECK(run.trace == "EEEE");
  CHECK(run.captures == 0);
}
