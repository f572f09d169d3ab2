// ringtrain::Error and the check macros. A failed check throws an Error whose message starts
// with "[file:line]" so that a log line points at the code that noticed the problem; main()
// catches it, logs it with the rank and ends the job. Library-specific checks (MPI, CUDA,
// cuBLAS, cuDNN, NCCL) join this file as those libraries arrive, all throwing the same type.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace ringtrain {

// The process exit status of mnist_train and the tools, by what went wrong (docs/failures.md).
enum class ExitCode : int {
  kOk = 0,
  kError = 1,        // anything else: a bug, an I/O error, a failed rank's exception
  kUsage = 2,        // a flag is missing, unknown or out of range
  kBadInput = 3,     // a data file, a checkpoint or the ranks' configurations are unusable
  kCommFailure = 4,  // a collective timed out (watchdog) or a peer failed
  kNonFinite = 5,    // --check-finite: too many consecutive steps with NaN/Inf
  kPreempted = 75,   // a signal asked the job to stop: checkpointed; resume me (EX_TEMPFAIL)
};

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  Error(const std::string& message, ExitCode code, bool on_every_rank = false)
      : std::runtime_error(message), code_(code), on_every_rank_(on_every_rank) {}
  ExitCode code() const { return code_; }
  // True when every rank raises this same error at the same point (a broadcast decision, a
  // configuration mismatch found by all): main() can then end normally on each rank instead of
  // aborting the job from one.
  bool on_every_rank() const { return on_every_rank_; }

 private:
  ExitCode code_ = ExitCode::kError;
  bool on_every_rank_ = false;
};

namespace detail {
// Builds "[src/file.cpp:42] message" (the path relative to the repository when it can tell).
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace ringtrain

// RINGTRAIN_CHECK(cond, "format {}", args...): throw ringtrain::Error when cond is false.
#define RINGTRAIN_CHECK(cond, ...)                                                      \
  do {                                                                                  \
    if (!(cond)) [[unlikely]]                                                           \
      ::ringtrain::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

// RINGTRAIN_FAIL("format {}", args...): throw unconditionally.
#define RINGTRAIN_FAIL(...) \
  ::ringtrain::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
