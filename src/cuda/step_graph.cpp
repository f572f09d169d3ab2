// The step graph's capture and replay (step_graph.h).
#include "step_graph.h"

#include <exception>

#include <spdlog/spdlog.h>

#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/tensor.h"

namespace ringtrain {

StepGraph::~StepGraph() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);  // a destructor must not throw
}

// ThreadLocal mode: a call on this thread that could synchronise implicitly (a cudaMalloc,
// say) fails the capture instead of silently running outside the graph; other threads (the
// watchdog's) are not affected.
void StepGraph::capture(CapturableStep& step, cudaStream_t stream) {
  const uint64_t allocations_before = device_allocations();
  RINGTRAIN_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    step.enqueue();
  } catch (...) {
    // End the capture so the stream is usable again; the partial graph is discarded.
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream, &partial);
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  RINGTRAIN_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph is independent of it
  RINGTRAIN_CHECK_CUDA(instantiated);
  if (device_allocations() != allocations_before) {
    // Something allocated device memory while capturing: the graph may point at buffers that
    // the eager steps do not use. Never replay it.
    (void)cudaGraphExecDestroy(exec);
    RINGTRAIN_FAIL(
        "a device allocation happened while capturing the training step's CUDA graph (an "
        "internal error: the eager step before it should have made every buffer); run "
        "without --cuda-graphs");
  }
  if (exec_ != nullptr) RINGTRAIN_CHECK_CUDA(cudaGraphExecDestroy(exec_));
  exec_ = exec;
  ++captures_;
}

bool StepGraph::enqueue(CapturableStep& step, cudaStream_t stream, cudaEvent_t start,
                        bool& enabled) {
  using Action = GraphCapturePolicy<StepGraphKey>::Action;
  const StepGraphKey key = step.key();
  Action action = policy_.decide(key);
  if (action == Action::kCapture) {
    try {
      capture(step, stream);
      policy_.captured(key);
      action = Action::kReplay;
    } catch (const std::exception& e) {
      // Something in the step cannot be captured (a library call that synchronises, say):
      // the step is still correct eagerly, so say why once and stop trying. A failed
      // Begin/EndCapture or Instantiate leaves its error as the thread's last error, which
      // the eager step's first launch check would report: clear it.
      (void)cudaGetLastError();
      spdlog::warn(
          "cannot capture the training step in a CUDA graph ({}); --cuda-graphs is off for the "
          "rest of the run",
          e.what());
      enabled = false;
      policy_.forget_eager();
      action = Action::kEager;
    }
  }
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(start, stream));
  if (action == Action::kReplay) {
    RINGTRAIN_CHECK_CUDA(cudaGraphLaunch(exec_, stream));
    return true;
  }
  step.enqueue();
  // Whatever this step allocated (the first step's activations) is now part of the key, so
  // the next step of this shape captures.
  policy_.ran_eagerly(step.key());
  return false;
}

}  // namespace ringtrain
