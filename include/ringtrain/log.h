// Logging: spdlog with the rank in every line, so interleaved output from many ranks can be
// told apart. Progress goes through the rank-0 helpers; other ranks log warnings and errors.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace ringtrain {

// Sets the default logger's pattern to "[time] [rank R] [level] message" and its level
// ("trace", "debug", "info", "warn", "error"); throws naming --log-level for an unknown level.
void setup_logging(int rank, const std::string& level);

}  // namespace ringtrain
