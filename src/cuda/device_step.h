// The device step's state (internal to src/cuda/): what StepWorkspace::device holds. The batch
// (device_batch.h), the loss statistics and their pinned read-back, the step's timing events
// and the step graph (step_graph.h), all allocated on the workspace's first device step and
// reused after. Shared by the training step (device_step.cpp) and evaluation (device_eval.cpp).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "device_batch.h"
#include "kernels.h"
#include "ringtrain/comm.h"
#include "ringtrain/train.h"
#include "step_graph.h"

namespace ringtrain {

struct DeviceStepState {
  DeviceStepState();
  ~DeviceStepState();
  DeviceStepState(const DeviceStepState&) = delete;
  DeviceStepState& operator=(const DeviceStepState&) = delete;

  // Queues the copy of the loss statistics (and the non-finite count) to pinned memory and
  // waits for the stream: the step's one host synchronisation.
  void read_back(cudaStream_t stream, bool with_nonfinite, ProgressBoard* board);

  DeviceBatch batch;
  gpu::XentStats* stats = nullptr;                       // device
  unsigned long long* nonfinite = nullptr;               // device, --check-finite
  gpu::XentStats* host_stats = nullptr;                  // pinned host
  unsigned long long* host_nonfinite = nullptr;          // pinned host
  cudaEvent_t step_start = nullptr, step_end = nullptr;  // the step on the compute stream
  // --timeline: the compute stream's phase boundaries (kUploaded .. kOptimizerBegins), and the
  // anchor that read_back records before its wait when record_anchor is set; anchor_ns is the
  // host clock just after the wait (device_timeline.h).
  enum Phase { kUploaded, kForwardDone, kBackwardDone, kOptimizerBegins, kPhases };
  std::array<cudaEvent_t, kPhases> phase{};
  cudaEvent_t anchor = nullptr;
  int64_t anchor_ns = 0;
  bool record_anchor = false;
  StepGraph graph;  // StepWorkspace::cuda_graph

 private:
  void release();  // never throws
};

// The workspace's state, made on first use.
DeviceStepState& state_of(StepWorkspace& workspace);

// The loss and the correct count of `rows` rows from the read-back statistics; throws if a
// label outside the class range reached the GPU.
void fill_loss(StepStats& stats, const gpu::XentStats& host, int64_t rows);

}  // namespace ringtrain
