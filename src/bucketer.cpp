// Buckets and the communication thread (see bucketer.h).
#include "ringtrain/bucketer.h"

#include <chrono>

#include "ringtrain/check.h"

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

GradBucketer::GradBucketer(float* grads, std::vector<Bucket> buckets, ReduceFn reduce, bool overlap)
    : grads_(grads), buckets_(std::move(buckets)), reduce_(std::move(reduce)), overlap_(overlap) {
  if (overlap_) thread_ = std::thread([this] { comm_loop(); });
}

GradBucketer::~GradBucketer() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  ready_cv_.notify_one();
  thread_.join();
}

void GradBucketer::begin_backward() {
  std::lock_guard lock(mutex_);
  RINGTRAIN_CHECK(done_ == ready_, "begin_backward() while {} bucket(s) are still reducing",
                  ready_ - done_);
  ready_ = done_ = 0;
  ready_prefix_ = 0;
  comm_ms_ = 0.0;
}

void GradBucketer::mark_ready(const GradRange& range) {
  size_t newly_ready = 0;
  {
    std::lock_guard lock(mutex_);
    RINGTRAIN_CHECK(range.begin == ready_prefix_,
                    "gradients [{}, {}) reported out of backward order (expected to start at {})",
                    range.begin, range.end, ready_prefix_);
    ready_prefix_ = range.end;
    const size_t before = ready_;
    while (ready_ < buckets_.size() && buckets_[ready_].end <= ready_prefix_) ++ready_;
    newly_ready = ready_ - before;
  }
  if (overlap_ && newly_ready > 0) ready_cv_.notify_one();
}

void GradBucketer::reduce_bucket(size_t index) {
  const Bucket& bucket = buckets_[index];
  const auto start = Clock::now();
  reduce_(grads_ + bucket.begin, bucket.size());
  comm_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void GradBucketer::comm_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    ready_cv_.wait(lock, [this] { return stop_ || (done_ < ready_ && !error_); });
    if (stop_) return;
    const size_t index = done_;
    lock.unlock();
    std::exception_ptr failure;
    try {
      reduce_bucket(index);
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

CommStats GradBucketer::wait() {
  const auto start = Clock::now();
  CommStats stats;
  if (!overlap_) {
    RINGTRAIN_CHECK(ready_ == buckets_.size(), "wait() before backward reported every gradient");
    for (; done_ < buckets_.size(); ++done_) reduce_bucket(done_);
  } else {
    std::unique_lock lock(mutex_);
    RINGTRAIN_CHECK(ready_ == buckets_.size(), "wait() before backward reported every gradient");
    done_cv_.wait(lock, [this] { return done_ == buckets_.size() || error_; });
    if (error_) {
      std::exception_ptr failure = error_;
      error_ = nullptr;
      ready_ = done_;  // nothing more will be reduced for this step
      std::rethrow_exception(failure);
    }
  }
  stats.exposed_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  stats.comm_ms = comm_ms_;
  return stats;
}

}  // namespace ringtrain
