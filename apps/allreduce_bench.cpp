// allreduce_bench: nccl-tests' all_reduce_perf for ringtrain's ring allreduce and the library's
// MPI_Allreduce, under mpirun, with nccl-tests' flags (-b -e -f -n -w -c) and table
// (size count type redop | time algbw busbw #wrong).
//
// Every backend is an Allreduce built by make_allreduce (allreduce.h), as the trainer builds its
// own. --device cuda (GPU build) runs on device memory, one GPU per rank (the local rank's, a
// DeviceSession): ring is the ring over NCCL send/recv (ring_allreduce_device on NcclComm), nccl
// is ncclAllReduce, and staged is the host-staged ring (copy down, the ring over MPI, copy
// back); both = ring + nccl. Each timed loop queues its allreduces on the communication stream
// and synchronises once at the end, as a training step would. When ranks share a GPU (more
// ranks on a node than visible GPUs), NCCL cannot run: ring falls back to staged, with a line
// saying why, and nccl is refused.
//
// Per size: time = (slowest rank's wall time for n back-to-back allreduces after a barrier) / n;
// algbw = size / time; busbw = algbw * 2(N-1)/N, the ring's per-rank traffic, so busbw is
// comparable across rank counts (0 for N = 1, where nothing moves). The buffer (and the ring's
// scratch) is allocated once at the largest size and reused. With --repeats R the timed loop
// runs R times per size and the row reports the median with the min-max spread, because this
// machine flips between fast and slow modes; with --backend both, ring and MPI alternate within
// each size (ring first on even repeats, MPI first on odd ones) so both see the same machine.
//
// A wrong result can never hide behind a fast one: with -c 1, before timing each size, every
// rank fills the buffer with integers that depend on its rank and the index, runs the op once
// and compares every element with the closed form (exactly for sum; within 1 ulp for avg); all
// ranks must also end with bit-identical buffers (a hash per rank, gathered). Any mismatch
// counts in #wrong, and the run exits 1.
#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ringtrain/allreduce.h"
#include "ringtrain/check.h"
#include "ringtrain/comm.h"
#include "ringtrain/context.h"
#include "ringtrain/device_session.h"
#include "ringtrain/gpu.h"
#include "ringtrain/gpu_context.h"
#include "ringtrain/log.h"
#include "ringtrain/mpi_comm.h"
#include "ringtrain/report.h"
#include "ringtrain/ring.h"
#include "ringtrain/tensor.h"

namespace {

using namespace ringtrain;

// A bad flag value: every rank sees the same flags, so every rank throws it, rank 0 explains,
// and all exit 2 without aborting the job.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string min_bytes = "4K";
  std::string max_bytes = "256M";
  std::string step_factor = "2";
  int iters = 20;
  int warmup_iters = 5;
  int check = 1;
  std::string op = "sum";
  std::string backend = "ring";
  std::string device = "cpu";
  size_t segment_kb = RingOptions{}.segment_elements * sizeof(float) / 1024;
  int window = RingOptions{}.window;
  int spin_us = -1;  // -1: MpiComm's own default
  int repeats = 1;
  std::string csv;
  std::string log_level = "info";
};

enum class Backend { kRing, kMpi, kNccl, kStaged };
constexpr int kBackends = 4;
const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::kRing:
      return "ring";
    case Backend::kMpi:
      return "mpi";
    case Backend::kNccl:
      return "nccl";
    case Backend::kStaged:
      return "staged";
  }
  return "?";
}
// The backends that run the ring (and so have a segment size and window).
bool runs_ring(Backend backend) {
  return backend == Backend::kRing || backend == Backend::kStaged;
}

// What to run, from validated options.
struct Plan {
  std::vector<uint64_t> sizes;  // bytes requested: min, min*f, ... <= max
  uint64_t min_bytes = 0, max_bytes = 0, factor = 0;
  ReduceOp op = ReduceOp::kSum;
  std::vector<Backend> backends;
  bool cuda = false;  // --device cuda
  RingOptions ring;
  int iters = 0, warmup_iters = 0, repeats = 0;
  bool check = true;
  int spin_us = -1;  // --spin-us; -1: the library's default
};

// Each count has a range no real run reaches, so that nothing computed from it can overflow:
// iterations and repeats up to a million (a row of a million calls already takes minutes); a
// window below MPI's smallest tag bound (32768: the segments in flight need distinct tags) and
// small enough that window x segment fits; a segment of at most 1 GiB, whose byte count fits
// MPI's int. -b, -e and -f are checked by parse_size and make_plan.
constexpr int kMaxIters = 1'000'000;
constexpr int kMaxSpinUs = 1'000'000;  // a second: longer is never a choice, only a typo
constexpr int kMaxWindow = 1024;
constexpr int kMaxSegmentKb = 1 << 20;

void add_flags(CLI::App& app, Options& o) {
  app.add_option("-b,--minbytes", o.min_bytes,
                 "Smallest size in bytes; K, M, G suffixes are powers of 1024")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "Largest size in bytes (inclusive), same suffixes")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", o.step_factor,
                 "Multiply the size by this from one row to the next (>= 2)")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed allreduces per measurement")
      ->check(CLI::Range(1, kMaxIters))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup_iters, "Untimed allreduces per size and backend")
      ->check(CLI::Range(0, kMaxIters))
      ->capture_default_str();
  app.add_option("-c,--check", o.check, "Check results against the closed form (0 or 1)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--op", o.op, "sum or avg")
      ->check(CLI::IsMember({"sum", "avg"}))
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 "ring (ring_allreduce), mpi (MPI_Allreduce) or both (interleaved at each size); "
                 "with --device cuda: ring (over NCCL send/recv), nccl (ncclAllReduce), staged "
                 "(host-staged ring) or both (ring and nccl)")
      ->check(CLI::IsMember({"ring", "mpi", "nccl", "staged", "both"}))
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "cpu (host memory, MPI) or cuda (device memory, one GPU per rank, NCCL)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--segment-kb", o.segment_kb,
                 "Ring segment size in KiB (RingOptions::segment_elements)")
      ->check(CLI::Range(1, kMaxSegmentKb))
      ->capture_default_str();
  app.add_option("--window", o.window, "Ring segments in flight each way (RingOptions::window)")
      ->check(CLI::Range(1, kMaxWindow))
      ->capture_default_str();
  app.add_option("--spin-us", o.spin_us,
                 "How long a wait polls without pause before it sleeps between polls, in us "
                 "(Comm::set_spin_before_sleep); 50 is how mnist_train's overlap thread waits. "
                 "Default: the library's own (1000)")
      ->check(CLI::Range(0, kMaxSpinUs));
  app.add_option("--repeats", o.repeats,
                 "Timed measurements per size; rows report the median and the min-max spread")
      ->check(CLI::Range(1, kMaxIters))
      ->capture_default_str();
  app.add_option("--csv", o.csv, "Also write one row per size and backend, all columns, here");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
}

// "4096", "4K", "32M", "1G" (powers of 1024, either case) -> bytes; the error names the flag.
uint64_t parse_size(const std::string& flag, const std::string& text) {
  const auto bad = [&](const char* why) {
    return UsageError(
        fmt::format("{} '{}': {} (a whole number with an optional K, M or G suffix, "
                    "powers of 1024)",
                    flag, text, why));
  };
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) throw bad("no number");
  uint64_t multiplier = 1;
  if (digits + 1 == text.size()) {
    switch (text.back()) {
      case 'k':
      case 'K':
        multiplier = uint64_t{1} << 10;
        break;
      case 'm':
      case 'M':
        multiplier = uint64_t{1} << 20;
        break;
      case 'g':
      case 'G':
        multiplier = uint64_t{1} << 30;
        break;
      default:
        throw bad("unknown suffix");
    }
  } else if (digits != text.size()) {
    throw bad(text.find('.') != std::string::npos ? "not a whole number" : "unknown suffix");
  }
  errno = 0;
  const unsigned long long value = std::strtoull(text.substr(0, digits).c_str(), nullptr, 10);
  if (errno == ERANGE || value > std::numeric_limits<uint64_t>::max() / multiplier) {
    throw bad("too large");
  }
  return value * multiplier;
}

Plan make_plan(const Options& o) {
  Plan plan;
  plan.min_bytes = parse_size("-b/--minbytes", o.min_bytes);
  plan.max_bytes = parse_size("-e/--maxbytes", o.max_bytes);
  plan.factor = parse_size("-f/--stepfactor", o.step_factor);
  if (plan.min_bytes < sizeof(float)) {
    throw UsageError(fmt::format("-b/--minbytes {}: the smallest size is {} bytes (one float)",
                                 plan.min_bytes, sizeof(float)));
  }
  if (plan.min_bytes > plan.max_bytes) {
    throw UsageError(fmt::format("-b/--minbytes {} is larger than -e/--maxbytes {}", plan.min_bytes,
                                 plan.max_bytes));
  }
  if (plan.factor < 2) {
    throw UsageError(fmt::format("-f/--stepfactor {}: must be at least 2", plan.factor));
  }
  constexpr uint64_t kMaxBytes = uint64_t{std::numeric_limits<int>::max()} * sizeof(float);
  if (plan.max_bytes > kMaxBytes) {
    throw UsageError(fmt::format("-e/--maxbytes {}: at most {} bytes (MPI counts are int)",
                                 plan.max_bytes, kMaxBytes));
  }
  for (uint64_t size = plan.min_bytes;;) {
    plan.sizes.push_back(size);
    if (size > plan.max_bytes / plan.factor) break;
    size *= plan.factor;
  }
  plan.op = parse_reduce_op(o.op);
  plan.cuda = o.device == "cuda";
  if (plan.cuda && !gpu_build()) {
    std::string why;
    visible_gpus(&why);
    throw UsageError(fmt::format("--device cuda: {}", why));
  }
  if (!plan.cuda && (o.backend == "nccl" || o.backend == "staged")) {
    throw UsageError(
        fmt::format("--backend {} runs on device memory: add --device cuda", o.backend));
  }
  if (plan.cuda && o.backend == "mpi") {
    throw UsageError("--backend mpi runs on host memory: use --device cpu (or --backend staged)");
  }
  if (o.backend == "ring" || o.backend == "both") plan.backends.push_back(Backend::kRing);
  if (o.backend == "mpi" || (o.backend == "both" && !plan.cuda))
    plan.backends.push_back(Backend::kMpi);
  if (o.backend == "nccl" || (o.backend == "both" && plan.cuda))
    plan.backends.push_back(Backend::kNccl);
  if (o.backend == "staged") plan.backends.push_back(Backend::kStaged);
  plan.ring.segment_elements = o.segment_kb * 1024 / sizeof(float);
  plan.ring.window = o.window;
  plan.iters = o.iters;
  plan.warmup_iters = o.warmup_iters;
  plan.repeats = o.repeats;
  plan.check = o.check == 1;
  plan.spin_us = o.spin_us;
  return plan;
}

// data[i] = (rank + 1) * (i % 97 + 1): integers, so every partial sum is exact in float.
constexpr size_t kPeriod = 97;
void fill_pattern(float* data, size_t count, int rank) {
  const auto scale = static_cast<float>(rank + 1);
  for (size_t base = 0; base < count; base += kPeriod) {
    const size_t end = std::min(count, base + kPeriod);
    for (size_t i = base; i < end; ++i) data[i] = scale * static_cast<float>(i - base + 1);
  }
}

// Floats as integers ordered like the floats, so that |a - b| counts ulps between them.
int64_t ordered_bits(float value) {
  const auto bits = std::bit_cast<int32_t>(value);
  return bits >= 0 ? int64_t{bits} : -int64_t{bits & 0x7fffffff};
}

// Elements of data[0, count) that differ from the closed form of the op over `ranks` ranks, by
// more than `avg_ulps` for an average (sums must be exact).
uint64_t count_mismatches(const float* data, size_t count, int ranks, ReduceOp op,
                          int64_t avg_ulps) {
  const double rank_sum = static_cast<double>(ranks) * (ranks + 1) / 2.0;  // sum of (rank + 1)
  float expected[kPeriod];
  for (size_t k = 0; k < kPeriod; ++k) {
    const auto sum = static_cast<float>(static_cast<double>(k + 1) * rank_sum);
    expected[k] = op == ReduceOp::kSum ? sum : sum / static_cast<float>(ranks);
  }
  const int64_t tolerance = op == ReduceOp::kSum ? 0 : avg_ulps;
  uint64_t wrong = 0;
  for (size_t base = 0; base < count; base += kPeriod) {
    const size_t end = std::min(count, base + kPeriod);
    for (size_t i = base; i < end; ++i) {
      const float got = data[i], want = expected[i - base];
      const bool ok =
          std::isfinite(got) && std::abs(ordered_bits(got) - ordered_bits(want)) <= tolerance;
      wrong += ok ? 0 : 1;
    }
  }
  return wrong;
}

// One Allreduce (allreduce.h) per backend, built by make_allreduce as the trainer builds its
// own: ring and mpi on the host are ring_allreduce and MPI_Allreduce over the MpiComm; on a
// GPU, ring is the ring over NCCL send/recv, nccl is ncclAllReduce, and staged is the
// host-staged ring. Indexed by Backend.
using AllreduceSet = std::array<std::unique_ptr<Allreduce>, kBackends>;

AllreduceConfig config_of(Backend backend, const Plan& plan, double timeout_s) {
  const bool library = backend == Backend::kMpi || backend == Backend::kNccl;
  return {.algorithm = library ? AllreduceAlgorithm::kLibrary : AllreduceAlgorithm::kRing,
          .device = plan.cuda ? Device::kCuda : Device::kCpu,
          .ring = plan.ring,
          .timeout_s = timeout_s,
          .host_staged = backend == Backend::kStaged};
}

// Builds plan.backends' Allreduces, each reserved for the largest size. On a GPU the factory
// decides, collectively, whether ranks share a GPU (more ranks on a node than visible GPUs,
// which NCCL refuses): then it makes the host-staged ring whatever was asked, so ring becomes
// staged (said once) and nccl is refused, with a UsageError on every rank alike.
AllreduceSet make_allreduces(MpiComm& comm, Plan& plan, const Context& ctx, size_t max_count) {
  AllreduceSet set;
  for (Backend& backend : plan.backends) {
    auto allreduce = make_allreduce(comm, config_of(backend, plan, comm.timeout()), ctx);
    if (allreduce->kind() == AllreduceKind::kStagedRing && backend != Backend::kStaged) {
      if (std::find(plan.backends.begin(), plan.backends.end(), Backend::kNccl) !=
          plan.backends.end()) {
        throw UsageError(
            "--backend nccl: ranks share a GPU (more ranks on a node than visible GPUs), which "
            "NCCL refuses; use --backend staged, or one rank per GPU");
      }
      backend = Backend::kStaged;
      if (comm.rank() == 0)
        spdlog::info("--backend ring runs host-staged (staged): ranks share a GPU");
    }
    allreduce->reserve(max_count);
    set[static_cast<size_t>(backend)] = std::move(allreduce);
  }
  return set;
}

// Where the buffer lives; each backend's Allreduce reduces it. The buffer (and every scratch)
// is allocated once, at the largest size.
class Target {
 public:
  explicit Target(AllreduceSet allreduces) : allreduces_(std::move(allreduces)) {}
  virtual ~Target() = default;
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  // Fills the buffer's first `count` elements with fill_pattern for this rank.
  virtual void fill(size_t count, int rank) = 0;
  // Runs (host) or queues (device) one allreduce of the buffer's first `count` elements.
  void allreduce(Backend backend, size_t count, ReduceOp op) {
    allreduces_[static_cast<size_t>(backend)]->run(data(), count, op);
  }
  // Returns when everything queued has completed (a no-op on the host).
  virtual void complete() = 0;
  // The first `count` elements on the host, after complete().
  virtual const float* result(size_t count) = 0;

 protected:
  virtual float* data() = 0;
  // On the way to abort_job: the NCCL communicators give up on their peers, so that nothing
  // freed after this waits for a stream that a dead peer holds.
  void abort_allreduces() noexcept {
    for (auto& allreduce : allreduces_) {
      if (allreduce) allreduce->abort();
    }
  }

 private:
  AllreduceSet allreduces_;
};

class HostTarget final : public Target {
 public:
  HostTarget(AllreduceSet allreduces, size_t max_count) : Target(std::move(allreduces)) {
    try {
      buffer_.resize(max_count);
    } catch (const std::bad_alloc&) {
      RINGTRAIN_FAIL("cannot allocate {} bytes for -e/--maxbytes", max_count * sizeof(float));
    }
  }
  void fill(size_t count, int rank) override { fill_pattern(buffer_.data(), count, rank); }
  void complete() override {}
  const float* result(size_t) override { return buffer_.data(); }

 private:
  float* data() override { return buffer_.data(); }
  std::vector<float> buffer_;
};

// Device memory on the rank's GPU (the DeviceSession's), filled and read back through the
// communication stream, on which every device Allreduce queues its work.
class DeviceTarget final : public Target {
 public:
  DeviceTarget(AllreduceSet allreduces, MpiComm& comm, const Context& ctx, size_t max_count)
      : Target(std::move(allreduces)), comm_(comm), stream_(ctx.comm_stream), host_(max_count) {
    const size_t elements = std::max<size_t>(max_count, 1);
    try {
      data_ = Tensor(Shape{static_cast<int64_t>(elements)}, Device::kCuda);
    } catch (const std::exception& error) {
      RINGTRAIN_FAIL("cannot allocate {} bytes of device memory for -e/--maxbytes: {}",
                     elements * sizeof(float), error.what());
    }
  }
  ~DeviceTarget() override {
    if (std::uncaught_exceptions() > 0) abort_allreduces();
  }

  void fill(size_t count, int rank) override {
    fill_pattern(host_.data(), count, rank);
    // The host vector is pageable: this copy has left it when the call returns.
    copy_floats_async(data_.data(), Device::kCuda, host_.data(), Device::kCpu,
                      static_cast<int64_t>(count), stream_);
  }
  // Polls the stream under the MpiComm's deadline, posted on its board: a peer that died
  // mid-collective is an error here, not a hang.
  void complete() override {
    wait_for_stream(stream_, &comm_.board(), "the communication stream", comm_.timeout());
  }
  const float* result(size_t count) override {
    copy_floats_async(host_.data(), Device::kCpu, data_.data(), Device::kCuda,
                      static_cast<int64_t>(count), stream_);
    complete();
    return host_.data();
  }

 private:
  float* data() override { return data_.data(); }

  MpiComm& comm_;
  StreamHandle stream_;  // the communication stream
  std::vector<float> host_;
  Tensor data_;
};

// One checked allreduce of `count` elements; returns #wrong summed over ranks (the same on all):
// mismatched elements on every rank plus the ranks whose bits differ from rank 0's.
uint64_t check_once(Backend backend, MpiComm& comm, Target& target, size_t count, ReduceOp op) {
  target.fill(count, comm.rank());
  target.allreduce(backend, count, op);
  const float* data = target.result(count);
  // ncclAvg scales before it sums (floats): a few ulps from the closed form, not one.
  const int64_t avg_ulps = backend == Backend::kNccl ? comm.size() + 1 : 1;
  const uint64_t local = count_mismatches(data, count, comm.size(), op, avg_ulps);
  const auto hashes = allgather_value(comm, hash_bytes(data, count * sizeof(float)));
  const auto mismatches = allgather_value(comm, local);
  uint64_t wrong = 0;
  for (size_t r = 0; r < hashes.size(); ++r) {
    wrong += mismatches[r] + (hashes[r] != hashes[0] ? 1 : 0);
    if (hashes[r] != hashes[0] && comm.rank() == 0) {
      spdlog::error("{} allreduce of {} elements: rank {} holds different bits from rank 0",
                    to_string(backend), count, r);
    }
  }
  return wrong;
}

// Seconds per allreduce: the slowest rank's time for `iters` back-to-back calls, / iters. On a
// device the calls are queued and the clock stops once the last has completed.
double time_iterations(Backend backend, MpiComm& comm, Target& target, size_t count, ReduceOp op,
                       int iters) {
  target.complete();
  comm.barrier();
  const double start = MPI_Wtime();
  for (int i = 0; i < iters; ++i) target.allreduce(backend, count, op);
  target.complete();
  const double elapsed = MPI_Wtime() - start;
  const auto all = allgather_value(comm, elapsed);
  return *std::max_element(all.begin(), all.end()) / iters;
}

struct Row {
  uint64_t bytes = 0;
  size_t count = 0;
  Backend backend = Backend::kRing;
  std::vector<double> seconds;  // one per repeat, per allreduce
  uint64_t wrong = 0;
};

// Fixed-width columns, nccl-tests style; headers and rows share these widths. The empty {}
// after redop is the backend column (Report::backend_cell).
constexpr const char* kRowFormat = "{:>12}  {:>12}  {:>6}  {:>5}{}  {:>10}  {:>7}  {:>7}  {:>6}";
constexpr const char* kSpreadFormat = "  {:>10}  {:>10}  {:>7}  {:>7}";

class Report {
 public:
  Report(const Plan& plan, int ranks, bool show_backend, const std::string& csv_path)
      : plan_(plan), ranks_(ranks), show_backend_(show_backend) {
    if (csv_path.empty()) return;
    csv_.emplace(csv_path);
    RINGTRAIN_CHECK(csv_->good(), "--csv {}: cannot open for writing: {}", csv_path,
                    std::strerror(errno));
    *csv_ << "size_bytes,count,type,redop,backend,ranks,iters,warmup_iters,repeats,"
             "segment_elements,window,time_us,algbw_gbps,busbw_gbps,time_us_min,time_us_max,"
             "busbw_gbps_min,busbw_gbps_max,wrong,times_us\n";
  }

  void print_column_heads() const {
    std::string line1 = fmt::format(kRowFormat, "size", "count", "type", "redop",
                                    backend_cell("backend"), "time", "algbw", "busbw", "#wrong");
    std::string line2 = fmt::format(kRowFormat, "(B)", "(elements)", "", "", backend_cell(""),
                                    "(us)", "(GB/s)", "(GB/s)", "");
    if (plan_.repeats > 1) {
      line1 += fmt::format(kSpreadFormat, "time min", "time max", "bus min", "bus max");
      line2 += fmt::format(kSpreadFormat, "(us)", "(us)", "(GB/s)", "(GB/s)");
    }
    const auto trimmed = [](const std::string& line) {
      return line.substr(1, line.find_last_not_of(' '));
    };
    fmt::print("#{}\n#{}\n", trimmed(line1), trimmed(line2));
  }

  void add(const Row& row) {
    const double t = median(row.seconds);
    const double t_min = *std::min_element(row.seconds.begin(), row.seconds.end());
    const double t_max = *std::max_element(row.seconds.begin(), row.seconds.end());
    const double bus_med = busbw(row.bytes, t), bus_min = busbw(row.bytes, t_max),
                 bus_max = busbw(row.bytes, t_min);
    const char* op = to_string(plan_.op);
    std::string line = fmt::format(
        kRowFormat, row.bytes, row.count, "float", op, backend_cell(to_string(row.backend)),
        fmt::format("{:.2f}", t * 1e6), fmt::format("{:.2f}", algbw(row.bytes, t)),
        fmt::format("{:.2f}", bus_med), plan_.check ? fmt::format("{}", row.wrong) : "N/A");
    if (plan_.repeats > 1) {
      line += fmt::format(kSpreadFormat, fmt::format("{:.2f}", t_min * 1e6),
                          fmt::format("{:.2f}", t_max * 1e6), fmt::format("{:.2f}", bus_min),
                          fmt::format("{:.2f}", bus_max));
    }
    fmt::print("{}\n", line);
    std::fflush(stdout);
    bus_sums_[static_cast<int>(row.backend)] += bus_med;
    ++rows_[static_cast<int>(row.backend)];
    if (csv_) {
      std::string times;
      for (double s : row.seconds)
        times += fmt::format("{}{:.3f}", times.empty() ? "" : ";", s * 1e6);
      const bool ring = runs_ring(row.backend);
      *csv_ << fmt::format(
          "{},{},float,{},{},{},{},{},{},{},{},{:.3f},{:.4f},{:.4f},{:.3f},{:.3f},{:.4f},{:.4f},{},"
          "{}\n",
          row.bytes, row.count, op, to_string(row.backend), ranks_, plan_.iters, plan_.warmup_iters,
          plan_.repeats, ring ? fmt::format("{}", plan_.ring.segment_elements) : "",
          ring ? fmt::format("{}", plan_.ring.window) : "", t * 1e6, algbw(row.bytes, t), bus_med,
          t_min * 1e6, t_max * 1e6, bus_min, bus_max,
          plan_.check ? fmt::format("{}", row.wrong) : "", times);
      csv_->flush();
      RINGTRAIN_CHECK(csv_->good(), "--csv: writing failed: {}", std::strerror(errno));
    }
  }

  void print_averages() const {
    for (Backend backend : plan_.backends) {
      const int b = static_cast<int>(backend);
      fmt::print("# Avg bus bandwidth {:<4}: {:.3f} GB/s (mean of the rows' busbw)\n",
                 to_string(backend), rows_[b] > 0 ? bus_sums_[b] / rows_[b] : 0.0);
    }
  }

 private:
  // The backend column, present only when more than one backend runs.
  std::string backend_cell(const char* text) const {
    return show_backend_ ? fmt::format("  {:>7}", text) : std::string();
  }
  static double algbw(uint64_t bytes, double seconds) {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
  }
  double busbw(uint64_t bytes, double seconds) const {
    return algbw(bytes, seconds) * 2.0 * (ranks_ - 1) / ranks_;
  }

  const Plan& plan_;
  int ranks_;
  bool show_backend_;
  std::optional<std::ofstream> csv_;
  double bus_sums_[kBackends] = {};
  int rows_[kBackends] = {};
};

std::string command_line(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool quote = arg.empty() || arg.find_first_of(" \t'\"$") != std::string::npos;
    line += (i == 0 ? "" : " ") + (quote ? "'" + arg + "'" : arg);
  }
  return line;
}

struct RankInfo {
  int pid = 0;
  char host[64] = {};
};

void print_preamble(MpiComm& comm, const Plan& plan, const std::string& command) {
  RankInfo mine;
  mine.pid = static_cast<int>(getpid());
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_length = 0;
  RINGTRAIN_CHECK_MPI(MPI_Get_processor_name(host, &host_length));
  std::memcpy(mine.host, host, std::min(sizeof(mine.host) - 1, std::strlen(host)));
  const auto ranks = allgather_value(comm, mine);
  if (comm.rank() != 0) return;

  char library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int library_length = 0;
  RINGTRAIN_CHECK_MPI(MPI_Get_library_version(library, &library_length));
  std::string library_line(library, static_cast<size_t>(library_length));
  library_line = library_line.substr(0, library_line.find_first_of(",\n"));

  const int n = comm.size();
  fmt::print("# {}\n", command);
  fmt::print("# ranks {}, {}\n", n, library_line);
  for (int r = 0; r < n; ++r) {
    fmt::print("#  rank {:>3}  pid {:>7}  on {}\n", r, ranks[r].pid, ranks[r].host);
  }
  fmt::print(
      "# minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} repeats: {} "
      "validation: {}\n",
      plan.min_bytes, plan.max_bytes, plan.factor, plan.warmup_iters, plan.iters, plan.repeats,
      plan.check ? 1 : 0);
  if (plan.cuda) {
    fmt::print("# device: cuda, device memory on the local rank's GPU; NCCL {}\n", nccl_version());
  }
  if (plan.spin_us >= 0)
    fmt::print("# waits: poll without pause for {} us, then sleep between polls (--spin-us)\n",
               plan.spin_us);
  const std::string segments =
      fmt::format("segments of {} elements ({} KiB), window {}", plan.ring.segment_elements,
                  plan.ring.segment_elements * sizeof(float) / 1024, plan.ring.window);
  for (Backend backend : plan.backends) {
    switch (backend) {
      case Backend::kRing:
        if (plan.cuda) {
          fmt::print("# ring: ring_allreduce_device over NCCL send/recv groups, {}\n", segments);
        } else {
          fmt::print("# ring: ring_allreduce, {}\n", segments);
        }
        break;
      case Backend::kMpi:
        fmt::print("# mpi: MPI_Allreduce (Comm::allreduce_library)\n");
        break;
      case Backend::kNccl:
        fmt::print("# nccl: ncclAllReduce (NcclComm::allreduce_library)\n");
        break;
      case Backend::kStaged:
        fmt::print("# staged: copy to pinned host memory, ring_allreduce over MPI, copy back, {}\n",
                   segments);
        break;
    }
  }
  if (plan.backends.size() > 1) {
    fmt::print(
        "# backends alternate within each size: {} first on even repeats, {} first on "
        "odd ones\n",
        to_string(plan.backends.front()), to_string(plan.backends.back()));
  }
  fmt::print("# time: slowest rank's time for {} back-to-back allreduces, / {}{}\n", plan.iters,
             plan.iters,
             plan.repeats > 1 ? fmt::format("; median of {} measurements, min and max at the right",
                                            plan.repeats)
                              : "");
  fmt::print("# algbw = size / time; busbw = algbw * 2(N-1)/N = algbw * {:.3f}{}\n",
             2.0 * (n - 1) / n, n == 1 ? " (0 for one rank: nothing moves)" : "");
  if (plan.check) {
    fmt::print(
        "# #wrong: elements differing from the closed form ({}), summed over ranks, plus "
        "ranks whose bits differ from rank 0's\n",
        plan.op == ReduceOp::kSum ? "exact"
        : plan.cuda               ? "within 1 ulp; ncclAvg within N+1"
                                  : "within 1 ulp");
  }
  fmt::print("#\n");
}

// For --device cuda: every rank must see a GPU (collective, so that every rank throws the
// same UsageError). Whether ranks share one is the device Allreduce factory's decision
// (make_allreduces).
void check_gpus(MpiComm& comm, const Plan& plan) {
  if (!plan.cuda) return;
  std::string why;
  const int gpus = visible_gpus(&why);
  const auto all = allgather_value(comm, gpus);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 0) {
      throw UsageError(fmt::format("--device cuda: rank {} sees no GPU{}{}", r,
                                   r == static_cast<size_t>(comm.rank()) ? ": " : "",
                                   r == static_cast<size_t>(comm.rank()) ? why : ""));
    }
  }
}

// A bad flag value, or a configuration the machine cannot run: rank 0 explains, and every rank
// exits 2.
int usage_failure(MpiComm& comm, const std::exception& error) {
  if (comm.rank() == 0) {
    fmt::print(stderr, "allreduce_bench: {}\nRun with --help for more information.\n",
               error.what());
  }
  return 2;
}

int run(MpiComm& comm, Plan& plan, const Options& options, const std::string& command) {
  const int rank = comm.rank();
  const size_t max_count = plan.max_bytes / sizeof(float);
  // The local rank's GPU (local rank modulo the visible GPUs, as the trainer picks it).
  DeviceSession session(plan.cuda ? choose_device("cuda", comm.local_rank(), comm.local_size())
                                  : DeviceChoice{});
  AllreduceSet allreduces;
  try {
    allreduces = make_allreduces(comm, plan, session.context(), max_count);
  } catch (const UsageError& error) {
    // The same on every rank: the factory's choice is collective.
    return usage_failure(comm, error);
  }
  std::unique_ptr<Target> target;
  if (plan.cuda) {
    target =
        std::make_unique<DeviceTarget>(std::move(allreduces), comm, session.context(), max_count);
  } else {
    target = std::make_unique<HostTarget>(std::move(allreduces), max_count);
  }

  std::optional<Report> report;
  if (rank == 0) report.emplace(plan, comm.size(), plan.backends.size() > 1, options.csv);
  print_preamble(comm, plan, command);
  if (report) report->print_column_heads();

  uint64_t total_wrong = 0;
  for (uint64_t requested : plan.sizes) {
    const size_t count = requested / sizeof(float);
    std::vector<Row> rows;
    for (Backend backend : plan.backends) {
      Row row{.bytes = count * sizeof(float), .count = count, .backend = backend};
      if (plan.check) {
        row.wrong = check_once(backend, comm, *target, count, plan.op);
        total_wrong += row.wrong;
      }
      rows.push_back(row);
    }
    for (Backend backend : plan.backends) {
      target->fill(count, rank);
      spdlog::debug("{} bytes {}: {} warmup iterations", count * sizeof(float), to_string(backend),
                    plan.warmup_iters);
      for (int i = 0; i < plan.warmup_iters; ++i) target->allreduce(backend, count, plan.op);
      target->complete();
    }
    for (int repeat = 0; repeat < plan.repeats; ++repeat) {
      for (size_t k = 0; k < rows.size(); ++k) {
        // Alternate the order so that neither backend always runs right after the other.
        Row& row = rows[repeat % 2 == 0 ? k : rows.size() - 1 - k];
        target->fill(count, rank);  // sums grow N-fold per call; restart from small values
        row.seconds.push_back(
            time_iterations(row.backend, comm, *target, count, plan.op, plan.iters));
      }
    }
    if (report) {
      for (const Row& row : rows) report->add(row);
    }
  }

  if (report) {
    report->print_averages();
    if (total_wrong > 0) {
      fmt::print("# ERROR: {} wrong result(s) (see #wrong): the allreduce is broken\n",
                 total_wrong);
      std::fflush(stdout);
    }
  }
  if (total_wrong > 0) {
    if (rank == 0)
      spdlog::error("{} wrong result(s) in the check (-c 1); exit status 1", total_wrong);
    return 1;
  }
  return 0;
}

// Everything after MPI_Init: parse, validate, run. Usage errors return 2 on every rank; any
// other failure, which may hit one rank only, ends the whole job.
int bench_main(int argc, char** argv) {
  try {
    MpiComm comm;
    CLI::App app{"ringtrain allreduce_bench: ring allreduce vs MPI_Allreduce, nccl-tests style"};
    Options options;
    add_flags(app, options);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
      // --help exits 0; every flag error exits 2, as make_plan's do (CLI11's own codes vary).
      const int code = comm.rank() == 0 ? app.exit(error) : error.get_exit_code();
      return code == 0 ? 0 : 2;
    }
    std::optional<Plan> plan;
    try {
      setup_logging(comm.rank(), options.log_level);
      plan = make_plan(options);
      check_gpus(comm, *plan);
    } catch (const std::exception& error) {  // UsageError, or the flag checks of the library
      return usage_failure(comm, error);
    }
    if (plan->spin_us >= 0) comm.set_spin_before_sleep(std::chrono::microseconds(plan->spin_us));
    return run(comm, *plan, options, command_line(argc, argv));
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    std::fflush(stdout);
    MpiSession::abort_job(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<MpiSession> session;
  try {
    session.emplace(&argc, &argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "allreduce_bench: MPI start-up failed: {}\n", error.what());
    return 1;
  }
  return bench_main(argc, argv);
}
