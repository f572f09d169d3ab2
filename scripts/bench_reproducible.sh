#!/usr/bin/env bash
# What --reproducible costs: each model at a fixed global batch on NP ranks, the default mode
# and --reproducible at a few --micro-batch sizes, run alternately REPS times; prints a markdown
# table of medians (images/s, ms/step, the averaging's ms/step) with the ratio to the default
# mode, and the bytes each rank sends per step for the gradients (the summary's
# wire_bytes_per_step, what the ring counted: 2 (N-1)/N of the buffer at 4 bytes an element in
# the default mode; under --reproducible 8 bytes in the scatter-reduce and 4 in the allgather,
# plus N-1 ints per gradient segment for the scales, counted as a ring allgather sends them).
#
# Usage: scripts/bench_reproducible.sh BUILD_DIR
#   REPS=3   runs per mode and model
#   NP=2     ranks
#   DATA_DIR --data-dir for mnist_train (default: its own default, Fashion-MNIST)
set -euo pipefail
build=$1
REPS=${REPS:-3}
NP=${NP:-2}
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

models=(
  "mlp|--model mlp --global-batch-size 128 --steps 300"
  "cnn|--model cnn --global-batch-size 256 --steps 30"
  "wide mlp|--model mlp --hidden 4096,4096 --global-batch-size 128 --steps 20"
)
modes=("default|" "m=8|--reproducible --micro-batch 8" "m=32|--reproducible --micro-batch 32")

echo "| model (np=$NP) | mode | images/s (median of $REPS) | ms/step | averaging ms/step | vs default | gradient bytes sent per rank per step |"
echo "|---|---|---|---|---|---|---|"
for entry in "${models[@]}"; do
  name=${entry%%|*} flags=${entry#*|}
  for mode in "${modes[@]}"; do : >"$work/${mode%%|*}.ips"; : >"$work/${mode%%|*}.ms"; : >"$work/${mode%%|*}.comm"; done
  for ((r = 0; r < REPS; ++r)); do
    for mode in "${modes[@]}"; do
      tag=${mode%%|*} extra=${mode#*|}
      # shellcheck disable=SC2086
      timeout 900 "${mpi[@]}" -np "$NP" "$build/mnist_train" $flags $extra "${data[@]}" \
        --log-every 0 --eval-batch 10000 --seed 5 --metrics-out "$work/m.jsonl" >"$work/log" 2>&1 ||
        { echo "failed: mnist_train $flags $extra" >&2; tail -5 "$work/log" >&2; exit 1; }
      field "$work/m.jsonl" images_per_sec >>"$work/$tag.ips"
      field "$work/m.jsonl" step_ms >>"$work/$tag.ms"
      field "$work/m.jsonl" comm_ms >>"$work/$tag.comm"
      field "$work/m.jsonl" wire_bytes_per_step >"$work/$tag.bytes"
    done
  done
  base=$(median <"$work/default.ips")
  for mode in "${modes[@]}"; do
    tag=${mode%%|*}
    ips=$(median <"$work/$tag.ips") ms=$(median <"$work/$tag.ms") comm=$(median <"$work/$tag.comm")
    bytes=$(awk '{printf "%.0f", $1}' "$work/$tag.bytes")
    [[ $bytes == -1 ]] && bytes="not counted"
    printf '| %s | %s | %.0f | %.2f | %.2f | %.2fx the time | %s |\n' "$name" "$tag" "$ips" "$ms" \
      "$comm" "$(awk -v a="$ips" -v b="$base" 'BEGIN {print b / a}')" "$bytes"
  done
done
