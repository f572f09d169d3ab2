// The step graph (internal to src/cuda/): the capturable part of a device step (the upload,
// forward, the loss and backward) captured once into a CUDA graph and replayed, as
// GraphCapturePolicy (graph_policy.h) decides: replay, capture, or run eagerly.
//
// A graph bakes in every pointer it was captured with; StepGraphKey stands for all of them, so
// a graph is replayed only while its key is unchanged. `allocations` (device_allocations())
// stands for every device pointer inside the model (activations, gradients) and its layers'
// caches, which change only by allocating.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device_batch.h"
#include "ringtrain/context.h"
#include "ringtrain/graph_policy.h"
#include "ringtrain/model.h"

namespace ringtrain {

struct StepGraphKey {
  const Model* model = nullptr;
  StreamHandle stream = nullptr;
  BlasHandle blas = nullptr;
  DnnHandle dnn = nullptr;
  ConvImpl conv_impl = ConvImpl::kDirect;
  Shape image_shape;
  const float* images = nullptr;
  const int32_t* labels = nullptr;
  const float* host_images = nullptr;
  const int32_t* host_rows = nullptr;
  const int32_t* indices = nullptr;
  const DeviceDataset* dataset = nullptr;  // null: a host batch
  const float* dlogits = nullptr;
  uint64_t allocations = 0;

  bool operator==(const StepGraphKey& other) const {
    return model == other.model && stream == other.stream && blas == other.blas &&
           dnn == other.dnn && conv_impl == other.conv_impl && image_shape == other.image_shape &&
           images == other.images && labels == other.labels && host_images == other.host_images &&
           host_rows == other.host_rows && indices == other.indices && dataset == other.dataset &&
           dlogits == other.dlogits && allocations == other.allocations;
  }
};

// The part of a step that a graph may hold, as the device step describes it to StepGraph. An
// interface rather than callables, so that a step passes it without allocating.
class CapturableStep {
 public:
  virtual ~CapturableStep() = default;
  // The key of everything enqueue() would use, as it stands now.
  virtual StepGraphKey key() const = 0;
  // Queues the work on the compute stream (eagerly, or into a capture).
  virtual void enqueue() = 0;
};

class StepGraph {
 public:
  StepGraph() = default;
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Queues `step` on `stream`: replaying the graph, capturing it first, or eagerly, as the
  // policy says. Records `start` on the stream before the work (after a capture, which queues
  // nothing). A capture that fails is said once (a warning) and turns `enabled` off, and the
  // step runs eagerly. Returns whether a graph ran.
  bool enqueue(CapturableStep& step, cudaStream_t stream, cudaEvent_t start, bool& enabled);
  int64_t captures() const { return captures_; }  // graphs captured so far (tests, logs)

 private:
  // Captures step.enqueue() into exec_ (replacing any older graph). Queues nothing.
  void capture(CapturableStep& step, cudaStream_t stream);

  cudaGraphExec_t exec_ = nullptr;
  // What the graph was captured with, and what the last eager step ran with (a capture follows
  // an eager step with the same key, so that the capture itself never allocates).
  GraphCapturePolicy<StepGraphKey> policy_;
  int64_t captures_ = 0;
};

}  // namespace ringtrain
