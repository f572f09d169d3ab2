// params_compare: are two saved parameter files (RTPARAMS, from --save-params) the same model?
// Used by dp_test.sh to check that N ranks with per-rank batch b train the same weights as one
// rank with batch N*b. The measure is max|a-b| / max|a|: relative to the largest weight, so a
// near-zero weight with a rounding-sized difference does not blow it up.
// Usage: params_compare A B [--rel-tol X] [--expect-identical]
// Exit 0: within tolerance (or bit-identical with --expect-identical); 1: not; 2: bad usage
// or a file that cannot be read.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "ringtrain/train.h"

namespace {

int usage(const char* message) {
  std::fprintf(stderr,
               "params_compare: %s\nusage: params_compare A B [--rel-tol X] [--expect-identical]\n",
               message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  double rel_tol = 1e-5;
  bool expect_identical = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--expect-identical") {
      expect_identical = true;
    } else if (arg == "--rel-tol") {
      if (i + 1 >= argc) return usage("--rel-tol needs a value");
      char* end = nullptr;
      rel_tol = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(rel_tol >= 0.0)) {
        return usage("--rel-tol needs a non-negative number");
      }
    } else if (arg.starts_with("--")) {
      return usage(("unknown flag " + arg).c_str());
    } else {
      files.push_back(arg);
    }
  }
  if (files.size() != 2) return usage("give exactly two parameter files");

  std::vector<float> a, b;
  try {
    a = ringtrain::load_params(files[0]);
    b = ringtrain::load_params(files[1]);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "params_compare: %s\n", error.what());
    return 2;
  }
  if (a.size() != b.size()) {
    std::printf("FAIL: %s holds %zu parameters but %s holds %zu\n", files[0].c_str(), a.size(),
                files[1].c_str(), b.size());
    return 1;
  }

  double max_diff = 0.0, max_abs = 0.0;
  size_t worst = 0, differing = 0;
  bool non_finite = false;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (!std::isfinite(x) || !std::isfinite(y)) non_finite = true;
    const double diff = std::fabs(x - y);
    if (diff > max_diff) {
      max_diff = diff;
      worst = i;
    }
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differing;
    max_abs = std::fmax(max_abs, std::fabs(x));
  }
  const double rel = max_abs > 0.0 ? max_diff / max_abs : (max_diff > 0.0 ? INFINITY : 0.0);
  std::printf(
      "%zu parameters: max |a-b| %.3e (at %zu), max |a| %.3e, relative %.3e, %zu differ "
      "bitwise\n",
      a.size(), max_diff, worst, max_abs, rel, differing);

  if (non_finite) {
    std::printf("FAIL: a parameter is NaN or infinite\n");
    return 1;
  }
  if (expect_identical) {
    if (differing != 0) {
      std::printf(
          "FAIL: expected bit-identical parameters, but %zu of %zu differ (max |a-b| %.3e)\n",
          differing, a.size(), max_diff);
      return 1;
    }
    return 0;
  }
  if (!(rel <= rel_tol)) {
    std::printf("FAIL: relative difference %.3e exceeds the tolerance %.3e\n", rel, rel_tol);
    return 1;
  }
  return 0;
}
