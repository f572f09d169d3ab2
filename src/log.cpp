// spdlog set-up with the rank in every line.
#include "ringtrain/log.h"

#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

#include "ringtrain/check.h"

namespace ringtrain {

void setup_logging(int rank, const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  RINGTRAIN_CHECK(parsed != spdlog::level::off || level == "off",
                  "--log-level '{}' is unknown: use trace, debug, info, warn, error or off", level);
  spdlog::set_level(parsed);
  // Colour only on a terminal of our own: under mpirun stdout is a pseudo-terminal even when
  // the job's output goes to a file, so escape codes would land in logs and grep patterns.
  const bool under_launcher = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                              std::getenv("PMI_RANK") != nullptr ||
                              std::getenv("PMIX_RANK") != nullptr;
  const bool colour =
      !under_launcher && ::isatty(STDOUT_FILENO) && std::getenv("NO_COLOR") == nullptr;
  spdlog::set_pattern(
      fmt::format("[%H:%M:%S.%e] [rank {}] [{}] %v", rank, colour ? "%^%l%$" : "%l"));
}

}  // namespace ringtrain
