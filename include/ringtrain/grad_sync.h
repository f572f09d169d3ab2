// GradSync: average the gradients in buckets while backward runs.
//
// A bucket is a contiguous range [begin, end) of the flat gradient buffer. The buffer is laid
// out in backward order and backward reports finished pieces front to back, so the ready part
// of the buffer is always a prefix, and bucket k is ready as soon as that prefix reaches its
// end (BucketCursor). Invariant: buckets are fixed before the first step, never split a
// reported piece of the gradients (Model::grad_ranges: a layer, or a block of rows of a large
// one), and are averaged strictly in index order on every rank; no run-time negotiation is
// needed, because every rank runs the same model and so marks the same ranges in the same
// order.
//
// Two engines share that cursor and hand each ready bucket to one Allreduce (allreduce.h):
// - host: a communication thread runs the Allreduce on each bucket as it becomes ready
//   (overlap), or all buckets after backward (overlap off: the baseline);
// - stream (GPU build): no thread; when bucket k is ready an event is recorded on the compute
//   stream, the communication stream waits on it and the Allreduce queues bucket k there;
//   finish() makes the compute stream wait for the communication stream, so the optimizer
//   (queued next on compute) runs on averaged gradients. The host never waits.
// make_grad_sync picks the engine from where the Allreduce's buffers live.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ringtrain/allreduce.h"
#include "ringtrain/context.h"
#include "ringtrain/model.h"

namespace ringtrain {

class Timeline;  // timeline.h

struct Bucket {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Cuts the gradient pieces (Model::grad_ranges: backward order, contiguous from 0) into
// buckets: a bucket closes at the first piece boundary where it holds at least its limit. The
// first bucket's limit is small (PyTorch DDP's idea) so that communication starts early; the
// others use bucket_elements. A limit <= 0 puts everything in one bucket.
std::vector<Bucket> assign_buckets(std::span<const GradRange> layer_ranges,
                                   int64_t first_bucket_elements, int64_t bucket_elements);

// Which buckets the reported prefix of the gradient buffer has completed. Not thread-safe: the
// host engine holds its lock around it.
class BucketCursor {
 public:
  explicit BucketCursor(std::vector<Bucket> buckets);
  void reset();  // a new backward pass
  // Backward finished [range.begin, range.end); throws unless it continues the prefix.
  // Returns how many buckets this completed.
  size_t advance(const GradRange& range);
  size_t ready() const { return ready_; }  // buckets complete so far
  bool all_ready() const { return ready_ == buckets_.size(); }
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  std::vector<Bucket> buckets_;
  size_t ready_ = 0;
  int64_t prefix_ = 0;
};

// Per-step timings of the gradient averaging, in milliseconds.
struct CommStats {
  double comm_ms = 0.0;     // sum of the bucket averages' durations
  double exposed_ms = 0.0;  // time the step waited for them after backward had finished
};

class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual void begin_backward() = 0;
  // The gradients [range.begin, range.end) are final. Never blocks on communication.
  virtual void mark_ready(const GradRange& range) = 0;
  // Host engine: returns when every bucket is averaged, rethrowing a communication error.
  // Stream engine: every bucket is queued and the compute stream is ordered after them.
  virtual void finish() = 0;
  // The last step's timings. Stream engine: only once the host has synchronised with the
  // compute stream (the step does, when it reads the loss back).
  virtual CommStats stats() = 0;
  virtual const std::vector<Bucket>& buckets() const = 0;
  virtual bool overlap() const = 0;
  // Where the gradients live (the Allreduce's memory).
  virtual Device device() const = 0;
  // --timeline (null: none): each bucket's ready instant, its allreduce from start to done and
  // finish()'s wait. Host engine: recorded as they happen; stream engine: resolved from its
  // CUDA events in stats(), once the step has synchronised and set the timeline's anchor.
  virtual void set_timeline(Timeline* timeline) = 0;
};

struct GradSyncConfig {
  int64_t first_bucket_elements = 62'500;  // 0.25 MB of float32
  int64_t bucket_elements = 1'000'000;     // 4 MB
  bool overlap = true;
};

// The engine for `allreduce`'s memory over the flat gradient buffer `grads` (on that device),
// cut into buckets at the pieces `ranges`. A stream engine takes its streams from `ctx`. The
// GradSync keeps a reference to `allreduce`.
std::unique_ptr<GradSync> make_grad_sync(float* grads, std::span<const GradRange> ranges,
                                         Allreduce& allreduce, const GradSyncConfig& config,
                                         const Context& ctx);

namespace detail {
// The stream engine (src/cuda/stream_grad_sync.cpp; the CPU-only build's stub throws).
std::unique_ptr<GradSync> make_stream_grad_sync(float* grads, std::vector<Bucket> buckets,
                                                Allreduce& allreduce, bool overlap,
                                                const Context& ctx);
}  // namespace detail

}  // namespace ringtrain
