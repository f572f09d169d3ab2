#!/usr/bin/env bash
# Crash consistency (docs/failures.md, "What is never lost"): random kills, each followed by the
# same command with --resume auto. Every trial either SIGKILLs a random rank at a random moment,
# or makes the chief kill itself at a random point of a random checkpoint write (half the bytes
# written; written and fsync()ed but not named; named but the directory not fsync()ed; during the
# rotation); one trial in four kills the first resume as well. Every directory left behind must
# resume without skipping or setting aside anything (a file with a checkpoint's name is always a
# whole checkpoint), and every resumed run must end bitwise identical to the uninterrupted run.
# Prints the trial count and the distribution of what was killed and where each run resumed.
# CRASH_TRIALS (default 20) and CRASH_SEED (default: random, printed) repeat a run.
# Usage: crash_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"
trials=${CRASH_TRIALS:-20}
seed=${CRASH_SEED:-$(( $(date +%s) % 100000 ))}
RANDOM=$seed
echo "crash_test: $trials trials, CRASH_SEED=$seed"
common=(--steps 60 --batch-size 32 --log-every 5 --eval-batch 5000 --momentum 0.9 --ema-decay 0.99
        --lr-schedule exponential --lr-decay-steps 9 --seed 7 --checkpoint-every 5
        --keep-checkpoints 2)
points=(partial written placed rotating)

run full 120 2 "${common[@]}" --checkpoint-dir "$work/full-ckpt" --save-params "$work/full.bin"
[ "$status" -eq 0 ] || { fail "the uninterrupted run exited $status: $(tail -n 20 full.log)"; finish crash; }
# Random kills land anywhere in a run's life: start-up, training, checkpoint writes, the end.
full_ms=$(awk -v t="$took" 'BEGIN { printf "%d", t * 1000 }')

declare -A outcomes
count() { outcomes[$1]=$(( ${outcomes[$1]:-0} + 1 )); }

# kill_run NAME DIR AGAIN: one killed run, by a random kind of kill; records what happened.
# AGAIN=yes: the run resumes from the directory a first kill left.
kill_run() {
  local name=$1 dir=$2 again=$3
  if (( RANDOM % 2 )); then
    local delay_ms=$(( 200 + (RANDOM * 32768 + RANDOM) % (full_ms > 300 ? full_ms - 200 : 100) )) victims
    timeout -k 5 120 "$mpirun" "$np_flag" 2 "${mpi_flags[@]}" "$trainer" "${common[@]}" \
      --checkpoint-dir "$dir" </dev/null >"$name.log" 2>&1 &
    local pid=$!
    sleep "$(awk -v m="$delay_ms" 'BEGIN { printf "%.3f", m / 1000 }')"
    mapfile -t victims < <(pids_of "$trainer" "$work/ck-")
    if [ "${#victims[@]}" -gt 0 ]; then
      kill -KILL "${victims[$(( RANDOM % ${#victims[@]} ))]}" 2>/dev/null
    fi
    wait "$pid"
    status=$?
    if [ "$status" -eq 0 ]; then count "random SIGKILL: came after the run had finished"
    else count "random SIGKILL of a rank (exit $status)"; fi
  else
    local point=${points[$(( RANDOM % 4 ))]} step
    if [ "$point" = rotating ]; then step=$(( 15 + 5 * (RANDOM % 10) )); else step=$(( 5 + 5 * (RANDOM % 12) )); fi
    run "$name" 120 2 "${common[@]}" --checkpoint-dir "$dir" --test-kill-in-checkpoint "$point" \
      --test-kill-in-checkpoint-step "$step"
    if [ "$status" -ne 0 ]; then count "chief killed in the write of a checkpoint: $point"
    elif [ "$again" = yes ]; then count "second kill: its step was behind the resume point"
    else fail "$name: the chief was to die at '$point' of step $step's checkpoint, yet the run exited 0"; fi
  fi
  [ "$status" -eq 124 ] && fail "$name: the killed job hung: $(tail -n 5 "$name.log")"
}

for trial in $(seq "$trials"); do
  dir="$work/ck-$trial"
  kill_run "t$trial-killed" "$dir" no
  if (( RANDOM % 4 == 0 )); then
    kill_run "t$trial-killed-again" "$dir" yes
    count "trials with a second kill (during the first resume)"
  fi
  run "t$trial-resumed" 120 2 "${common[@]}" --checkpoint-dir "$dir" --save-params "$work/t$trial.bin"
  log="t$trial-resumed.log"
  from=$(grep -o 'resuming from [^ ]*: step [0-9]*' "$log" | grep -o '[0-9]*$')
  if [ "$status" -ne 0 ]; then
    fail "trial $trial: the resume exited $status: $(tail -n 10 "$log")"
  elif grep -qE 'skipping a checkpoint|set aside as' "$log"; then
    fail "trial $trial: the directory held a file with a checkpoint's name that was not a whole checkpoint: $(grep -E 'skipping|set aside' "$log" | head -n 3)"
  elif ! cmp -s full.bin "$work/t$trial.bin"; then
    fail "trial $trial: resumed from step ${from:-0}, but the parameters differ from the uninterrupted run"
  else
    count "resumed from step ${from:-0 (fresh start: no checkpoint yet)}"
  fi
done

echo "outcomes over $trials trials (CRASH_SEED=$seed):"
for key in "${!outcomes[@]}"; do printf '  %4d  %s\n' "${outcomes[$key]}" "$key"; done | sort -k2
[ "$failures" -eq 0 ] && pass "$trials trials: every directory resumed and every resumed run equals the uninterrupted one bitwise"
finish crash
