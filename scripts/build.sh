#!/usr/bin/env bash
# Configures and builds ringtrain (Release) in $BUILD_DIR (default: build/ in the repository).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$repo/build}
jobs=${JOBS:-$(nproc)}
mkdir -p "$build_dir"
cmake -S "$repo" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >"$build_dir/configure.log" 2>&1 \
  || { cat "$build_dir/configure.log"; echo "build: cmake configure failed (log above)" >&2; exit 1; }
grep "ringtrain:" "$build_dir/configure.log" || true
cmake --build "$build_dir" -j "$jobs"
