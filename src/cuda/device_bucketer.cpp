// The overlap engine on streams (device_bucketer.h).
#include "ringtrain/device_bucketer.h"

#include "ringtrain/cuda_check.h"

namespace ringtrain {

namespace {
cudaEvent_t ev(void* event) {
  return static_cast<cudaEvent_t>(event);
}
void* make_event(bool timing) {
  cudaEvent_t event = nullptr;
  RINGTRAIN_CHECK_CUDA(
      cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}
}  // namespace

DeviceGradBucketer::DeviceGradBucketer(const Context& ctx, float* grads,
                                       std::vector<Bucket> buckets, ReduceFn reduce, bool overlap)
    : ctx_(ctx),
      grads_(grads),
      buckets_(std::move(buckets)),
      reduce_(std::move(reduce)),
      overlap_(overlap) {
  RINGTRAIN_CHECK(ctx_.device == Device::kCuda && ctx_.stream && ctx_.comm_stream,
                  "DeviceGradBucketer needs a CUDA context with both streams");
  try {
    for (size_t k = 0; k < buckets_.size(); ++k) {
      ready_events_.push_back(make_event(false));
      start_events_.push_back(make_event(true));
      end_events_.push_back(make_event(true));
    }
    backward_end_ = make_event(true);
    comm_done_ = make_event(true);
  } catch (...) {
    release();
    throw;
  }
}

DeviceGradBucketer::~DeviceGradBucketer() {
  release();
}

void DeviceGradBucketer::release() {
  for (auto* list : {&ready_events_, &start_events_, &end_events_}) {
    for (void* event : *list) (void)cudaEventDestroy(ev(event));
    list->clear();
  }
  if (backward_end_ != nullptr) (void)cudaEventDestroy(ev(backward_end_));
  if (comm_done_ != nullptr) (void)cudaEventDestroy(ev(comm_done_));
  backward_end_ = comm_done_ = nullptr;
}

void DeviceGradBucketer::begin_backward() {
  ready_ = launched_ = 0;
  ready_prefix_ = 0;
  finished_ = false;
}

void DeviceGradBucketer::launch(size_t index) {
  const auto compute = static_cast<cudaStream_t>(ctx_.stream);
  const auto comm = static_cast<cudaStream_t>(ctx_.comm_stream);
  const Bucket& bucket = buckets_[index];
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(ev(ready_events_[index]), compute));
  RINGTRAIN_CHECK_CUDA(cudaStreamWaitEvent(comm, ev(ready_events_[index]), 0));
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(ev(start_events_[index]), comm));
  reduce_(grads_ + bucket.begin, bucket.size(), ctx_.comm_stream);
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(ev(end_events_[index]), comm));
  ++launched_;
}

void DeviceGradBucketer::mark_ready(const GradRange& range) {
  RINGTRAIN_CHECK(range.begin == ready_prefix_,
                  "gradients [{}, {}) reported out of backward order (expected to start at {})",
                  range.begin, range.end, ready_prefix_);
  ready_prefix_ = range.end;
  while (ready_ < buckets_.size() && buckets_[ready_].end <= ready_prefix_) ++ready_;
  if (overlap_) {
    while (launched_ < ready_) launch(launched_);
  }
}

void DeviceGradBucketer::finish() {
  RINGTRAIN_CHECK(ready_ == buckets_.size(), "finish() before backward reported every gradient");
  const auto compute = static_cast<cudaStream_t>(ctx_.stream);
  const auto comm = static_cast<cudaStream_t>(ctx_.comm_stream);
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(ev(backward_end_), compute));
  while (launched_ < buckets_.size()) launch(launched_);
  RINGTRAIN_CHECK_CUDA(cudaEventRecord(ev(comm_done_), comm));
  RINGTRAIN_CHECK_CUDA(cudaStreamWaitEvent(compute, ev(comm_done_), 0));
  finished_ = true;
}

CommStats DeviceGradBucketer::stats() {
  CommStats stats;
  if (!finished_) return stats;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    float ms = 0.0f;
    RINGTRAIN_CHECK_CUDA(cudaEventElapsedTime(&ms, ev(start_events_[k]), ev(end_events_[k])));
    stats.comm_ms += static_cast<double>(ms);
  }
  float exposed = 0.0f;
  RINGTRAIN_CHECK_CUDA(cudaEventElapsedTime(&exposed, ev(backward_end_), ev(comm_done_)));
  stats.exposed_ms = exposed > 0.0f ? static_cast<double>(exposed) : 0.0;
  return stats;
}

}  // namespace ringtrain
