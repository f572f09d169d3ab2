#!/usr/bin/env bash
# Failures under mpirun, as an operator meets them (docs/failures.md):
#  (a) a run interrupted at step 25 (rank 1 throws) and resumed from its checkpoint ends with
#      parameters bitwise identical to an uninterrupted run; the failing rank takes the whole
#      job down, named, with a non-zero exit;
#  (b) a corrupt newest checkpoint is skipped with a warning, the one before is used, and the
#      result is still bitwise identical;
#  (c) a resume on another rank count keeps the global batch, or is refused when it cannot;
#  (d) a rank killed with SIGKILL mid-training ends the job within the bound, named, and the
#      newest checkpoint still loads and resumes;
#  (e) a rank with a different configuration is refused before any training;
#  (f) a stalled rank trips the watchdog, whose report names it (ring and MPI_Allreduce);
#  (g) --check-finite skips steps with NaN identically on all ranks, and stops after M in a row.
# Usage: failure_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"
# Same settings for every run of (a)-(c): momentum, EMA and a decaying rate, so that the
# optimizer state, the EMA and the schedule must all be restored for the bits to match.
common=(--steps 40 --log-every 10 --eval-batch 5000 --momentum 0.9 --ema-decay 0.99
        --lr-schedule exponential --lr-decay-steps 7 --seed 3)
base=("${common[@]}" --batch-size 32)

# ---- (a) interrupted and resumed == uninterrupted ----
run full 120 2 "${base[@]}" --save-params "$work/full.bin"
[ "$status" -eq 0 ] || fail "(a) the uninterrupted run exited $status: $(tail -n 20 full.log)"
run broken 120 2 "${base[@]}" --checkpoint-dir "$work/ckpt" --checkpoint-every 10 \
  --test-fail-rank 1 --test-fail-at-step 25
if [ "$status" -ne 0 ] && has broken "rank 1 of 2 failed; ending the whole job" &&
   has broken "fails on purpose at step 25"; then
  pass "(a) an exception on rank 1 ended the job (exit $status, ${took} s), naming rank 1"
else
  fail "(a) the failing run: exit $status, expected non-zero naming rank 1: $(tail -n 20 broken.log)"
fi
ls ckpt | tr '\n' ' ' | grep -q "ckpt-0000000010.rtckpt ckpt-0000000020.rtckpt" ||
  fail "(a) expected checkpoints at steps 10 and 20, found: $(ls ckpt)"
cp -r ckpt ckpt-copy  # for (b) and (c)
run resumed 120 2 "${base[@]}" --checkpoint-dir "$work/ckpt" --checkpoint-every 10 \
  --save-params "$work/resumed.bin"
if [ "$status" -eq 0 ] && has resumed "resuming from $work/ckpt/ckpt-0000000020.rtckpt" &&
   cmp -s full.bin resumed.bin; then
  pass "(a) resumed at step 20: parameters bitwise identical to the uninterrupted run"
else
  fail "(a) resume: exit $status, identical=$(cmp -s full.bin resumed.bin && echo yes || echo no): $(tail -n 20 resumed.log)"
fi
grep -q '"start_step":20' resumed.jsonl || fail "(a) the metrics summary lacks start_step 20"

# ---- (b) a corrupt newest checkpoint falls back to the one before ----
cp -r ckpt-copy ckpt-b
printf '\xff\xff\xff\xff' | dd of=ckpt-b/ckpt-0000000020.rtckpt bs=1 seek=5000 conv=notrunc 2>/dev/null
run fallback 120 2 "${base[@]}" --checkpoint-dir "$work/ckpt-b" --save-params "$work/fallback.bin"
if [ "$status" -eq 0 ] && has fallback "skipping a checkpoint" && has fallback "checksum mismatch" &&
   has fallback "resuming from $work/ckpt-b/ckpt-0000000010.rtckpt" && cmp -s full.bin fallback.bin; then
  pass "(b) the corrupt step-20 checkpoint was skipped with a warning; resumed at 10, bitwise identical"
else
  fail "(b) fallback: exit $status: $(tail -n 20 fallback.log)"
fi

# ---- (c) another rank count ----
cp -r ckpt-copy ckpt-c1
run one_rank 120 1 "${common[@]}" --checkpoint-dir "$work/ckpt-c1"
if [ "$status" -eq 0 ] && has one_rank "batch 64 = global batch 64" && has one_rank "resuming a 2-rank checkpoint on 1 ranks"; then
  pass "(c) a 2-rank checkpoint resumed on 1 rank with the global batch kept (64)"
else
  fail "(c) 1-rank resume: exit $status: $(tail -n 20 one_rank.log)"
fi
cp -r ckpt-copy ckpt-c3
run three_ranks 120 3 "${common[@]}" --checkpoint-dir "$work/ckpt-c3"
if [ "$status" -eq 3 ] && has three_ranks "3 ranks cannot share evenly"; then
  pass "(c) a resume on 3 ranks (global batch 64) was refused, exit 3"
else
  fail "(c) 3-rank resume: exit $status, expected 3 and 'cannot share evenly': $(tail -n 20 three_ranks.log)"
fi
run explicit 120 1 "${base[@]}" --checkpoint-dir "$work/ckpt-c3"
if [ "$status" -eq 3 ] && has explicit "pass --batch-size 64"; then
  pass "(c) an explicit --batch-size that changes the global batch was refused, exit 3"
else
  fail "(c) explicit batch: exit $status: $(tail -n 20 explicit.log)"
fi

# ---- (d) SIGKILL on rank 1 in the middle of training ----
run_killed() {
  run killed 120 3 --steps 1000000 --batch-size 32 --log-every 1000 --checkpoint-dir "$work/ckpt-d" \
    --checkpoint-every 20 --keep-checkpoints 2
}
run_killed &
launcher=$!
for _ in $(seq 300); do
  compgen -G "ckpt-d/*.rtckpt" >/dev/null && break
  sleep 0.1
done
victim=""
for pid in $(pgrep -f "ckpt-d --checkpoint-every"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1; then victim=$pid; fi
done
if [ -z "$victim" ]; then
  fail "(d) could not find rank 1's process"
  kill "$launcher" 2>/dev/null
  wait "$launcher"
else
  sleep 0.3  # well into training, between checkpoints
  kill_time=$(date +%s.%N)
  kill -9 "$victim"
  wait "$launcher"
  ended=$(awk -v s="$kill_time" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  if grep -q "process rank 1 .* exited on signal 9" killed.log && awk -v t="$ended" 'BEGIN { exit !(t < 30) }'; then
    pass "(d) SIGKILL on rank 1: the job ended ${ended} s later, naming rank 1"
  else
    fail "(d) after SIGKILL: ended after ${ended} s: $(tail -n 20 killed.log)"
  fi
  newest=$(ls ckpt-d | sort | tail -n 1)
  step=$((10#$(sed 's/ckpt-\([0-9]*\).rtckpt/\1/' <<<"$newest")))
  run after_kill 120 3 --steps $((step + 20)) --batch-size 32 --log-every 10 --checkpoint-dir "$work/ckpt-d"
  if [ "$status" -eq 0 ] && has after_kill "resuming from $work/ckpt-d/$newest: step $step" &&
     has after_kill "20 steps (resumed at step $step)"; then
    pass "(d) the newest checkpoint ($newest) loaded and the run finished 20 more steps"
  else
    fail "(d) resume after the kill: exit $status: $(tail -n 20 after_kill.log)"
  fi
fi

# ---- (e) a configuration that differs on one rank is refused before training ----
timeout -k 5 120 "$mpirun" "$np_flag" 1 "${mpi_flags[@]}" "$trainer" --steps 20 --batch-size 32 \
  --checkpoint-dir "$work/ckpt-e" --checkpoint-every 5 : \
  "$np_flag" 1 "$trainer" --steps 20 --batch-size 16 --checkpoint-dir "$work/ckpt-e" \
  --checkpoint-every 5 </dev/null >mismatch.log 2>&1
status=$?
if [ "$status" -eq 3 ] && has mismatch "--batch-size: rank 0 has '32'; rank 1 has '16'" &&
   ! grep -q "step [0-9]*/20" mismatch.log && ! compgen -G "ckpt-e/*.rtckpt" >/dev/null; then
  pass "(e) a rank with another --batch-size was refused before training, exit 3"
else
  fail "(e) mismatch: exit $status: $(tail -n 20 mismatch.log)"
fi

# ---- (f) a stalled rank trips the watchdog ----
for allreduce in ring mpi; do
  run "stall_$allreduce" 60 3 --steps 40 --batch-size 32 --log-every 0 --allreduce "$allreduce" \
    --collective-timeout 3 --test-stall-rank 1 --test-stall-at-step 5 --test-stall-seconds 100
  if [ "$status" -eq 4 ] && has "stall_$allreduce" "watchdog: the gradient allreduce at step 5" &&
     has "stall_$allreduce" "not reached by rank(s) 1" &&
     has "stall_$allreduce" "rank 1: step 5, not in a collective" &&
     awk -v t="$took" 'BEGIN { exit !(t < 30) }'; then
    pass "(f) --allreduce $allreduce: rank 1 stalled; the watchdog named it and ended the job in ${took} s, exit 4"
  else
    fail "(f) --allreduce $allreduce stall: exit $status after ${took} s: $(tail -n 20 "stall_$allreduce.log")"
  fi
done

# ---- (g) --check-finite ----
run finite 120 2 --steps 12 --batch-size 32 --log-every 4 --check-finite --check-replicas 2 \
  --test-nan-rank 1 --test-nan-steps 3,4
if [ "$status" -eq 0 ] && has finite "step 3: NaN or Inf in the loss on rank(s) 1; the update is skipped on every rank" &&
   has finite "2 update(s) skipped" && grep -q '"skipped_steps":2' finite.jsonl; then
  pass "(g) two NaN steps on rank 1 were skipped on both ranks; the replicas stayed identical"
else
  fail "(g) --check-finite skip: exit $status: $(tail -n 20 finite.log)"
fi
run finite_stop 120 2 --steps 12 --batch-size 32 --log-every 4 --check-finite --max-bad-steps 3 \
  --test-nan-rank 1 --test-nan-steps 3,4,5,6
if [ "$status" -eq 5 ] && has finite_stop "3 steps in a row"; then
  pass "(g) three NaN steps in a row stopped the job, exit 5"
else
  fail "(g) --check-finite stop: exit $status: $(tail -n 20 finite_stop.log)"
fi
run unguarded 120 2 --steps 12 --batch-size 32 --log-every 4 --test-nan-rank 1 --test-nan-steps 3
if [ "$status" -eq 5 ] && has unguarded "the loss became nan at step 3" && has unguarded "rank 1"; then
  pass "(g) without --check-finite a NaN loss ends the job naming the rank, exit 5"
else
  fail "(g) unguarded NaN: exit $status: $(tail -n 20 unguarded.log)"
fi

finish failure
