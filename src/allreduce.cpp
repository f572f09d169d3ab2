// The host kinds of Allreduce and the factory that chooses a kind once (see allreduce.h).
#include "ringtrain/allreduce.h"

#include <chrono>
#include <exception>
#include <thread>

#include "ringtrain/check.h"

namespace ringtrain {

AllreduceAlgorithm parse_allreduce_algorithm(const std::string& flag) {
  if (flag == "ring") return AllreduceAlgorithm::kRing;
  if (flag == "mpi") return AllreduceAlgorithm::kLibrary;
  throw Error(fmt::format("--allreduce '{}' is unknown: use ring (ours) or mpi (the library's "
                          "collective: MPI_Allreduce, or ncclAllReduce on a GPU)",
                          flag),
              ExitCode::kUsage, /*on_every_rank=*/true);
}

const char* to_string(AllreduceAlgorithm algorithm) {
  return algorithm == AllreduceAlgorithm::kRing ? "ring" : "mpi";
}

const char* to_string(AllreduceKind kind) {
  switch (kind) {
    case AllreduceKind::kHostRing:
      return "ring over MPI";
    case AllreduceKind::kHostLibrary:
      return "MPI_Allreduce";
    case AllreduceKind::kDeviceRing:
      return "ring over NCCL";
    case AllreduceKind::kDeviceLibrary:
      return "ncclAllReduce";
    case AllreduceKind::kStagedRing:
      return "host-staged ring";
    case AllreduceKind::kExactRing:
      return "exact fixed-point ring";
  }
  return "?";
}

Device device_of(AllreduceKind kind) {
  return kind == AllreduceKind::kHostRing || kind == AllreduceKind::kHostLibrary ||
                 kind == AllreduceKind::kExactRing
             ? Device::kCpu
             : Device::kCuda;
}

namespace {

// Host memory over the host transport: our ring, or the library's collective.
class HostAllreduce final : public Allreduce {
 public:
  HostAllreduce(Comm& comm, const AllreduceConfig& config)
      : comm_(comm),
        kind_(config.algorithm == AllreduceAlgorithm::kRing ? AllreduceKind::kHostRing
                                                            : AllreduceKind::kHostLibrary),
        ring_(config.ring),
        phase_(config.phase),
        delay_ms_(config.test_delay_ms) {
    check_ring_options(ring_);
  }

  void run(float* data, size_t count, ReduceOp op) override {
    if (phase_ != nullptr) comm_.board().set_phase(phase_);
    if (delay_ms_ > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms_));
    if (kind_ == AllreduceKind::kHostRing) {
      ring_allreduce(comm_, data, count, op, scratch_, ring_);
    } else {
      comm_.allreduce_library(data, count, op);
    }
  }
  AllreduceKind kind() const override { return kind_; }
  void reserve(size_t count) override {
    if (kind_ == AllreduceKind::kHostRing && comm_.size() > 1)
      reserve_ring(scratch_, count, comm_.size(), ring_);
  }
  int size() const override { return comm_.size(); }

 private:
  Comm& comm_;
  AllreduceKind kind_;
  RingOptions ring_;
  const char* phase_;
  double delay_ms_;
  RingScratch scratch_;
};

}  // namespace

std::unique_ptr<Allreduce> make_allreduce(Comm& host, const AllreduceConfig& config,
                                          const Context& ctx) {
  if (config.device == Device::kCuda) {
    RINGTRAIN_CHECK(config.test_delay_ms == 0,
                    "--test-comm-delay-ms slows the host transport only; use --device cpu");
    return detail::make_device_allreduce(host, config, ctx);
  }
  return std::make_unique<HostAllreduce>(host, config);
}

AbortAllreduceOnError::AbortAllreduceOnError(Allreduce* allreduce) noexcept
    : allreduce_(allreduce), exceptions_at_start_(std::uncaught_exceptions()) {}

AbortAllreduceOnError::~AbortAllreduceOnError() {
  if (allreduce_ != nullptr && std::uncaught_exceptions() > exceptions_at_start_)
    allreduce_->abort();
}

}  // namespace ringtrain
