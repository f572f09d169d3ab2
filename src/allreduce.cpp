// The host kinds of Allreduce and the factory that chooses a kind once (see allreduce.h).
#include "ringtrain/allreduce.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "ringtrain/check.h"
#include "ringtrain/exact_sum.h"

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

// Host memory over the host transport: our ring (on a float32 or 16-bit wire), or the
// library's collective.
class HostAllreduce final : public Allreduce {
 public:
  HostAllreduce(Comm& comm, const AllreduceConfig& config)
      : comm_(comm),
        kind_(config.algorithm == AllreduceAlgorithm::kRing ? AllreduceKind::kHostRing
                                                            : AllreduceKind::kHostLibrary),
        ring_(config.ring),
        wire_(config.wire),
        phase_(config.phase),
        delay_ms_(config.test_delay_ms),
        bounds_(static_cast<size_t>(comm.size())) {
    check_ring_options(ring_);
    RINGTRAIN_CHECK(wire_ == GradWire::kFp32 || kind_ == AllreduceKind::kHostRing,
                    "a {} wire needs the ring (--allreduce ring): MPI_Allreduce moves float32",
                    to_string(wire_));
  }

  void run(float* data, size_t count, ReduceOp op) override {
    if (phase_ != nullptr) comm_.board().set_phase(phase_);
    if (delay_ms_ > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms_));
    runs_.fetch_add(1, std::memory_order_relaxed);
    if (kind_ == AllreduceKind::kHostLibrary) {
      comm_.allreduce_library(data, count, op);
      return;
    }
    if (wire_ == GradWire::kFp32 || comm_.size() == 1) {
      run_fp32(data, count, op);
      return;
    }
    WireExponents exponents;  // bf16: float32's exponent range, no scale
    if (wire_ == GradWire::kFp16) {
      exponents = agree_fp16_exponents(data, count, op);
      if (!exponents.fits) {
        fallbacks_.fetch_add(1, std::memory_order_relaxed);
        run_fp32(data, count, op);
        return;
      }
    }
    count_bytes(ring_allreduce_wire(comm_, data, count, op, wire_, exponents, scratch_, ring_));
  }
  AllreduceKind kind() const override { return kind_; }
  void reserve(size_t count) override {
    if (kind_ != AllreduceKind::kHostRing || comm_.size() == 1) return;
    reserve_ring(scratch_, count, comm_.size(), ring_);
    if (wire_ != GradWire::kFp32) reserve_ring_wire(scratch_, count, comm_.size(), ring_);
  }
  int size() const override { return comm_.size(); }
  GradWire wire() const override { return wire_; }
  Tally tally() const override {
    return {
        .bytes_sent = kind_ == AllreduceKind::kHostRing ? bytes_.load(std::memory_order_relaxed)
                                                        : int64_t{-1},
        .runs = runs_.load(std::memory_order_relaxed),
        .fp32_fallbacks = fallbacks_.load(std::memory_order_relaxed),
        .bound_scan_ms = static_cast<double>(bound_scan_ns_.load(std::memory_order_relaxed)) / 1e6,
        .bound_exchange_ms =
            static_cast<double>(bound_exchange_ns_.load(std::memory_order_relaxed)) / 1e6};
  }

 private:
  void run_fp32(float* data, size_t count, ReduceOp op) {
    ring_allreduce(comm_, data, count, op, scratch_, ring_);
    count_bytes(ring_elements_sent(count, comm_.size(), comm_.rank()) * sizeof(float));
  }
  void count_bytes(size_t bytes) {
    bytes_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  }
  // fp16: every rank's exponent bound of the bucket, allgathered (one int each), so that all
  // choose the same scale, or all see the NaN or infinity and fall back to float32.
  WireExponents agree_fp16_exponents(const float* data, size_t count, ReduceOp op) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const int bound = exponent_bound({data, count});
    const auto scanned = Clock::now();
    comm_.allgather(&bound, bounds_.data(), sizeof(int));
    // kAllZeroBound is INT_MIN and kNonFiniteBound INT_MAX: the job's bound is the max.
    const int job_bound = *std::max_element(bounds_.begin(), bounds_.end());
    // Counted as a ring allgather would send them: N - 1 ints.
    count_bytes((bounds_.size() - 1) * sizeof(int));
    const auto nanoseconds = [](Clock::duration d) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    };
    bound_scan_ns_.fetch_add(nanoseconds(scanned - start), std::memory_order_relaxed);
    bound_exchange_ns_.fetch_add(nanoseconds(Clock::now() - scanned), std::memory_order_relaxed);
    return fp16_exponents(job_bound, comm_.size(), op == ReduceOp::kAvg);
  }

  Comm& comm_;
  AllreduceKind kind_;
  RingOptions ring_;
  GradWire wire_;
  const char* phase_;
  double delay_ms_;
  RingScratch scratch_;
  std::vector<int> bounds_;  // [ranks]: this bucket's exponent bound on each rank
  std::atomic<int64_t> bytes_{0}, runs_{0}, fallbacks_{0}, bound_scan_ns_{0}, bound_exchange_ns_{0};
};

}  // namespace

std::unique_ptr<Allreduce> make_allreduce(Comm& host, const AllreduceConfig& config,
                                          const Context& ctx) {
  if (config.device == Device::kCuda) {
    RINGTRAIN_CHECK(config.wire == GradWire::kFp32,
                    "the device ring moves fp32 only: a {} wire needs --device cpu",
                    to_string(config.wire));
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
