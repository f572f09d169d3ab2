#!/usr/bin/env bash
# Preemption (docs/failures.md, "Preemption"): a stop signal makes every rank stop after the same
# step, the chief write a checkpoint, and the job exit 75 ("preempted, resume me"); the same
# command then resumes, ending bitwise identical to an uninterrupted run.
#  (a) SIGTERM to every rank (as Slurm's scancel and --signal deliver it);
#  (b) SIGUSR1 to mpirun alone (Open MPI forwards it to every rank): exit 75 from mpirun;
#  (c) SIGTERM to mpirun alone: Open MPI passes it on after odls_base_sigkill_timeout and kills
#      the ranks the same time later; the checkpoint is written in between (mpirun exits 1);
#  (d) one process without mpirun;
#  (e) a stop requested on one rank only (--test-preempt-rank) stops every rank after that step;
#      under local SGD at the next parameter average; both resume bitwise;
#  (f) without --checkpoint-dir: exit 75, saying that nothing was saved.
# Usage: preempt_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"
# Momentum, an EMA and a decaying rate: all of that state must come back for the bits to match.
# The 4 ms pause per step on rank 0 keeps a run long enough to be signalled mid-training on a fast
# machine; it changes no bits.
base=(--steps 600 --log-every 10 --eval-batch 5000 --momentum 0.9 --ema-decay 0.99
      --lr-schedule exponential --lr-decay-steps 50 --seed 5 --batch-size 32 --test-slow-rank 0)
common=("${base[@]}" --test-slow-ms 4)

# start NAME NP flags...: mpirun (with $extra_mpi_flags) in the background, under a timeout;
# $pid is timeout's.
extra_mpi_flags=()
start() {
  local name=$1 np=$2
  shift 2
  timeout -k 5 120 "$mpirun" "$np_flag" "$np" "${mpi_flags[@]}" "${extra_mpi_flags[@]}" "$trainer" \
    --metrics-out "$work/$name.jsonl" "$@" </dev/null >"$name.log" 2>&1 &
  pid=$!
}
# wait_for_step NAME STEP: until the log shows that step (at most 60 s).
wait_for_step() {
  local i
  for i in $(seq 600); do
    grep -q "step $2/" "$1.log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# finish_wait: waits for the job; $status, and $took (seconds since $signalled).
finish_wait() {
  wait "$pid"
  status=$?
  took=$(awk -v s="$signalled" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
}
# resume_and_compare WHAT NAME NP flags...: the same command resumes and must equal full.bin.
resume_and_compare() {
  local what=$1 name=$2 np=$3
  shift 3
  run "$name" 120 "$np" "$@" --save-params "$work/$name.bin"
  if [ "$status" -eq 0 ] && has "$name" "resuming from" && cmp -s full.bin "$name.bin"; then
    pass "$what: resumed ($(grep -o 'resuming from [^ ]*: step [0-9]*' "$name.log" | sed 's/.*step /step /')), bitwise identical to the uninterrupted run"
  else
    fail "$what: resume exit $status, identical=$(cmp -s full.bin "$name.bin" && echo yes || echo no): $(tail -n 8 "$name.log")"
  fi
}

run full 120 2 "${common[@]}" --save-params "$work/full.bin"
[ "$status" -eq 0 ] || fail "the uninterrupted run exited $status: $(tail -n 20 full.log)"

# signal_mid_run WHAT NAME SIGNAL WHOM EXPECTED flags...: starts NAME with flags, sends SIGNAL to
# WHOM (ranks: every rank; mpirun: mpirun alone) once it trains, and checks the stop: exit
# EXPECTED (or, for "nonzero", mpirun's own status), the log's "preempted" line naming the
# signal, the checkpoint of the step every rank stopped after and the metrics' preempted event;
# then the same command resumes and must equal the uninterrupted run.
signal_mid_run() {
  local what=$1 name=$2 signal=$3 whom=$4 expected=$5
  shift 5
  local dir="$work/ck-$name" number step exit_ok
  number=$(kill -l "$signal")
  start "$name" 2 "$@" --checkpoint-dir "$dir"
  if ! wait_for_step "$name" 20; then
    fail "$what: the run never reached step 20: $(tail -n 8 "$name.log")"
    return
  fi
  signalled=$(date +%s.%N)
  if [ "$whom" = ranks ]; then
    # shellcheck disable=SC2046
    kill -"$signal" $(pids_of "$trainer" "$work")
  else
    # shellcheck disable=SC2046
    kill -"$signal" $(pids_of "$mpirun" "$work")
  fi
  finish_wait
  step=$(grep -o 'stopped after step [0-9]*' "$name.log" | head -n 1 | grep -o '[0-9]*$')
  if [ "$expected" = nonzero ]; then exit_ok=$(( status != 0 )); else exit_ok=$(( status == expected )); fi
  if [ "$exit_ok" -eq 1 ] && has "$name" "preempted: signal $number" && [ -n "$step" ] &&
     [ -f "$dir/ckpt-$(printf %010d "$step").rtckpt" ] && grep -q '"event":"preempted"' "$name.jsonl"; then
    pass "$what: stopped after step $step, checkpoint written, exit $status, ${took} s after the signal"
  else
    fail "$what: exit $status (expected $expected), step '$step': $(tail -n 8 "$name.log")"
  fi
  resume_and_compare "$what" "${name}_resumed" 2 "${common[@]}" --checkpoint-dir "$dir"
}

# (a) as scancel does it; (b) Open MPI forwards SIGUSR1 to every rank and returns their code.
signal_mid_run "(a) SIGTERM to both ranks" term_ranks TERM ranks 75 "${common[@]}"
signal_mid_run "(b) SIGUSR1 to mpirun alone" usr1_mpirun USR1 mpirun 75 "${common[@]}"
# (c) mpirun passes SIGTERM on after odls_base_sigkill_timeout and sends SIGKILL as long after,
# and exits 1 whatever the ranks return: 3 s (1 s by default) leaves a loaded machine's disk
# time for the checkpoint, and 15 ms per step keeps the run going until the signal arrives.
extra_mpi_flags=(--mca odls_base_sigkill_timeout 3)
signal_mid_run "(c) SIGTERM to mpirun alone" term_mpirun TERM mpirun nonzero "${base[@]}" \
  --test-slow-ms 15
extra_mpi_flags=()

# ---- (d) one process without mpirun ----
run full_one 120 1 "${common[@]}" --save-params "$work/full_one.bin"
timeout -k 5 120 "$trainer" "${common[@]}" --checkpoint-dir "$work/ck-d" </dev/null >alone.log 2>&1 &
pid=$!
if wait_for_step alone 20; then
  signalled=$(date +%s.%N)
  kill -TERM "$(pgrep -P "$pid")"
  finish_wait
  if [ "$status" -eq 75 ] && has alone "preempted: signal 15"; then
    pass "(d) SIGTERM to a process without mpirun: exit 75, ${took} s after the signal"
  else
    fail "(d) without mpirun: exit $status (expected 75): $(tail -n 8 alone.log)"
  fi
  timeout -k 5 120 "$trainer" "${common[@]}" --checkpoint-dir "$work/ck-d" \
    --save-params "$work/alone_resumed.bin" </dev/null >alone_resumed.log 2>&1
  if [ $? -eq 0 ] && cmp -s full_one.bin alone_resumed.bin; then
    pass "(d) resumed without mpirun: bitwise identical"
  else
    fail "(d) resume without mpirun: $(tail -n 8 alone_resumed.log)"
  fi
else
  fail "(d) the run never reached step 20: $(tail -n 8 alone.log)"
fi

# ---- (e) a stop requested on one rank: every rank stops after the same step ----
short=(--steps 40 --log-every 10 --eval-batch 5000 --momentum 0.9 --seed 5 --batch-size 32)
run short_full 120 2 "${short[@]}" --save-params "$work/full.bin"
run one_rank_asks 120 2 "${short[@]}" --checkpoint-dir "$work/ck-e" --test-preempt-rank 1 \
  --test-preempt-at-step 12
if [ "$status" -eq 75 ] && has one_rank_asks "every rank stopped after step 13 of 40" &&
   [ -f ck-e/ckpt-0000000013.rtckpt ]; then
  pass "(e) rank 1 asked at step 12: every rank stopped after step 13, checkpoint 13, exit 75"
else
  fail "(e) one rank asks: exit $status: $(tail -n 8 one_rank_asks.log)"
fi
resume_and_compare "(e)" one_rank_resumed 2 "${short[@]}" --checkpoint-dir "$work/ck-e"
local_sgd=("${short[@]}" --strategy local-sgd --average-every 8)
run lsgd_full 120 2 "${local_sgd[@]}" --save-params "$work/full.bin"
run lsgd_asks 120 2 "${local_sgd[@]}" --checkpoint-dir "$work/ck-e2" --test-preempt-rank 0 \
  --test-preempt-at-step 12
if [ "$status" -eq 75 ] && has lsgd_asks "every rank stopped after step 16 of 40" &&
   [ -f ck-e2/ckpt-0000000016.rtckpt ]; then
  pass "(e) local SGD: asked at step 12, stopped at the next average (step 16), exit 75"
else
  fail "(e) local SGD: exit $status: $(tail -n 8 lsgd_asks.log)"
fi
resume_and_compare "(e) local SGD" lsgd_resumed 2 "${local_sgd[@]}" --checkpoint-dir "$work/ck-e2"

# ---- (f) nothing to save into ----
run no_dir 120 2 "${short[@]}" --test-preempt-rank 0 --test-preempt-at-step 3
if [ "$status" -eq 75 ] && has no_dir "nothing was saved (no --checkpoint-dir)"; then
  pass "(f) without --checkpoint-dir: exit 75, saying nothing was saved"
else
  fail "(f) without --checkpoint-dir: exit $status: $(tail -n 8 no_dir.log)"
fi

finish preemption
