// CPU thread settings for the math libraries.
#include "ringtrain/context.h"

#include <Eigen/Core>

#include "ringtrain/check.h"

namespace ringtrain {

void set_cpu_threads(int threads) {
  RINGTRAIN_CHECK(threads >= 1, "--threads must be at least 1, got {}", threads);
  Eigen::setNbThreads(threads);
}

}  // namespace ringtrain
