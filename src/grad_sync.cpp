// Buckets, the bucket cursor and the host engine of GradSync (see grad_sync.h). The stream
// engine is src/cuda/stream_grad_sync.cpp.
#include "ringtrain/grad_sync.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "ringtrain/check.h"
#include "ringtrain/timeline.h"

namespace ringtrain {

using Clock = std::chrono::steady_clock;

std::vector<Bucket> assign_buckets(std::span<const GradRange> layer_ranges,
                                   int64_t first_bucket_elements, int64_t bucket_elements) {
  std::vector<Bucket> buckets;
  Bucket current;
  int64_t expected_begin = 0;
  for (const GradRange& range : layer_ranges) {
    RINGTRAIN_CHECK(range.begin == expected_begin && range.end >= range.begin,
                    "gradient ranges must be contiguous from 0 in backward order: got [{}, {}) "
                    "after {}",
                    range.begin, range.end, expected_begin);
    expected_begin = range.end;
    current.end = range.end;
    const int64_t limit = buckets.empty() ? first_bucket_elements : bucket_elements;
    if (limit > 0 && current.size() >= limit) {
      buckets.push_back(current);
      current = Bucket{current.end, current.end};
    }
  }
  if (current.size() > 0) buckets.push_back(current);
  return buckets;
}

BucketCursor::BucketCursor(std::vector<Bucket> buckets) : buckets_(std::move(buckets)) {}

void BucketCursor::reset() {
  ready_ = 0;
  prefix_ = 0;
}

size_t BucketCursor::advance(const GradRange& range) {
  RINGTRAIN_CHECK(range.begin == prefix_,
                  "gradients [{}, {}) reported out of backward order (expected to start at {})",
                  range.begin, range.end, prefix_);
  prefix_ = range.end;
  const size_t before = ready_;
  while (ready_ < buckets_.size() && buckets_[ready_].end <= prefix_) ++ready_;
  return ready_ - before;
}

namespace {

// The host engine: a communication thread averages each bucket as it becomes ready while
// backward continues (overlap), or finish() averages them all after backward (overlap off).
class HostGradSync final : public GradSync {
 public:
  HostGradSync(float* grads, std::vector<Bucket> buckets, Allreduce& allreduce, bool overlap)
      : grads_(grads), cursor_(std::move(buckets)), allreduce_(allreduce), overlap_(overlap) {
    int64_t largest = 0;
    for (const Bucket& b : cursor_.buckets()) largest = std::max(largest, b.size());
    allreduce_.reserve(static_cast<size_t>(largest));  // no growth in a step
    if (overlap_) thread_ = std::thread([this] { comm_loop(); });
  }
  HostGradSync(const HostGradSync&) = delete;
  HostGradSync& operator=(const HostGradSync&) = delete;
  ~HostGradSync() override {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ready_cv_.notify_one();
    thread_.join();
  }

  void begin_backward() override {
    std::lock_guard lock(mutex_);
    RINGTRAIN_CHECK(done_ == cursor_.ready(),
                    "begin_backward() while {} bucket(s) are still being averaged",
                    cursor_.ready() - done_);
    cursor_.reset();
    done_ = 0;
    comm_ms_ = 0.0;
    stats_ = {};
  }

  void mark_ready(const GradRange& range) override {
    size_t newly_ready = 0, ready = 0;
    int64_t ready_at = 0;
    {
      std::lock_guard lock(mutex_);
      newly_ready = cursor_.advance(range);
      ready = cursor_.ready();
      // Read under the lock, so that it precedes the communication thread's start of the bucket.
      if (timeline_ != nullptr && newly_ready > 0) ready_at = Timeline::now_ns();
    }
    if (timeline_ != nullptr && newly_ready > 0) {
      for (size_t k = ready - newly_ready; k < ready; ++k)
        timeline_->instant(TraceKind::kBucketReady, TraceLane::kCompute, ready_at,
                           static_cast<int32_t>(k));
    }
    if (overlap_ && newly_ready > 0) ready_cv_.notify_one();
  }

  void finish() override {
    const auto start = Clock::now();
    if (!overlap_) {
      RINGTRAIN_CHECK(cursor_.all_ready(), "finish() before backward reported every gradient");
      for (; done_ < cursor_.buckets().size(); ++done_) average(done_);
    } else {
      std::unique_lock lock(mutex_);
      RINGTRAIN_CHECK(cursor_.all_ready(), "finish() before backward reported every gradient");
      done_cv_.wait(lock, [this] { return done_ == cursor_.buckets().size() || error_; });
      if (error_) {
        std::exception_ptr failure = error_;
        error_ = nullptr;
        done_ = cursor_.ready();  // nothing more will be averaged for this step
        std::rethrow_exception(failure);
      }
    }
    const auto end = Clock::now();
    stats_.exposed_ms = std::chrono::duration<double, std::milli>(end - start).count();
    stats_.comm_ms = comm_ms_;
    if (timeline_ != nullptr)
      timeline_->span(TraceKind::kGradWait, TraceLane::kCompute, Timeline::to_ns(start),
                      Timeline::to_ns(end));
  }

  CommStats stats() override { return stats_; }
  const std::vector<Bucket>& buckets() const override { return cursor_.buckets(); }
  bool overlap() const override { return overlap_; }
  Device device() const override { return Device::kCpu; }
  void set_timeline(Timeline* timeline) override { timeline_ = timeline; }

 private:
  // Times one bucket's average into comm_ms_ (only one thread averages at a time).
  void average(size_t index) {
    const Bucket& bucket = cursor_.buckets()[index];
    const auto start = Clock::now();
    allreduce_.run(grads_ + bucket.begin, static_cast<size_t>(bucket.size()), ReduceOp::kAvg);
    const auto end = Clock::now();
    comm_ms_ += std::chrono::duration<double, std::milli>(end - start).count();
    // Without overlap the main thread averages, after backward: it is the compute row's.
    if (timeline_ != nullptr)
      timeline_->span(TraceKind::kAllreduce, overlap_ ? TraceLane::kComm : TraceLane::kCompute,
                      Timeline::to_ns(start), Timeline::to_ns(end), static_cast<int32_t>(index));
  }

  void comm_loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_cv_.wait(lock, [this] { return stop_ || (done_ < cursor_.ready() && !error_); });
      if (stop_) return;
      const size_t index = done_;
      lock.unlock();
      std::exception_ptr failure;
      try {
        average(index);
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (failure) {
        error_ = failure;
      } else {
        ++done_;
      }
      done_cv_.notify_one();
    }
  }

  float* grads_;
  BucketCursor cursor_;  // guarded by mutex_
  Allreduce& allreduce_;
  bool overlap_;

  std::mutex mutex_;
  std::condition_variable ready_cv_;  // main -> comm: more buckets are ready (or stop)
  std::condition_variable done_cv_;   // comm -> main: a bucket finished (or failed)
  size_t done_ = 0;                   // buckets averaged
  bool stop_ = false;
  double comm_ms_ = 0.0;
  CommStats stats_;
  std::exception_ptr error_;
  Timeline* timeline_ = nullptr;  // set before the first step
  std::thread thread_;
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(float* grads, std::span<const GradRange> ranges,
                                         Allreduce& allreduce, const GradSyncConfig& config,
                                         const Context& ctx) {
  std::vector<Bucket> buckets =
      assign_buckets(ranges, config.first_bucket_elements, config.bucket_elements);
  const Device where = device_of(allreduce.kind());
  RINGTRAIN_CHECK(where == ctx.device,
                  "the gradients live on the {} but the allreduce ({}) averages {} memory",
                  to_string(ctx.device), to_string(allreduce.kind()), to_string(where));
  if (where == Device::kCuda)
    return detail::make_stream_grad_sync(grads, std::move(buckets), allreduce, config.overlap, ctx);
  return std::make_unique<HostGradSync>(grads, std::move(buckets), allreduce, config.overlap);
}

}  // namespace ringtrain
