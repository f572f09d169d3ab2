// spdlog set-up with the rank in every line.
#include "ringtrain/log.h"

#include <fmt/format.h>

#include "ringtrain/check.h"

namespace ringtrain {

void setup_logging(int rank, const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  RINGTRAIN_CHECK(parsed != spdlog::level::off || level == "off",
                  "--log-level '{}' is unknown: use trace, debug, info, warn, error or off", level);
  spdlog::set_level(parsed);
  spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
}

}  // namespace ringtrain
