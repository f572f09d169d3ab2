// ringtrain::Error and the check macros. A failed check throws an Error whose message starts
// with "[file:line]" so that a log line points at the code that noticed the problem; main()
// catches it, logs it with the rank and ends the job. Library-specific checks (MPI, CUDA,
// cuBLAS, cuDNN, NCCL) join this file as those libraries arrive, all throwing the same type.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace ringtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
