// The failures the tests inject through the hidden --test-* flags (never set in real runs).
#pragma once

#include <cstdint>
#include <string>

#include "options.h"

namespace ringtrain::app {

// --test-stall-rank sleeps --test-stall-seconds `where` ("at step 5", "in set-up", ...).
void stall_for_test(const Options& o, int rank, const std::string& where);
// --test-fail-rank, --test-stall-rank, --test-slow-rank at the start of `step`.
void inject_test_failures(const Options& o, int rank, int64_t step);

}  // namespace ringtrain::app
