// Opening the device a rank computes on (see device_session.h).
#include "ringtrain/device_session.h"

#include "ringtrain/check.h"

#ifdef RINGTRAIN_HAVE_GPU
#include "ringtrain/gpu_context.h"
#endif

namespace ringtrain {

#ifdef RINGTRAIN_HAVE_GPU
struct DeviceSession::Gpu {
  explicit Gpu(int ordinal) : context(ordinal) {}
  GpuContext context;
};
#else
struct DeviceSession::Gpu {};
#endif

DeviceSession::DeviceSession(const DeviceChoice& choice) : description_("cpu") {
  if (choice.device != Device::kCuda) return;
#ifdef RINGTRAIN_HAVE_GPU
  gpu_ = std::make_unique<Gpu>(choice.gpu);
  ctx_ = gpu_->context.context();
  description_ = gpu_->context.describe();
#else
  RINGTRAIN_FAIL(
      "the cuda device needs the GPU path, which this build lacks (configured without CUDA, "
      "cuDNN or NCCL): use --device cpu");
#endif
}

DeviceSession::~DeviceSession() = default;

void DeviceSession::synchronize() {
#ifdef RINGTRAIN_HAVE_GPU
  if (gpu_) gpu_->context.synchronize();
#endif
}

}  // namespace ringtrain
