#!/usr/bin/env bash
# The watchdog judges progress, not how long one wait lasts (docs/failures.md, "The watchdog:
# no hangs"), under mpirun, every launch under `timeout`:
#  (a) a job whose every rank is stopped (SIGSTOP, as a batch system's suspend) for 2.5x
#      --collective-timeout and then continued (SIGCONT) finishes with exit 0;
#  (b) --strategy ps with worker steps that compute longer than the timeout (the servers wait
#      through them) is not killed;
#  (c) one MPI_Allreduce and one broadcast that last longer than the timeout but keep moving
#      (every 4 MiB piece held by --test-slow-transport-ms, as a slow link would) are not
#      killed;
#  (d) a true stall is still ended within the timeout plus the grace, naming the rank, exit 4;
#  (e) a rank stalled in set-up (ring and ps: before the configuration check, in the
#      communicator split) and the chief stalled after its last writes (before the final
#      barrier) are ended the same way instead of hanging.
# Bounds come from the timeout; margins are wide because the test machine is shared and loaded.
# Usage: watchdog_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"
timeout_s=2  # --collective-timeout of every run
grace_s=1    # the watchdog's grace at that timeout: clamp(timeout / 2, 1, 5)
# The longest a true stall may go on past the timeout before the job ends: the grace, the
# watchdog's re-ask interval (0.2 s here), its poll, and a wide margin for a loaded machine.
slack_s=$((grace_s + 6))

# stamp NAME TEXT: the time of day (seconds) of the first log line holding TEXT ("[12:34:56.789]
# [rank 1] ..." or, before the logging is set up, spdlog's "[2026-12-01 12:34:56.789] ...").
stamp() {
  grep -m1 -F -- "$2" "$1.log" | sed -E 's/^\[([0-9-]+ )?([0-9:.]+)\].*/\2/' |
    awk -F: '{ printf "%.3f\n", $1 * 3600 + $2 * 60 + $3 }'
}
# ended_within NAME FROM_TEXT LOW HIGH: the watchdog's report came LOW..HIGH s after FROM_TEXT.
ended_within() {
  local from to
  from=$(stamp "$1" "$2")
  to=$(stamp "$1" "watchdog: ")
  [ -n "$from" ] && [ -n "$to" ] || return 1
  gap=$(awk -v a="$from" -v b="$to" 'BEGIN { d = b - a; if (d < 0) d += 86400; printf "%.1f", d }')
  awk -v d="$gap" -v lo="$3" -v hi="$4" 'BEGIN { exit !(d >= lo && d <= hi) }'
}
# stalled NAME RANK: exit 4 and the report names RANK as the one that has not reached it.
stalled() {
  [ "$status" -eq 4 ] && has "$1" "not reached by rank(s) $2 (stalled)" &&
    grep -q "rank $2: .*not in a collective.*has not reached it" "$1.log"
}

# ---- (a) suspended and resumed ----
name=suspend
start=$(date +%s.%N)
# Rank 1 sleeps 200 ms before every step, so rank 0 spends most of its time waiting in the
# allreduce: the stop lands inside a wait, which outlasts the timeout by far.
timeout -k 5 120 "$mpirun" "$np_flag" 2 "${mpi_flags[@]}" "$trainer" \
  --metrics-out "$work/$name.jsonl" --steps 40 --batch-size 32 --log-every 1 \
  --collective-timeout "$timeout_s" --test-slow-rank 1 --test-slow-ms 200 \
  </dev/null >"$name.log" 2>&1 &
job=$!
for _ in $(seq 600); do
  grep -q "step 5/40" "$name.log" 2>/dev/null && break
  sleep 0.1
done
# The ranks, not mpirun or timeout: their command line starts with the trainer.
mapfile -t ranks < <(pgrep -f "^$trainer --metrics-out $work/$name.jsonl")
stop_s=$(awk -v t="$timeout_s" 'BEGIN { print 2.5 * t }')
if [ "${#ranks[@]}" -eq 2 ]; then
  kill -STOP "${ranks[@]}"
  sleep "$stop_s"
  kill -CONT "${ranks[@]}"
fi
wait "$job"
status=$?
took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
if [ "${#ranks[@]}" -ne 2 ]; then
  fail "(a) expected 2 ranks to stop, found ${#ranks[@]}: $(tail -n 5 "$name.log")"
elif [ "$status" -eq 0 ] && ! has "$name" "watchdog:" && has "$name" "summary: 40 steps"; then
  pass "(a) every rank stopped ${stop_s} s (--collective-timeout $timeout_s) and continued: exit 0 in ${took} s"
else
  fail "(a) suspend and resume: exit $status after ${took} s: $(grep -A5 -m1 "watchdog\|error" "$name.log" | head -8)"
fi

# ---- (b) parameter servers wait through long worker steps ----
# Real compute first: an mlp of three 4096-wide layers at batch 512 on one thread is about
# 165 GFLOP a step (2.7 s measured here), its largest layer op (17 GFLOP) a tenth of that.
run ps_compute 180 3 --strategy ps --steps 2 --batch-size 512 --hidden 4096,4096,4096 \
  --threads 1 --log-every 1 --collective-timeout "$timeout_s"
compute_ms=$(grep -o "per worker round [0-9.]* ms computing" ps_compute.log | grep -o "[0-9.]* ms" | grep -o "[0-9.]*")
if [ "$status" -eq 0 ] && ! has ps_compute "watchdog:" && has ps_compute "summary: 2 steps"; then
  if awk -v c="${compute_ms:-0}" -v t="$timeout_s" 'BEGIN { exit !(c > 1000 * t) }'; then
    pass "(b) ps: worker steps computing ${compute_ms} ms under --collective-timeout $timeout_s: exit 0 in ${took} s"
  else
    pass "(b) ps: exit 0, but the worker steps computed only ${compute_ms:-?} ms here (not over the timeout): the next run covers it"
  fi
else
  fail "(b) ps with long worker steps: exit $status after ${took} s: $(grep -A5 -m1 "watchdog\|error" ps_compute.log | head -8)"
fi
# The same, made certain: every worker step computes 2.5x the timeout (more forward passes).
long_ms=$((timeout_s * 2500))
run ps_long 120 3 --strategy ps --steps 1 --batch-size 32 --log-every 1 \
  --collective-timeout "$timeout_s" --test-long-compute-ms "$long_ms"
if [ "$status" -eq 0 ] && ! has ps_long "watchdog:" && has ps_long "summary: 1 steps"; then
  pass "(b) ps: worker steps of $long_ms ms (--test-long-compute-ms) under --collective-timeout $timeout_s: exit 0 in ${took} s"
else
  fail "(b) ps with --test-long-compute-ms: exit $status after ${took} s: $(grep -A5 -m1 "watchdog\|error" ps_long.log | head -8)"
fi

# ---- (c) a long collective that keeps moving ----
# mlp 1400,1400: 3.07 M parameters, 12.3 MB: three 4 MiB pieces, each held 0.45x the timeout,
# so the initial broadcast and the gradient's MPI_Allreduce (one 16 MB bucket) each last
# 1.35x the timeout while a piece completes every 0.45x.
piece_ms=$((timeout_s * 450))
run slow_link 120 2 --steps 2 --batch-size 32 --log-every 1 --hidden 1400,1400 \
  --allreduce mpi --fusion-threshold-mb 16 --collective-timeout "$timeout_s" \
  --test-slow-transport-ms "$piece_ms"
if [ "$status" -eq 0 ] && ! has slow_link "watchdog:" && has slow_link "summary: 2 steps"; then
  pass "(c) a broadcast and an MPI_Allreduce of 3 pieces x $piece_ms ms each under --collective-timeout $timeout_s: exit 0 in ${took} s"
else
  fail "(c) long moving collectives: exit $status after ${took} s: $(grep -A5 -m1 "watchdog\|error" slow_link.log | head -8)"
fi

# ---- (d) a true stall is still ended ----
run stall 60 3 --steps 40 --batch-size 32 --log-every 0 --collective-timeout "$timeout_s" \
  --test-stall-rank 1 --test-stall-at-step 3 --test-stall-seconds 60
if stalled stall 1 && has stall "watchdog: the gradient allreduce at step 3" &&
   ended_within stall "stalls for 60 s at step 3" "$timeout_s" "$((timeout_s + slack_s))"; then
  pass "(d) rank 1 stalled at step 3: the watchdog named it ${gap} s later (timeout $timeout_s), exit 4"
else
  fail "(d) a true stall: exit $status after ${took} s, report ${gap:-?} s after the stall: $(grep -A5 -m1 "watchdog\|error" stall.log | head -8)"
fi

# ---- (e) stalls outside training: in set-up and after the last collective ----
# Set-up: the other ranks load the data first (seconds on a loaded machine), then wait.
run setup_stall 60 3 --steps 5 --batch-size 32 --log-every 0 --collective-timeout "$timeout_s" \
  --test-stall-rank 1 --test-stall-at-setup --test-stall-seconds 60
if stalled setup_stall 1 && has setup_stall "rank 1: set-up, not in a collective" &&
   ended_within setup_stall "stalls for 60 s in set-up" "$timeout_s" 30; then
  pass "(e) rank 1 stalled in set-up: the watchdog named it ${gap} s later, exit 4"
else
  fail "(e) a set-up stall: exit $status after ${took} s: $(grep -A5 -m1 "watchdog\|error" setup_stall.log | head -8)"
fi
# --strategy ps: the others wait at the barrier before the job communicator's split.
run ps_setup_stall 60 3 --strategy ps --steps 5 --batch-size 32 --log-every 0 \
  --collective-timeout "$timeout_s" --test-stall-rank 0 --test-stall-at-setup \
  --test-stall-seconds 60
if stalled ps_setup_stall 0 && ended_within ps_setup_stall "stalls for 60 s in set-up" "$timeout_s" 30; then
  pass "(e) ps: rank 0 stalled in set-up: the watchdog named it ${gap} s later, exit 4"
else
  fail "(e) a ps set-up stall: exit $status after ${took} s: $(grep -A5 -m1 "watchdog\|error" ps_setup_stall.log | head -8)"
fi
# After the end: the chief writes its parameters, then stalls; rank 1 waits in the final barrier.
run end_stall 60 2 --steps 5 --batch-size 32 --log-every 0 --collective-timeout "$timeout_s" \
  --save-params "$work/end.bin" --test-stall-rank 0 --test-stall-after-end --test-stall-seconds 60
if stalled end_stall 0 && has end_stall "watchdog: the final barrier at step 5" && [ -s end.bin ] &&
   ended_within end_stall "stalls for 60 s after its last writes" "$timeout_s" "$((timeout_s + slack_s))"; then
  pass "(e) the chief stalled after its last writes: the watchdog named it ${gap} s later, exit 4"
else
  fail "(e) a stall after the end: exit $status after ${took} s: $(grep -A5 -m1 "watchdog\|error" end_stall.log | head -8)"
fi

finish watchdog
