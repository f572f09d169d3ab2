// The stream engine of GradSync (grad_sync.h), for device gradients: no thread, ordering by
// CUDA events only, never by the host waiting.
//
//   backward reports a range -> for each bucket k that this completes (BucketCursor): record
//   ready[k] on the compute stream; the communication stream waits on ready[k]; record
//   start[k] on it; the Allreduce queues bucket k's average there (the ring over NCCL and
//   ncclAllReduce return without waiting; the staged ring waits for its copy down); record
//   end[k].
//   finish(): record backward_end on compute, queue the buckets not yet queued, record
//   comm_done on comm, and make the compute stream wait on comm_done, so the optimizer (queued
//   next on compute) runs on averaged gradients.
//
// With overlap off, mark_ready only advances the cursor and finish() queues every bucket after
// backward. The timings come from the events once the step's work has completed, so stats()
// is valid only after the host has synchronised with the compute stream (the device step does,
// when it reads the loss back): comm_ms = sum of end[k] - start[k]; exposed_ms = comm_done -
// backward_end when positive (the time the compute stream idled, waiting for communication).
// With a timeline (--timeline), stats() also resolves ready[k], start[k] and end[k] to host
// time against the step's anchor (device_timeline.h): the ready events then carry timestamps.
#include <algorithm>
#include <memory>
#include <vector>

#include "device_timeline.h"
#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/timeline.h"

namespace ringtrain {

namespace {

// A CUDA event, destroyed with its owner. Timing events for the statistics; the ready events
// only order the streams, so they skip the timestamp.
class Event {
 public:
  explicit Event(bool timing) {
    RINGTRAIN_CHECK_CUDA(
        cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() { (void)cudaEventDestroy(event_); }  // a destructor must not throw
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  Event& operator=(Event&&) = delete;

  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class StreamGradSync final : public GradSync {
 public:
  StreamGradSync(float* grads, std::vector<Bucket> buckets, Allreduce& allreduce, bool overlap,
                 const Context& ctx)
      : grads_(grads),
        cursor_(std::move(buckets)),
        allreduce_(allreduce),
        overlap_(overlap),
        compute_(static_cast<cudaStream_t>(ctx.stream)),
        comm_(static_cast<cudaStream_t>(ctx.comm_stream)),
        backward_end_(true),
        comm_done_(true) {
    const size_t count = cursor_.buckets().size();
    ready_.reserve(count);
    start_.reserve(count);
    end_.reserve(count);
    int64_t largest = 0;
    for (const Bucket& bucket : cursor_.buckets()) {
      ready_.emplace_back(false);
      start_.emplace_back(true);
      end_.emplace_back(true);
      largest = std::max(largest, bucket.size());
    }
    // Every scratch now, so that no step grows one (growth may wait for the device).
    allreduce_.reserve(static_cast<size_t>(largest));
  }

  void begin_backward() override {
    cursor_.reset();
    launched_ = 0;
    finished_ = false;
    recorded_ = false;
  }

  void mark_ready(const GradRange& range) override {
    cursor_.advance(range);  // throws unless the range continues the reported prefix
    if (overlap_) {
      while (launched_ < cursor_.ready()) launch(launched_);
    }
  }

  void finish() override {
    RINGTRAIN_CHECK(cursor_.all_ready(), "finish() before backward reported every gradient");
    RINGTRAIN_CHECK_CUDA(cudaEventRecord(backward_end_.get(), compute_));
    while (launched_ < cursor_.buckets().size()) launch(launched_);
    RINGTRAIN_CHECK_CUDA(cudaEventRecord(comm_done_.get(), comm_));
    RINGTRAIN_CHECK_CUDA(cudaStreamWaitEvent(compute_, comm_done_.get(), 0));
    finished_ = true;
  }

  CommStats stats() override {
    CommStats stats;
    if (!finished_) return stats;
    if (timeline_ != nullptr && !recorded_) {  // once per step
      recorded_ = true;
      for (size_t k = 0; k < end_.size(); ++k) {
        const auto index = static_cast<int32_t>(k);
        timeline_->instant(TraceKind::kBucketReady, TraceLane::kComputeStream,
                           host_time_ns(ready_[k].get(), *timeline_), index);
        timeline_->span(TraceKind::kAllreduce, TraceLane::kComm,
                        host_time_ns(start_[k].get(), *timeline_),
                        host_time_ns(end_[k].get(), *timeline_), index);
      }
    }
    for (size_t k = 0; k < end_.size(); ++k) {
      float ms = 0.0f;
      RINGTRAIN_CHECK_CUDA(cudaEventElapsedTime(&ms, start_[k].get(), end_[k].get()));
      stats.comm_ms += static_cast<double>(ms);
    }
    float exposed = 0.0f;
    RINGTRAIN_CHECK_CUDA(cudaEventElapsedTime(&exposed, backward_end_.get(), comm_done_.get()));
    stats.exposed_ms = exposed > 0.0f ? static_cast<double>(exposed) : 0.0;
    return stats;
  }

  const std::vector<Bucket>& buckets() const override { return cursor_.buckets(); }
  bool overlap() const override { return overlap_; }
  Device device() const override { return Device::kCuda; }
  void set_timeline(Timeline* timeline) override {
    timeline_ = timeline;
    // The ready events order the streams only, untimed, unless the timeline needs their times.
    ready_.clear();
    for (size_t k = 0; k < cursor_.buckets().size(); ++k) ready_.emplace_back(timeline != nullptr);
  }

 private:
  // Queues bucket `index` on the communication stream, after the compute stream's work so far.
  void launch(size_t index) {
    const Bucket& bucket = cursor_.buckets()[index];
    RINGTRAIN_CHECK_CUDA(cudaEventRecord(ready_[index].get(), compute_));
    RINGTRAIN_CHECK_CUDA(cudaStreamWaitEvent(comm_, ready_[index].get(), 0));
    RINGTRAIN_CHECK_CUDA(cudaEventRecord(start_[index].get(), comm_));
    allreduce_.run(grads_ + bucket.begin, static_cast<size_t>(bucket.size()), ReduceOp::kAvg);
    RINGTRAIN_CHECK_CUDA(cudaEventRecord(end_[index].get(), comm_));
    ++launched_;
  }

  float* grads_;
  BucketCursor cursor_;
  Allreduce& allreduce_;
  bool overlap_;
  cudaStream_t compute_;
  cudaStream_t comm_;
  size_t launched_ = 0;  // buckets queued on the communication stream this step
  bool finished_ = false;
  Timeline* timeline_ = nullptr;
  bool recorded_ = false;                   // this step's bucket events are in the timeline
  std::vector<Event> ready_, start_, end_;  // per bucket
  Event backward_end_, comm_done_;
};

}  // namespace

namespace detail {

// The Allreduce must queue on ctx.comm_stream: make_allreduce builds the device kinds on the
// communication stream of the Context it is given, which must be this one.
std::unique_ptr<GradSync> make_stream_grad_sync(float* grads, std::vector<Bucket> buckets,
                                                Allreduce& allreduce, bool overlap,
                                                const Context& ctx) {
  RINGTRAIN_CHECK(
      ctx.device == Device::kCuda && ctx.stream != nullptr && ctx.comm_stream != nullptr,
      "the stream GradSync needs a CUDA context with both streams");
  RINGTRAIN_CHECK(device_of(allreduce.kind()) == Device::kCuda,
                  "the stream GradSync averages device gradients; the {} allreduce takes host "
                  "memory",
                  to_string(allreduce.kind()));
  return std::make_unique<StreamGradSync>(grads, std::move(buckets), allreduce, overlap, ctx);
}

}  // namespace detail

}  // namespace ringtrain
