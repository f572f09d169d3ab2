// The overlap engine on streams (GPU build only; the header needs no CUDA headers). The same
// buckets as GradBucketer (assign_buckets over Model::grad_ranges), but no thread: ordering is
// done with CUDA events, never by the host waiting.
//
//   backward reports a range -> when bucket k becomes complete: record ready[k] on the compute
//   stream; the communication stream waits on ready[k]; record start[k] on it; `reduce`
//   queues bucket k's averaging on the communication stream (NcclComm's ring or
//   ncclAllReduce, which return without waiting); record end[k].
//   finish(): record backward_end on compute, comm_done on comm, and the compute stream waits
//   on comm_done, so the optimizer (queued next on compute) runs on averaged gradients.
//
// With overlap off, mark_ready only counts and finish() queues every bucket after backward.
// The timings (CommStats) come from the events once the step's work has completed: stats()
// must be called after the host has synchronised with the compute stream (train_step does,
// when it reads the loss): comm_ms = sum of end[k] - start[k]; exposed_ms = comm_done -
// backward_end when positive (the time the compute stream idles waiting for communication).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ringtrain/bucketer.h"
#include "ringtrain/context.h"

namespace ringtrain {

class DeviceGradBucketer {
 public:
  // Queues the in-place average of count floats at `data` (device memory) on `stream` (the
  // communication stream) and returns without waiting for it.
  using ReduceFn = std::function<void(float* data, int64_t count, void* stream)>;
  DeviceGradBucketer(const Context& ctx, float* grads, std::vector<Bucket> buckets, ReduceFn reduce,
                     bool overlap);
  ~DeviceGradBucketer();
  DeviceGradBucketer(const DeviceGradBucketer&) = delete;
  DeviceGradBucketer& operator=(const DeviceGradBucketer&) = delete;

  void begin_backward();
  void mark_ready(const GradRange& range);
  // Every bucket queued; the compute stream waits for the communication stream.
  void finish();
  // The last step's timings; call after the compute stream has been synchronised.
  CommStats stats();
  const std::vector<Bucket>& buckets() const { return buckets_; }
  bool overlap() const { return overlap_; }

 private:
  void launch(size_t index);
  void release();  // destroys the events (never throws)

  Context ctx_;
  float* grads_;
  std::vector<Bucket> buckets_;
  ReduceFn reduce_;
  bool overlap_;
  size_t ready_ = 0, launched_ = 0;
  int64_t ready_prefix_ = 0;
  bool finished_ = false;
  // cudaEvent_t, kept opaque here: ready/start/end per bucket, then backward_end, comm_done.
  std::vector<void*> ready_events_, start_events_, end_events_;
  void* backward_end_ = nullptr;
  void* comm_done_ = nullptr;
};

}  // namespace ringtrain
