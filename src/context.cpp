// CPU thread settings for the math libraries, the --device decision and the --conv-impl names.
#include "ringtrain/context.h"

#include <fmt/format.h>
#include <Eigen/Core>

#include "ringtrain/check.h"
#include "ringtrain/gpu.h"

namespace ringtrain {

const char* to_string(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

const char* to_string(ConvImpl impl) {
  return impl == ConvImpl::kCudnn ? "cudnn" : "direct";
}

ConvImpl parse_conv_impl(const std::string& flag) {
  if (flag == "direct") return ConvImpl::kDirect;
  if (flag == "cudnn") return ConvImpl::kCudnn;
  RINGTRAIN_FAIL("--conv-impl must be one of direct, cudnn; got '{}'", flag);
}

void set_cpu_threads(int threads) {
  RINGTRAIN_CHECK(threads >= 1, "--threads must be at least 1, got {}", threads);
  Eigen::setNbThreads(threads);
}

void fix_cpu_gemm_blocking() {
  // Eigen sizes its GEMM blocks from the cache sizes it reads off the CPU at start-up, and the
  // block depth decides how each dot product's sum is split: another CPU, other bits. These
  // are Zen 4's (32 KiB L1d, 1 MiB L2, 32 MiB L3), a fair size for any current x86-64 core.
  Eigen::setCpuCacheSizes(32 * 1024, 1024 * 1024, 32 * 1024 * 1024);
}

DeviceChoice choose_device(const std::string& flag, int local_rank, int local_size) {
  RINGTRAIN_CHECK(flag == "cpu" || flag == "cuda" || flag == "auto",
                  "--device must be one of cpu, cuda, auto; got '{}'", flag);
  DeviceChoice choice;
  if (flag == "cpu") {
    choice.why = "--device cpu";
    return choice;
  }
  std::string reason;
  const int gpus = visible_gpus(&reason);
  if (gpus == 0) {
    RINGTRAIN_CHECK(flag != "cuda", "--device cuda: no usable GPU: {}; use --device cpu or auto",
                    reason);
    choice.why = fmt::format("--device auto: cpu, because {}", reason);
    return choice;
  }
  RINGTRAIN_CHECK(local_rank >= 0, "local rank {} is negative", local_rank);
  choice.device = Device::kCuda;
  choice.gpu = local_rank % gpus;
  choice.why =
      fmt::format("--device {}: GPU {} of {} visible, chosen by local rank {} of {}{}", flag,
                  choice.gpu, gpus, local_rank, local_size,
                  local_size > gpus ? " (more ranks than GPUs on this node: they share)" : "");
  return choice;
}

}  // namespace ringtrain
