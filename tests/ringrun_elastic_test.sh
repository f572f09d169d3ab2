#!/usr/bin/env bash
# ringrun --max-restarts on this machine (localhost ranks under mpirun, no ssh, no root):
#  (a) refusals before anything runs (exit 2, naming the flag): no --checkpoint-dir, --min-np
#      without --max-restarts or above -np, --strategy ps, a bad --max-restarts; and (exit 1) a
#      global batch that no rank count from --min-np to -np splits;
#  (b) a rank SIGKILLed mid-run: ringrun names the cause, relaunches with --resume auto, the
#      job completes (exit 0) and, under --reproducible, its parameters equal an uninterrupted
#      one-rank run's byte for byte;
#  (c) a failure every launch meets again (--test-fail-rank): ringrun gives up after
#      --max-restarts relaunches with the last cause and the job's status; a per-rank
#      --batch-size becomes the global batch it stands for;
#  (d) a failure a relaunch cannot mend (a NaN, exit 5) is not restarted;
#  (f) a stall ended by the watchdog (exit 4) is restarted, and met again gives up with exit 4;
#  (e) SIGTERM to ringrun: the job checkpoints and stops within 10 s, ringrun exits 75, and the
#      same command resumes and ends byte-identical to the uninterrupted run.
# Every run is under `timeout`. Skips (77) without python3 or mpirun.
# Usage: ringrun_elastic_test.sh PATH/TO/mnist_train [extra ringrun --mpi-args]
set -uo pipefail
command -v python3 >/dev/null || { echo "SKIPPED: python3 is missing (ringrun is a python3 script)"; exit 77; }
command -v mpirun >/dev/null || { echo "SKIPPED: mpirun is missing"; exit 77; }
[ $# -ge 1 ] || { echo "usage: $0 PATH/TO/mnist_train [--mpi-args value]"; exit 2; }
trainer=$(realpath -e "$1") || { echo "FAIL: no trainer at '$1'"; exit 1; }
mpi_args=${2:---mca btl self,vader}
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ringrun=$repo/scripts/ringrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
unset RINGTRAIN_DATA
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "PASS: $*"; }
seconds_since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }'; }

# The job: --reproducible, so any rank count gives the same bits; rank 1 sleeps 20 ms a step,
# so that a kill lands mid-run (300 steps take 6 s or more).
job=(--hidden 64 --global-batch-size 96 --reproducible --micro-batch 8 --steps 300 --seed 3
     --optimizer sgd --momentum 0.9 --lr 0.05 --log-every 50 --checkpoint-every 20
     --eval-batch 10000)
slow=(--test-slow-rank 1 --test-slow-ms 20)
timeout -k 5 120 "$trainer" "${job[@]}" --checkpoint-dir "$work/ref-ck" \
  --save-params "$work/ref.bin" >"$work/ref.log" 2>&1 ||
  { echo "FAIL: the uninterrupted one-rank run failed: $(tail -n 5 "$work/ref.log")"; exit 1; }

# elastic NAME RINGRUN-ARGS... -- TRAINER-ARGS...: ringrun in the background, output to NAME.log.
elastic() {
  local name=$1
  shift
  timeout -k 5 180 python3 "$ringrun" --mpi-args "$mpi_args" "$@" </dev/null \
    >"$work/$name.log" 2>&1 &
  pid=$!
}
# shellcheck source=tests/support/wait_lib.sh
source "$repo/tests/support/wait_lib.sh"
# A rank of this test's job (by its command line), the newest.
rank_pid() { pgrep -n -f -- "$trainer .*--checkpoint-dir $work/$1"; }

# ---- (a) refusals ----
refused() {  # refused WHAT 'regex' ARGS...
  local what=$1 pattern=$2 out status
  shift 2
  out=$(timeout -k 5 60 python3 "$ringrun" "$@" </dev/null 2>&1)
  status=$?
  if [ "$status" -ne 2 ]; then
    fail "(a) $what: exit $status, expected 2: $out"
  elif ! grep -qE -- "$pattern" <<<"$out"; then
    fail "(a) $what: no message matching '$pattern': $out"
  elif pgrep -f -- "--checkpoint-dir $work/refused" >/dev/null; then
    fail "(a) $what: a rank runs"
  else
    pass "(a) $what: $(grep -m 1 -E -- "$pattern" <<<"$out")"
  fi
}
refused "no --checkpoint-dir" "--max-restarts needs the trainer's --checkpoint-dir" \
  -np 2 --max-restarts 2 -- "$trainer" --steps 5
refused "--min-np without --max-restarts" "--min-np .* needs --max-restarts" \
  -np 2 --min-np 1 -- "$trainer" --steps 5 --checkpoint-dir "$work/refused"
refused "--min-np above -np" "--min-np must be a whole number from 1 to -np 2, got '3'" \
  -np 2 --max-restarts 1 --min-np 3 -- "$trainer" --checkpoint-dir "$work/refused"
refused "--max-restarts abc" "--max-restarts must be a whole number from 0 to 1000, got 'abc'" \
  -np 2 --max-restarts abc -- "$trainer" --checkpoint-dir "$work/refused"
refused "--strategy ps" "restarts --strategy ring and local-sgd jobs; this one is --strategy ps" \
  -np 3 --max-restarts 1 -- "$trainer" --strategy ps --checkpoint-dir "$work/refused"
refused "a trainer flag it does not know" "--print-config exited" \
  -np 2 --max-restarts 1 -- "$trainer" --no-such-flag --checkpoint-dir "$work/refused"
refused "--batch-size beside a --global-batch-size it does not make" \
  "--batch-size 16 x -np 2 ranks is not --global-batch-size 64: pass one of the two" \
  -np 2 --max-restarts 1 -- "$trainer" --batch-size 16 --global-batch-size 64 \
  --checkpoint-dir "$work/refused"
printf 'batch-size = 16\n' >"$work/per_rank.toml"
refused "a per-rank batch-size in a config file" "config file sets batch-size \(per rank\)" \
  -np 2 --max-restarts 1 -- "$trainer" --config "$work/per_rank.toml" \
  --checkpoint-dir "$work/refused"
# --dry-run shows the first launch: the slots' rank count and the global batch, no per-rank one.
out=$(timeout -k 5 60 python3 "$ringrun" -np 8 -H localhost:2 --max-restarts 1 --dry-run -- \
  "$trainer" --batch-size 16 --checkpoint-dir "$work/refused" </dev/null 2>&1)
status=$?
if [ "$status" -ne 0 ] || ! grep -qE -- "-np 2 --host localhost:2 .*--global-batch-size 128" <<<"$out" ||
   grep -q -- "--batch-size 16" <<<"$out"; then
  fail "(a) --dry-run --max-restarts: exit $status: $out"
else
  pass "(a) --dry-run --max-restarts prints the first launch: -np 2 on localhost:2, --global-batch-size 128 for --batch-size 16 x 8"
fi
out=$(timeout -k 5 60 python3 "$ringrun" -np 2 --max-restarts 1 --min-np 2 -- "$trainer" \
  --global-batch-size 33 --checkpoint-dir "$work/refused" </dev/null 2>&1)
status=$?
if [ "$status" -ne 1 ] ||
   ! grep -q "no rank count from --min-np 2 to 2 splits the global batch 33 (rank counts up to -np 2 that do: 1)" <<<"$out" ||
   ! grep -q "nothing was started" <<<"$out"; then
  fail "(a) a global batch no allowed rank count splits: exit $status: $out"
else
  pass "(a) a global batch no allowed rank count splits: exit 1, $(grep -m 1 'no rank count' <<<"$out")"
fi
[ ! -e "$work/refused" ] || fail "(a) a refused run made its checkpoint directory"

# ---- (b) a rank killed mid-run ----
elastic b -np 2 --max-restarts 2 -- "$trainer" "${job[@]}" "${slow[@]}" --checkpoint-dir "$work/b" \
  --save-params "$work/b.bin"
if wait_for "$work/b.log" "checkpoint: step (4|5|6|7|8)0 written" 60; then
  kill -KILL "$(rank_pid b)"
else
  fail "(b) no checkpoint of step 40 within 60 s: $(tail -n 5 "$work/b.log")"
fi
wait "$pid"
status=$?
if [ "$status" -ne 0 ]; then
  fail "(b) exit $status after a killed rank: $(grep ringrun: "$work/b.log")"
elif ! grep -qE "ringrun: the job failed: rank [01] on .* was killed by signal 9" "$work/b.log"; then
  fail "(b) the cause is not named: $(grep ringrun: "$work/b.log")"
elif ! grep -q "ringrun: restart 1 of 2: np 2 on localhost:2" "$work/b.log" ||
     ! grep -q "resuming from $work/b/ckpt-" "$work/b.log"; then
  fail "(b) no relaunch from a checkpoint: $(grep -E 'ringrun:|resuming' "$work/b.log")"
elif ! cmp -s "$work/b.bin" "$work/ref.bin"; then
  fail "(b) the parameters differ from the uninterrupted run's"
else
  pass "(b) a killed rank: $(grep -m 1 'the job failed' "$work/b.log" | sed 's/^ringrun: //');" \
       "$(grep -m 1 -o 'resuming from [^:]*: step [0-9]*' "$work/b.log");" \
       "$(grep -m 1 -o 'training resumed .* s after' "$work/b.log");" \
       "completed, parameters byte-identical to the one-rank run"
fi

# ---- (c) the same failure every launch: restarts exhausted ----
timeout -k 5 120 python3 "$ringrun" --mpi-args "$mpi_args" -np 2 --max-restarts 2 -- "$trainer" \
  --hidden 32 --batch-size 16 --steps 50 --checkpoint-dir "$work/c" --checkpoint-every 100 \
  --log-every 0 --test-fail-rank 1 --test-fail-at-step 5 </dev/null >"$work/c.log" 2>&1
status=$?
launches=$(grep -cE 'ringrun: (launch|restart [0-9]+ of 2):' "$work/c.log")
if [ "$status" -eq 0 ]; then
  fail "(c) exit 0 although every launch failed"
elif [ "$launches" -ne 3 ]; then
  fail "(c) $launches launches, expected 3 (the first and 2 restarts): $(grep ringrun: "$work/c.log")"
elif ! grep -qE "ringrun: giving up after 2 restart\(s\) \(--max-restarts 2\); the last failure: .*exit $status" "$work/c.log"; then
  fail "(c) no final 'giving up' line with the last cause and status $status: $(grep ringrun: "$work/c.log")"
elif ! grep -q "global batch 32" "$work/c.log"; then
  fail "(c) --batch-size 16 x 2 ranks was not kept as the global batch 32: $(grep ringrun: "$work/c.log")"
else
  pass "(c) restarts exhausted: exit $status; $(grep 'giving up' "$work/c.log" | sed 's/^ringrun: //')"
fi

# ---- (d) a divergence is not restarted ----
timeout -k 5 120 python3 "$ringrun" --mpi-args "$mpi_args" -np 2 --max-restarts 3 -- "$trainer" \
  --hidden 32 --global-batch-size 32 --steps 50 --checkpoint-dir "$work/d" --log-every 0 \
  --test-nan-rank 1 --test-nan-steps 4 </dev/null >"$work/d.log" 2>&1
status=$?
if [ "$status" -ne 5 ]; then
  fail "(d) exit $status, expected 5 (non-finite): $(tail -n 8 "$work/d.log")"
elif grep -q "ringrun: restart" "$work/d.log" || ! grep -q "not restarting: the training diverged" "$work/d.log"; then
  fail "(d) a diverged run was restarted or not explained: $(grep ringrun: "$work/d.log")"
else
  pass "(d) a NaN (exit 5) is not restarted: $(grep 'not restarting' "$work/d.log" | sed 's/^ringrun: //')"
fi

# ---- (f) a stall ended by the watchdog is restarted (and, met again, ends the job) ----
timeout -k 5 120 python3 "$ringrun" --mpi-args "$mpi_args" -np 2 --max-restarts 1 -- "$trainer" \
  --hidden 32 --global-batch-size 32 --steps 50 --checkpoint-dir "$work/f" --log-every 0 \
  --collective-timeout 2 --test-stall-rank 1 --test-stall-at-step 3 --test-stall-seconds 60 \
  </dev/null >"$work/f.log" 2>&1
status=$?
stalls=$(grep -c 'ringrun: the job failed: a stall ended by the watchdog' "$work/f.log")
if [ "$status" -ne 4 ] || [ "$stalls" -ne 2 ] || ! grep -q 'ringrun: restart 1 of 1' "$work/f.log"; then
  fail "(f) a stall: exit $status (expected 4), $stalls stall(s) seen (expected 2): $(grep ringrun: "$work/f.log")"
else
  pass "(f) a watchdog stall is restarted: $(grep -m 1 'the job failed' "$work/f.log" | sed 's/^ringrun: //' | cut -c1-200)"
fi

# ---- (e) SIGTERM to ringrun: checkpoint, 75, the same command resumes ----
elastic e -np 2 --max-restarts 2 -- "$trainer" "${job[@]}" "${slow[@]}" --checkpoint-dir "$work/e" \
  --save-params "$work/e.bin"
if wait_for "$work/e.log" "checkpoint: step (4|5|6|7|8)0 written" 60; then
  # ringrun itself (timeout's child), not timeout: a TERM to timeout -k also arms its KILL.
  kill -TERM "$(pgrep -P "$pid")"
  term_at=$(date +%s.%N)
else
  fail "(e) no checkpoint of step 40 within 60 s: $(tail -n 5 "$work/e.log")"
  term_at=$(date +%s.%N)
fi
wait "$pid"
status=$?
took=$(seconds_since "$term_at")
stopped_at=$(grep -o 'every rank stopped after step [0-9]*' "$work/e.log" | grep -o '[0-9]*$')
if [ "$status" -ne 75 ]; then
  fail "(e) exit $status after SIGTERM, expected 75: $(grep -E 'ringrun:|preempt' "$work/e.log")"
elif ! awk -v t="$took" 'BEGIN { exit !(t <= 10) }'; then
  fail "(e) the job took $took s to stop (at most 10)"
elif [ -z "$stopped_at" ] || [ ! -f "$(printf '%s/e/ckpt-%010d.rtckpt' "$work" "$stopped_at")" ]; then
  fail "(e) no checkpoint of the step the job stopped at ('$stopped_at')"
else
  timeout -k 5 180 python3 "$ringrun" --mpi-args "$mpi_args" -np 2 --max-restarts 2 -- "$trainer" \
    "${job[@]}" "${slow[@]}" --checkpoint-dir "$work/e" --save-params "$work/e.bin" </dev/null \
    >"$work/e2.log" 2>&1
  status=$?
  if [ "$status" -ne 0 ]; then
    fail "(e) the same command again exited $status: $(tail -n 5 "$work/e2.log")"
  elif ! grep -q "resuming from $work/e/ckpt-$(printf '%010d' "$stopped_at")" "$work/e2.log"; then
    fail "(e) the second run did not resume from step $stopped_at: $(grep -m 2 -E 'resum|ringrun' "$work/e2.log")"
  elif ! cmp -s "$work/e.bin" "$work/ref.bin"; then
    fail "(e) the resumed parameters differ from the uninterrupted run's"
  else
    pass "(e) SIGTERM to ringrun: stopped after step $stopped_at in $took s, exit 75; the same" \
         "command resumed and ended byte-identical"
  fi
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "ringrun_elastic_test: all checks passed"
