// Allreduce: average or sum one buffer of floats where it lives, the same bits on every rank.
// The one object behind every averaging in ringtrain (the gradient buckets of GradSync, local
// SGD's parameter averages, allreduce_bench), chosen once from the configuration by
// make_allreduce and identical on every rank:
//
// clang-format off
//   kind                   memory  what runs                                   made when
//   ring over MPI          host    ring_allreduce (ring.h) over the host Comm  cpu, --allreduce ring
//     ... on a 16-bit wire host    ring_allreduce_wire (ring.h, wire.h)        cpu, ring, --grad-wire
//   MPI_Allreduce          host    Comm::allreduce_library                     cpu, --allreduce mpi
//   ring over NCCL         device  ring_allreduce_device over NcclComm         gpu, ring, own GPUs
//   ncclAllReduce          device  NcclComm::allreduce_library                 gpu, mpi, own GPUs
//   host-staged ring       device  pinned host copy, ring over MPI, copy back  gpu, ranks share one
//   exact fixed-point ring host    ExactGradSum (exact_sum.h)                  --reproducible
// clang-format on
//
// The ring over MPI moves float32 by default; with AllreduceConfig::wire (--grad-wire) bf16 or
// fp16 it moves 16-bit values and keeps float32 partial sums (kind() stays kHostRing, wire()
// says which). fp16 first allgathers one exponent bound per rank and bucket to choose the
// bucket's scale; a bucket with a NaN or an infinity on any rank moves as float32 (every rank
// sees the same bounds, so every rank falls back alike). The other kinds move float32 only
// (make_allreduce refuses a 16-bit wire for them).
//
// Host kinds return with the result in place. Device kinds queue the work on the context's
// communication stream and return without waiting (the caller orders its streams with events).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ringtrain/comm.h"
#include "ringtrain/context.h"
#include "ringtrain/ring.h"
#include "ringtrain/wire.h"

namespace ringtrain {

// --allreduce: our ring, or the library's collective (MPI_Allreduce on the host, ncclAllReduce
// on a GPU).
enum class AllreduceAlgorithm { kRing, kLibrary };
// "ring" or "mpi" (the flag's historical name for the library's collective); anything else
// throws a usage Error naming --allreduce and the accepted values.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& flag);
const char* to_string(AllreduceAlgorithm algorithm);  // "ring", "mpi"

enum class AllreduceKind {
  kHostRing,
  kHostLibrary,
  kDeviceRing,
  kDeviceLibrary,
  kStagedRing,
  kExactRing,  // --reproducible: fixed-point sums over the host ring (exact_sum.h)
};
// "ring over MPI", "MPI_Allreduce", "ring over NCCL", "ncclAllReduce", "host-staged ring",
// "exact fixed-point ring"
const char* to_string(AllreduceKind kind);
Device device_of(AllreduceKind kind);  // where the buffers it takes live

class Allreduce {
 public:
  virtual ~Allreduce() = default;
  // In place on `count` floats at `data` (in the memory device_of(kind()) names). Every rank
  // calls it with the same count, in the same order.
  virtual void run(float* data, size_t count, ReduceOp op) = 0;
  virtual AllreduceKind kind() const = 0;
  // Grows the scratch for buffers of up to `count` floats now, so that run() never allocates.
  virtual void reserve(size_t count) { (void)count; }
  // Device kinds over NCCL: aborts the communicator, so that transfers whose peer will never
  // join end and freeing device memory cannot hang. Never throws; a no-op elsewhere.
  virtual void abort() noexcept {}
  // Ranks of the collective.
  virtual int size() const = 0;
  // What the ring puts on the wire (--grad-wire); float32 for every kind but the ring over MPI.
  virtual GradWire wire() const { return GradWire::kFp32; }
  // What this rank has sent since it was made, counted by the kinds whose sends are ours (the
  // ring over MPI); the library collectives' own algorithms are not counted (bytes_sent -1).
  struct Tally {
    int64_t bytes_sent = -1;     // ring payload (with the 16-bit wire's pads) and bounds
    int64_t runs = 0;            // run() calls
    int64_t fp32_fallbacks = 0;  // fp16 buckets sent as float32 (a NaN or an infinity)
    double bound_scan_ms = 0.0;  // fp16: computing this rank's bucket bounds
    // fp16: allgathering them; it includes waiting for the slowest rank to arrive, which the
    // ring's first receive would otherwise wait.
    double bound_exchange_ms = 0.0;
    // What was counted since `earlier` (a count of -1, not counted, stays -1).
    Tally since(const Tally& earlier) const {
      if (bytes_sent < 0) return *this;
      return {.bytes_sent = bytes_sent - earlier.bytes_sent,
              .runs = runs - earlier.runs,
              .fp32_fallbacks = fp32_fallbacks - earlier.fp32_fallbacks,
              .bound_scan_ms = bound_scan_ms - earlier.bound_scan_ms,
              .bound_exchange_ms = bound_exchange_ms - earlier.bound_exchange_ms};
    }
  };
  // Safe to call from another thread than run()'s once that run() has returned.
  virtual Tally tally() const { return {}; }
};

struct AllreduceConfig {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing;
  Device device = Device::kCpu;  // where the buffers live (a Context's device)
  RingOptions ring;
  // The ring over MPI only: what it sends (wire.h). Other kinds take kFp32 only.
  GradWire wire = GradWire::kFp32;
  // Device kinds: how long a wait for the streams may go without progress (the host
  // transport's deadline is the natural value).
  double timeout_s = 90.0;
  // What each run() posts as the phase on the host communicator's progress board, for the
  // watchdog's reports ("gradient allreduce"); a string literal. Null: the caller's phase.
  const char* phase = nullptr;
  // Device kinds: the host-staged ring even where every rank has a GPU of its own (ranks that
  // share one get it whatever this says). Only allreduce_bench --backend staged wants it: a
  // trainer with its own GPUs is better served by NCCL.
  bool host_staged = false;
  // Host kinds, tests only: each run() first sleeps this long (a slowed transport, so that the
  // overlap tests can see communication hide behind backward).
  double test_delay_ms = 0.0;
};

// Collective over `host` (the job's host communicator: it runs the host kinds, bootstraps
// NCCL and decides, the same on every rank, whether ranks share a GPU). `ctx` gives the GPU and
// the communication stream for device kinds. A device kind in a build without the GPU path
// throws. The Allreduce keeps references to `host` (and the NCCL communicator it makes, if
// any): it must not outlive them.
std::unique_ptr<Allreduce> make_allreduce(Comm& host, const AllreduceConfig& config,
                                          const Context& ctx);

// Calls allreduce.abort() when the scope it guards is left by an exception: declared after
// everything that frees device memory, so that it runs first (see Allreduce::abort).
class AbortAllreduceOnError {
 public:
  explicit AbortAllreduceOnError(Allreduce* allreduce) noexcept;
  ~AbortAllreduceOnError();
  AbortAllreduceOnError(const AbortAllreduceOnError&) = delete;
  AbortAllreduceOnError& operator=(const AbortAllreduceOnError&) = delete;

 private:
  Allreduce* allreduce_;
  int exceptions_at_start_;
};

namespace detail {
// The device kinds (src/cuda/device_allreduce.cpp; the CPU-only build's stub throws).
std::unique_ptr<Allreduce> make_device_allreduce(Comm& host, const AllreduceConfig& config,
                                                 const Context& ctx);
}  // namespace detail

}  // namespace ringtrain
