// What one rank computes on, opened once: a Context, and on a GPU the GpuContext that owns its
// device, streams and handles (gpu_context.h). In every build, so that callers need no #ifdef:
// the CPU-only build opens CPU sessions and refuses a CUDA choice.
#pragma once

#include <memory>
#include <string>

#include "ringtrain/context.h"

namespace ringtrain {

class DeviceSession {
 public:
  // A CPU choice: a CPU Context. A CUDA choice: opens choice.gpu (throws in a CPU-only build).
  explicit DeviceSession(const DeviceChoice& choice);
  ~DeviceSession();  // after every device tensor that used it: declare it before them
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  // The context to compute in; the caller may set its CPU fields (threads, conv_impl).
  Context& context() { return ctx_; }
  // "cpu" or the GPU's name, ordinal and memory, for the log.
  const std::string& description() const { return description_; }
  // Waits for every stream of the GPU (a no-op on the CPU).
  void synchronize();

 private:
  struct Gpu;  // the GpuContext, where there is one
  std::unique_ptr<Gpu> gpu_;
  Context ctx_;
  std::string description_;
};

}  // namespace ringtrain
