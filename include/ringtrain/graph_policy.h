// When a device step replays its captured CUDA graph, captures one, or runs eagerly
// (train_step on a GPU with --cuda-graphs; src/cuda/step_graph.cpp). Kept apart from CUDA so the
// rules are tested on any machine (tests/test_graph_policy.cpp).
//
// A graph bakes in every pointer it was captured with; `Key` stands for all of them (the
// batch's shape, the buffers, a count of device allocations: StepGraphKey (src/cuda/step_graph.h)).
// The rules:
//   - replay when the key equals the captured graph's;
//   - else capture when the key equals the one the last eager step ended with: that step made
//     every buffer this shape needs, so the capture allocates nothing;
//   - else run eagerly, and remember the key the eager step ended with.
// One graph at a time: a capture replaces the previous graph.
#pragma once

namespace ringtrain {

template <class Key>
class GraphCapturePolicy {
 public:
  enum class Action { kEager, kCapture, kReplay };

  Action decide(const Key& key) const {
    if (have_captured_ && key == captured_) return Action::kReplay;
    if (have_eager_ && key == eager_) return Action::kCapture;
    return Action::kEager;
  }
  // The capture under `key` succeeded (the caller then replays it).
  void captured(const Key& key) {
    captured_ = key;
    have_captured_ = true;
  }
  // An eager step ran; `key_after` is the key once it finished (its allocations included).
  void ran_eagerly(const Key& key_after) {
    eager_ = key_after;
    have_eager_ = true;
  }
  // A capture failed: do not try the same key again.
  void forget_eager() { have_eager_ = false; }

 private:
  Key captured_{}, eager_{};
  bool have_captured_ = false, have_eager_ = false;
};

}  // namespace ringtrain
