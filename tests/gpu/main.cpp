// The GPU tests' entry point: skips (exit 77, which ctest reports as skipped) when this
// process sees no GPU, saying why; otherwise runs the Catch2 session.
#define CATCH_CONFIG_RUNNER
#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

#include "ringtrain/gpu.h"

int main(int argc, char** argv) {
  std::string why;
  if (ringtrain::visible_gpus(&why) == 0) {
    std::printf("SKIPPED: no GPU visible to this process (%s); the GPU tests need one\n",
                why.c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
