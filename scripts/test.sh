#!/usr/bin/env bash
# The test command: install the dependencies, build, run every test with ctest. Each test has
# a timeout (a hang is a failure); the exit status is ctest's.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/install_deps.sh"
"$repo/scripts/build.sh"
cd "${BUILD_DIR:-$repo/build}"
ctest --output-on-failure --timeout 600 -j "${JOBS:-$(nproc)}" "$@"
