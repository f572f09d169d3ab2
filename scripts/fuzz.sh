#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan, UB aborts), writes their
# seed corpora and runs each target for a while; see docs/fuzzing.md.
#
#   scripts/fuzz.sh [--seconds N] [--target idx|checkpoint|all] [--build-dir DIR]
#
#   --seconds N     run each target for N seconds (-max_total_time; default 60)
#   --target T      idx, checkpoint or all (default all)
#   --build-dir DIR where the clang build, corpora, logs and artifacts go (default build-fuzz)
#
# Exit status: 0 when every target ran its time without a finding; 1 on a finding (a crash, a
# sanitizer report, a timeout, an out-of-memory, a broken invariant: the reproducer's path and
# the command to replay it are printed) or when the build fails; 77 with "SKIPPED: why" when
# clang or libFuzzer is missing (ctest's fuzz_smoke then reports the test as skipped).
# Environment: FUZZ_CXX picks the compiler (default clang++, then clang++-14);
# FUZZ_EXTRA_FLAGS adds compile flags after the sanitizer flags.
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

seconds=60
target=all
build_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a value}"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --target) target="${2:?--target needs a value}"; shift 2 ;;
    --target=*) target="${1#*=}"; shift ;;
    --build-dir) build_dir="${2:?--build-dir needs a value}"; shift 2 ;;
    --build-dir=*) build_dir="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds must be a positive integer, got '$seconds'" >&2; exit 2; }
case "$target" in
  idx|checkpoint) targets=("$target") ;;
  all) targets=(idx checkpoint) ;;
  *) echo "fuzz.sh: --target must be idx, checkpoint or all, got '$target'" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${build_dir:-$root/build-fuzz}"
mkdir -p "$build_dir"
build_dir="$(cd "$build_dir" && pwd)"

skip() { echo "SKIPPED: $*"; exit 77; }

# ---- tools: clang++ that links libFuzzer with ASan and UBSan ----
cxx="${FUZZ_CXX:-}"
if [[ -z "$cxx" ]]; then
  for candidate in clang++ clang++-14; do
    if command -v "$candidate" >/dev/null 2>&1; then cxx="$candidate"; break; fi
  done
fi
[[ -n "$cxx" ]] && command -v "$cxx" >/dev/null 2>&1 ||
  skip "no clang++ found (apt-get install clang, or set FUZZ_CXX)"
command -v cmake >/dev/null 2>&1 || skip "cmake not found"
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  >"$probe_dir/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" \
    >"$probe_dir/probe.log" 2>&1; then
  skip "$cxx cannot link -fsanitize=fuzzer,address,undefined (libFuzzer missing? apt-get install" \
       "libclang-rt-14-dev): $(grep -m1 -i error "$probe_dir/probe.log" || head -n1 "$probe_dir/probe.log")"
fi

# ---- build ----
jobs="$(nproc 2>/dev/null || echo 2)"
echo "== fuzz build: $cxx -> $build_dir"
if ! cmake -S "$root/fuzz" -B "$build_dir" -DCMAKE_CXX_COMPILER="$cxx" \
    -DRINGTRAIN_FUZZ_EXTRA_FLAGS="${FUZZ_EXTRA_FLAGS:-}" >"$build_dir/configure.log" 2>&1; then
  tail -n 30 "$build_dir/configure.log"
  echo "FAILED: configuring fuzz/ (log: $build_dir/configure.log)"
  exit 1
fi
if ! cmake --build "$build_dir" -j "$jobs" >"$build_dir/build.log" 2>&1; then
  tail -n 40 "$build_dir/build.log"
  echo "FAILED: building fuzz/ (log: $build_dir/build.log)"
  exit 1
fi
rm -rf "$build_dir/seeds"
"$build_dir/make_seeds" "$build_dir/seeds"

# ---- run ----
mkdir -p "$build_dir/artifacts" "$build_dir/logs"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1"
failed=()
for t in "${targets[@]}"; do
  bin="$build_dir/fuzz_$t"
  corpus="$build_dir/corpus/$t"
  log="$build_dir/logs/$t.log"
  mkdir -p "$corpus"
  # The first directory collects what the fuzzer finds; the others are only read: the
  # generated seeds and fuzz/corpus/<target> (regression inputs, when there are any).
  dirs=("$corpus" "$build_dir/seeds/$t")
  if [[ -d "$root/fuzz/corpus/$t" ]] && [[ -n "$(ls -A "$root/fuzz/corpus/$t")" ]]; then
    dirs+=("$root/fuzz/corpus/$t")
  fi
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024
        -error_exitcode=1 -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/$t-")
  [[ -f "$root/fuzz/$t.dict" ]] && args+=(-dict="$root/fuzz/$t.dict")
  echo "== fuzz_$t: ${seconds}s (log: $log)"
  rc=0
  # The outer timeout only guards against a fuzzer that ignores -max_total_time.
  timeout --kill-after=10 $((seconds + 120)) "$bin" "${args[@]}" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  last="$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)"
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
  speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
  added="$(sed -n 's/^stat::new_units_added: *//p' "$log")"
  rss="$(sed -n 's/^stat::peak_rss_mb: *//p' "$log")"
  cov="$(sed -n 's/.* \(cov: [0-9]* ft: [0-9]* corp: [^ ]*\).*/\1/p' <<<"$last")"
  if [[ $rc -eq 0 ]]; then
    echo "   ok: ${runs:-?} runs, ${speed:-?} exec/s, $cov, ${added:-?} new units, peak rss ${rss:-?} MB"
    continue
  fi
  failed+=("$t")
  echo "   FAILED (exit $rc) after ${runs:-?} runs; $cov"
  grep -E 'ERROR: |runtime error|SUMMARY: |invariant broken|deadly signal|out-of-memory|timeout after|terminate called|what\(\): ' \
    "$log" | head -n 12 | sed 's/^/   | /'
  artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)"
  if [[ -n "$artifact" ]]; then
    echo "   reproducer: $artifact"
    echo "   replay:     $bin $artifact"
  else
    echo "   no reproducer written; see $log"
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAILED: ${failed[*]} (logs in $build_dir/logs, reproducers in $build_dir/artifacts)"
  exit 1
fi
echo "OK: ${targets[*]}: no crash and no sanitizer report in ${seconds}s each"
