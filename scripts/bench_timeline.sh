#!/usr/bin/env bash
# What --timeline costs: each config runs without and with --timeline alternately (off, on, off,
# on, ...) REPS times, and the table gives the median step time of each (the summary's step_ms)
# and the overhead of recording, with the exact command of each config.
#
# Usage: scripts/bench_timeline.sh [BUILD_DIR]   (holding mnist_train; default build)
#   REPS=7      runs per side and config
#   DATA_DIR    --data-dir for mnist_train (default: its own default, Fashion-MNIST)
set -euo pipefail
build=${1:-build}
REPS=${REPS:-7}
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

configs=(
  "2|--model mlp --batch-size 32 --steps 400"
  "2|--model cnn --batch-size 32 --steps 150"
  "2|--model mlp --hidden 4096,4096 --batch-size 32 --steps 30 --overlap on"
)
echo "| ranks | config | step ms without (median of $REPS) | step ms with --timeline | overhead |"
echo "|---|---|---|---|---|"
for entry in "${configs[@]}"; do
  np=${entry%%|*} flags=${entry#*|}
  for side in off on; do : >"$work/$side.txt"; done
  for ((r = 0; r < REPS; ++r)); do
    for side in off on; do
      extra=()
      [[ $side == on ]] && extra=(--timeline "$work/t.json")
      # shellcheck disable=SC2086
      timeout 600 "${mpi[@]}" -np "$np" "$build/mnist_train" $flags "${data[@]}" --log-every 0 \
        --seed 5 --metrics-out "$work/m.jsonl" "${extra[@]}" >"$work/log" 2>&1 ||
        { echo "failed: mnist_train $flags ${extra[*]}" >&2; tail -5 "$work/log" >&2; exit 1; }
      field "$work/m.jsonl" step_ms >>"$work/$side.txt"
    done
  done
  off=$(median <"$work/off.txt") on=$(median <"$work/on.txt")
  printf '| %s | `mpirun -np %s mnist_train %s` | %.3f | %.3f | %+.1f%% |\n' "$np" "$np" "$flags" \
    "$off" "$on" "$(awk -v a="$on" -v b="$off" 'BEGIN {print (a / b - 1) * 100}')"
  echo "  off: $(tr '\n' ' ' <"$work/off.txt")" >&2
  echo "  on:  $(tr '\n' ' ' <"$work/on.txt")" >&2
done
