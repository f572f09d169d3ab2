// Formatting of check failures: "[file:line] message".
#include "ringtrain/check.h"

#include <string_view>

namespace ringtrain::detail {

namespace {
// __FILE__ is absolute under CMake; keep the part from the repository's own folders on.
std::string_view short_path(std::string_view path) {
  for (std::string_view anchor : {"/src/", "/include/", "/apps/", "/tests/", "/kernels/"}) {
    if (auto pos = path.rfind(anchor); pos != std::string_view::npos) return path.substr(pos + 1);
  }
  return path;
}
}  // namespace

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(fmt::format("[{}:{}] {}", short_path(file), line, message));
}

}  // namespace ringtrain::detail
