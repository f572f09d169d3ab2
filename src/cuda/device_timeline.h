// --timeline on the GPU (internal to src/cuda/): a CUDA event's host time. The device step
// records an anchor event just before a host wait it already does, and reads the host clock
// just after the wait returns (Timeline::set_device_anchor); any event recorded before the
// anchor happened cudaEventElapsedTime(event, anchor) before it. The error is the wait's
// wake-up latency (microseconds), the same for every event of a step.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ringtrain/check.h"
#include "ringtrain/cuda_check.h"
#include "ringtrain/timeline.h"

namespace ringtrain {

// `event` (a timing event, completed, recorded before the anchor) on the host clock.
inline int64_t host_time_ns(cudaEvent_t event, const Timeline& timeline) {
  float before_anchor_ms = 0.0f;
  RINGTRAIN_CHECK_CUDA(cudaEventElapsedTime(&before_anchor_ms, event,
                                            static_cast<cudaEvent_t>(timeline.anchor_event())));
  return timeline.anchor_ns() - std::llround(static_cast<double>(before_anchor_ms) * 1e6);
}

}  // namespace ringtrain
