# shellcheck shell=bash
# Shared by the tests that launch mnist_train under mpirun (dp_test.sh, failure_test.sh,
# strategy_test.sh); sourced after the caller has set mpirun, trainer, np_flag and the array
# mpi_flags (and compare, for compare_params). It gives:
#  - a scratch directory $work, the current directory, removed on exit with any stray rank (every
#    launch carries "$work" in its arguments, so pkill -f finds them);
#  - fail / pass, which count in $failures, and finish, which ends the test by that count;
#  - run NAME LIMIT_S NP flags...: mpirun under a timeout (a hang is a failure, never a wait);
#    output in NAME.log, metrics in NAME.jsonl, exit status in $status, seconds in $took;
#  - compare_params WHAT A B [params_compare flags]: passes or fails with params_compare's
#    numbers line;
#  - has NAME TEXT: whether NAME.log holds TEXT;
#  - pids_of PROGRAM PATTERN: the PIDs of PROGRAM's processes (mpirun, or the trainer's ranks)
#    whose arguments match PATTERN (this test's scratch directory, say: not another test's).
work=$(mktemp -d)
trap 'pkill -9 -f "$work" 2>/dev/null; rm -rf "$work"' EXIT
unset RINGTRAIN_DATA
cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "PASS: $*"; }

run() {
  local name=$1 limit=$2 np=$3
  shift 3
  local start
  start=$(date +%s.%N)
  timeout -k 5 "$limit" "$mpirun" "$np_flag" "$np" "${mpi_flags[@]}" "$trainer" \
    --metrics-out "$work/$name.jsonl" "$@" </dev/null >"$name.log" 2>&1
  status=$?
  took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  [ "$status" -eq 124 ] && fail "$name: timed out after $limit s (a hang): $(tail -n 20 "$name.log")"
  return 0
}

compare_params() {
  local what=$1 a=$2 b=$3
  shift 3
  local out
  if out=$("$compare" "$a" "$b" "$@" 2>&1); then
    pass "$what: $(head -n 1 <<<"$out")"
  else
    fail "$what: $out"
  fi
}

has() { grep -qF -- "$2" "$1.log"; }

pids_of() {
  local name p
  name=$(basename "$1" | cut -c1-15)  # a process name as ps shows it
  for p in $(pgrep -f "$2"); do
    [ "$(ps -o comm= -p "$p" 2>/dev/null)" = "$name" ] && echo "$p"
  done
}

finish() {  # finish WHAT
  if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all $1 checks passed"
}
