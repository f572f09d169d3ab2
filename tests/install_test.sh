#!/usr/bin/env bash
# ringtrain as a library, as a user meets it (docs/usage.md, "ringtrain as a library"):
# `cmake --install` into a scratch prefix; every installed header compiles on its own with
# ringtrain.pc's flags and names only installed headers; a tiny program builds and runs with
# `pkg-config --cflags --libs ringtrain` alone; examples/custom_model configures with
# find_package(ringtrain) from that prefix (and from nowhere else), builds, and trains at np 2
# under mpirun, printing its accuracy and that the replicas are identical.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR CXX MPIRUN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
build=$1 source=$2 cxx=$3 mpirun=$4 np_flag=$5
shift 5
mpi_flags=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "PASS: $*"; }

if ! cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1; then
  echo "FAIL: cmake --install: $(tail -n 20 "$work/install.log")"
  exit 1
fi
for f in include/ringtrain/train.h lib/libringtrain.a lib/cmake/ringtrain/ringtrainConfig.cmake \
  lib/cmake/ringtrain/ringtrainConfigVersion.cmake lib/cmake/ringtrain/ringtrainTargets.cmake \
  lib/pkgconfig/ringtrain.pc; do
  [ -f "$prefix/$f" ] || fail "cmake --install wrote no $f"
done

# ---- pkg-config: the flags resolve, and they are all a program needs ----
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
if ! pc_flags=$(pkg-config --cflags --libs ringtrain 2>&1); then
  fail "pkg-config --cflags --libs ringtrain: $pc_flags"
  pc_flags=""
else
  pass "pkg-config resolves ringtrain: $pc_flags"
fi
read -r -a pc_cflags <<<"$(pkg-config --cflags ringtrain 2>/dev/null)"
read -r -a pc_libs <<<"$(pkg-config --libs ringtrain 2>/dev/null)"
case " ${pc_cflags[*]} " in
  *" -I$prefix/lib/pkgconfig/../../include "* | *" -I$prefix/include "*) ;;
  *) fail "ringtrain.pc's include directory is not under the prefix it was installed to" ;;
esac

# Self-contained headers: each compiles alone, and includes only installed ringtrain headers
# (never one from src/ or kernels/).
header_failures=0
for header in "$prefix"/include/ringtrain/*.h; do
  name=ringtrain/$(basename "$header")
  for inc in $(sed -n 's/^#include "\(.*\)"/\1/p' "$header"); do
    [ -f "$prefix/include/$inc" ] || { fail "$name includes \"$inc\", which is not installed"; header_failures=$((header_failures + 1)); }
  done
  if ! out=$(echo "#include <$name>" | "$cxx" -std=c++20 -fsyntax-only -x c++ "${pc_cflags[@]}" - 2>&1); then
    fail "$name does not compile on its own: $(head -n 5 <<<"$out")"
    header_failures=$((header_failures + 1))
  fi
done
headers=("$prefix"/include/ringtrain/*.h)
[ "$header_failures" -eq 0 ] && pass "all ${#headers[@]} installed headers compile on their own"

cat >"$work/tiny.cpp" <<'CPP'
// Buckets for four gradient pieces of 3 floats: a first bucket of >= 2, then >= 5 each; and
// whether the ONNX exporter is built, which links its object file (and ONNX, when it is in).
#include <cstdio>
#include <vector>

#include <ringtrain/grad_sync.h>
#include <ringtrain/onnx_export.h>

int main() {
  const std::vector<ringtrain::GradRange> pieces{{0, 0, 3}, {1, 3, 6}, {2, 6, 9}, {3, 9, 12}};
  for (const ringtrain::Bucket& b : ringtrain::assign_buckets(pieces, 2, 5))
    std::printf("[%lld,%lld)", static_cast<long long>(b.begin), static_cast<long long>(b.end));
  std::printf(" onnx=%d\n", ringtrain::onnx_export_available() ? 1 : 0);
}
CPP
if out=$("$cxx" -std=c++20 "$work/tiny.cpp" -o "$work/tiny" "${pc_cflags[@]}" "${pc_libs[@]}" 2>&1); then
  got=$("$work/tiny" 2>&1)
  if [[ $got == "[0,3)[3,9)[9,12) onnx="[01] ]]; then
    pass "a program built with pkg-config's flags runs: $got"
  else
    fail "the pkg-config program printed '$got', expected [0,3)[3,9)[9,12) onnx=0 or 1"
  fi
else
  fail "a program does not build with pkg-config's flags: $(head -n 20 <<<"$out")"
fi

# ---- find_package(ringtrain): the example as its own project ----
example_build=$work/custom_model
if ! cmake -S "$source/examples/custom_model" -B "$example_build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" >"$work/configure.log" 2>&1; then
  fail "examples/custom_model does not configure against $prefix: $(tail -n 20 "$work/configure.log")"
elif ! grep -qx "ringtrain_DIR:PATH=$prefix/lib/cmake/ringtrain" "$example_build/CMakeCache.txt"; then
  fail "find_package(ringtrain) found another ringtrain: $(grep ringtrain_DIR "$example_build/CMakeCache.txt")"
elif ! cmake --build "$example_build" -j2 >"$work/build.log" 2>&1; then
  fail "examples/custom_model does not build: $(tail -n 30 "$work/build.log")"
else
  pass "examples/custom_model builds with find_package(ringtrain) from the prefix"
  out=$(timeout -k 5 120 "$mpirun" "$np_flag" 2 "${mpi_flags[@]}" "$example_build/custom_model" \
    150 </dev/null 2>&1)
  status=$?
  line=$(grep '^custom_model: ' <<<"$out")
  accuracy=$(sed -n 's/.*test accuracy \([0-9.]*\), replicas identical$/\1/p' <<<"$line")
  if [ "$status" -ne 0 ] || [ -z "$accuracy" ]; then
    fail "custom_model at np 2 (exit $status): $(tail -n 20 <<<"$out")"
  elif ! grep -q '^custom_model: 2 ranks, 150 steps, ' <<<"$line"; then
    fail "custom_model did not train 150 steps on 2 ranks: $line"
  elif awk -v a="$accuracy" 'BEGIN { exit !(a > 0.6) }'; then
    pass "custom_model at np 2: $line"
  else
    fail "custom_model at np 2 learned too little (test accuracy $accuracy <= 0.6): $line"
  fi
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all install checks passed"
