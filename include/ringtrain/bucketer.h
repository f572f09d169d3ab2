// Gradient buckets and the overlap engine.
//
// A bucket is a contiguous range [begin, end) of the flat gradient buffer. The buffer is laid
// out in backward order and backward reports finished layers front to back, so the ready part
// of the buffer is always a prefix, and bucket k is ready as soon as that prefix reaches its
// end. Invariant: buckets are fixed before the first step, never split a reported piece of the
// gradients (Model::grad_ranges: a layer, or a block of rows of a large one), and are
// reduced strictly in index order on every rank; no run-time negotiation is needed, because
// every rank runs the same model and so marks the same ranges in the same order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "ringtrain/model.h"

namespace ringtrain {

struct Bucket {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Cuts the gradient pieces (Model::grad_ranges: backward order, contiguous from 0) into
// buckets: a bucket closes at the first piece boundary where it holds at least its limit. The first
// bucket's limit is small (PyTorch DDP's idea) so that communication starts early; the others use
// bucket_elements. A limit <= 0 puts everything in one bucket.
std::vector<Bucket> assign_buckets(std::span<const GradRange> layer_ranges,
                                   int64_t first_bucket_elements, int64_t bucket_elements);

// Per-step timings of the gradient averaging, in milliseconds.
struct CommStats {
  double comm_ms = 0.0;     // sum of the bucket reductions' durations
  double exposed_ms = 0.0;  // time wait() blocked after backward had finished
};

// Reduces buckets of the gradient buffer on its own communication thread while backward
// continues (overlap), or all after backward (overlap off: the baseline).
class GradBucketer {
 public:
  // reduce(data, count) averages count floats in place across ranks; it runs on the
  // communication thread, one bucket at a time, in bucket order.
  using ReduceFn = std::function<void(float* data, int64_t count)>;
  GradBucketer(float* grads, std::vector<Bucket> buckets, ReduceFn reduce, bool overlap);
  GradBucketer(const GradBucketer&) = delete;
  GradBucketer& operator=(const GradBucketer&) = delete;
  ~GradBucketer();

  void begin_backward();
  // The gradients [range.begin, range.end) are final. Never blocks on communication.
  void mark_ready(const GradRange& range);
  // Returns when every bucket is averaged; rethrows an error from the communication thread.
  CommStats wait();
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  void comm_loop();
  void reduce_bucket(size_t index);  // times one reduction into comm_ms_

  float* grads_;
  std::vector<Bucket> buckets_;
  ReduceFn reduce_;
  bool overlap_;

  std::mutex mutex_;
  std::condition_variable ready_cv_;  // main -> comm: more buckets are ready (or stop)
  std::condition_variable done_cv_;   // comm -> main: a bucket finished (or failed)
  size_t ready_ = 0;                  // buckets whose gradients are complete
  size_t done_ = 0;                   // buckets averaged
  int64_t ready_prefix_ = 0;          // the gradient buffer is final up to here
  bool stop_ = false;
  double comm_ms_ = 0.0;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace ringtrain
