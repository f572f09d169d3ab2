#!/usr/bin/env bash
# What --timeline costs. Each config runs without and with --timeline REPS times, in pairs run
# back to back (the order alternating: off-on, on-off, ...), so that a change in the machine's
# load between pairs cancels in each pair's ratio. The table gives the median step time of each
# side (the summary's step_ms), the median of the pairs' ratios with their range, and the cost
# the recording itself logs (events per step on rank 0 times the cost of one record, measured by
# mnist_train at start-up), with the exact command of each config.
#
# Usage: scripts/bench_timeline.sh [BUILD_DIR]   (holding mnist_train; default build)
#   REPS=9      pairs per config
#   DATA_DIR    --data-dir for mnist_train (default: its own default, Fashion-MNIST)
set -euo pipefail
build=${1:-build}
REPS=${REPS:-9}
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

configs=(
  "2|--model mlp --batch-size 32 --steps 400"
  "2|--model cnn --batch-size 32 --steps 150"
  "2|--model mlp --hidden 4096,4096 --batch-size 32 --steps 20 --overlap on"
)
echo "| command | step ms without (median of $REPS) | with --timeline | with / without: median of pairs (min-max) | recording's own cost per step (as logged) |"
echo "|---|---|---|---|---|"
run_side() {  # run_side off|on FLAGS...: one run; appends its step_ms to $work/SIDE.txt
  local side=$1
  shift
  local extra=()
  [[ $side == on ]] && extra=(--timeline "$work/t.json")
  timeout 600 "${mpi[@]}" -np "$np" "$build/mnist_train" "$@" "${data[@]}" --log-every 0 \
    --seed 5 --metrics-out "$work/m.jsonl" "${extra[@]}" >"$work/log" 2>&1 ||
    { echo "failed: mnist_train $* ${extra[*]}" >&2; tail -5 "$work/log" >&2; exit 1; }
  field "$work/m.jsonl" step_ms >>"$work/$side.txt"
  [[ $side == on ]] && grep -o 'recording cost: .*' "$work/log" | grep -o '= [0-9.]* us' |
    grep -o '[0-9.]*' >>"$work/cost.txt"
  return 0
}
for entry in "${configs[@]}"; do
  np=${entry%%|*} flags=${entry#*|}
  : >"$work/off.txt" && : >"$work/on.txt" && : >"$work/cost.txt"
  for ((r = 0; r < REPS; ++r)); do
    order=(off on)
    ((r % 2 == 1)) && order=(on off)
    # shellcheck disable=SC2086
    for side in "${order[@]}"; do run_side "$side" $flags; done
  done
  off=$(median <"$work/off.txt") on=$(median <"$work/on.txt")
  paste "$work/on.txt" "$work/off.txt" | awk '{print $1 / $2}' >"$work/ratio.txt"
  ratio=$(median <"$work/ratio.txt")
  lo=$(sort -g "$work/ratio.txt" | head -n 1) hi=$(sort -g "$work/ratio.txt" | tail -n 1)
  cost=$(median <"$work/cost.txt")
  printf '| `mpirun -np %s mnist_train %s` | %.3f | %.3f | %.3f (%.3f-%.3f) | %.2f us = %.3f%% of the step |\n' \
    "$np" "$flags" "$off" "$on" "$ratio" "$lo" "$hi" "$cost" \
    "$(awk -v c="$cost" -v s="$off" 'BEGIN {print c / (s * 1000) * 100}')"
  echo "  $flags: off $(tr '\n' ' ' <"$work/off.txt")/ on $(tr '\n' ' ' <"$work/on.txt")" >&2
done
