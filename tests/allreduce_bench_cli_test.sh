#!/usr/bin/env bash
# allreduce_bench as an operator meets it under mpirun: every bad flag ends the whole job with
# a non-zero status and a message naming the flag (no rank left hanging), and --csv writes a
# header plus one row per size and backend.
# Usage: allreduce_bench_cli_test.sh MPIEXEC PATH/TO/allreduce_bench
set -uo pipefail
mpiexec=$1
bench=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

launch=("$mpiexec" -np 2 --oversubscribe --mca btl "self,vader")
[ "$(id -u)" -eq 0 ] && launch+=(--allow-run-as-root)

# expect_error "text the output must contain" bench-args...
expect_error() {
  local needle=$1
  shift
  local out status
  out=$(timeout 60 "${launch[@]}" "$bench" "$@" 2>&1)
  status=$?
  if [ "$status" -eq 0 ]; then fail "$*: exited 0"; return; fi
  if [ "$status" -eq 124 ]; then fail "$*: hung (killed after 60 s)"; return; fi
  grep -qF -- "$needle" <<<"$out" || fail "$*: output lacks '$needle': $out"
}

expect_error "--stepfactor" -f 1
expect_error "--stepfactor" -f 0
expect_error "--minbytes" -b 4X
expect_error "--maxbytes" -e 1.5M
expect_error "--minbytes" -b 2
expect_error "larger than -e/--maxbytes" -b 8M -e 1M
expect_error "--iters" -n 0
expect_error "--warmup_iters" -w -1
expect_error "--check" -c 2
expect_error "--op" --op max
expect_error "--backend" --backend nccl
expect_error "--window" --window 0
expect_error "--repeats" --repeats 0
expect_error "--log-level" --log-level loud
expect_error "--bogus" --bogus
# Every count has a range (docs/usage.md#allowed-ranges); a bad value ends every rank with
# status 2, the flag named. expect_usage "text the output must contain" bench-args...
expect_usage() {
  local needle=$1
  shift
  local out status
  out=$(timeout 30 "${launch[@]}" "$bench" -b 4 -e 4 "$@" 2>&1)
  status=$?
  [ "$status" -eq 2 ] || fail "$*: exited $status, expected 2: $out"
  grep -qF -- "$needle" <<<"$out" || fail "$*: output lacks '$needle': $out"
}
expect_usage "--iters: Value 0 not in range 1 to 1000000" -n 0  # CLI11's refusals exit 2 too
expect_usage "--check: Value 1.5 not in range 0 to 1" -c 1.5
expect_usage "--iters" -n 2000000
expect_usage "--warmup_iters" -w 2000000
expect_usage "--repeats" --repeats 2000000
expect_usage "--window" --window 100000     # segments in flight would share MPI tags
expect_usage "--segment-kb" --segment-kb 3000000  # a segment's bytes beyond an int count
expect_usage "--segment-kb" --segment-kb -1       # size_t: would wrap to 2^64 - 1
expect_usage "--spin-us" --spin-us -1
expect_usage "--spin-us" --spin-us 2000000
# --spin-us is applied and said: the preamble names it, the run is right
out=$(timeout 60 "${launch[@]}" "$bench" -b 4K -e 16K -f 4 -n 2 -w 1 --spin-us 50 2>&1) ||
  fail "--spin-us 50 run exited non-zero: $out"
grep -qF "poll without pause for 50 us" <<<"$out" || fail "--spin-us 50: the preamble does not say it: $out"

# A failure on rank 0 alone (the CSV cannot be opened) aborts every rank.
expect_error "$work/missing/out.csv" -b 1K -e 4K --csv "$work/missing/out.csv"

# --csv: a header and one row per size and backend (1K, 4K, 16K x ring, mpi).
out=$(timeout 120 "${launch[@]}" "$bench" -b 1K -e 16K -f 4 -n 2 -w 1 --backend both \
  --repeats 2 --csv "$work/out.csv" 2>&1) || fail "csv run exited non-zero: $out"
if [ -f "$work/out.csv" ]; then
  head -n1 "$work/out.csv" | grep -q '^size_bytes,count,type,redop,backend,' ||
    fail "csv header: $(head -n1 "$work/out.csv")"
  rows=$(($(wc -l <"$work/out.csv") - 1))
  [ "$rows" -eq 6 ] || fail "csv has $rows rows, expected 6"
  grep -q '^16384,4096,float,sum,mpi,2,' "$work/out.csv" || fail "csv lacks the 16 KiB mpi row"
else
  fail "csv run wrote no $work/out.csv"
fi
grep -q '^ *16384 *4096 *float *sum *ring ' <<<"$out" || fail "table lacks the 16 KiB ring row: $out"

if [ "$failures" -gt 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "allreduce_bench CLI: all checks passed"
