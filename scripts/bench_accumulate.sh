#!/usr/bin/env bash
# Gradient accumulation's cost (docs/overlap.md, "Gradient accumulation"): the mlp on 2 ranks,
# the same global batch of 256 per optimizer step as 1 pass of 128, 4 of 32 or 8 of 16 per rank,
# 60 steps, overlap on, REPS interleaved repetitions; prints one line per run:
#   batch passes rep step_ms compute_ms comm_ms exposed_comm_ms images_per_sec test_accuracy
# Usage: scripts/bench_accumulate.sh [BUILD_DIR]   (REPS, default 3)
set -euo pipefail
build=${1:-build}
reps=${REPS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
for rep in $(seq "$reps"); do
  for config in "128 1" "32 4" "16 8"; do
    read -r batch passes <<<"$config"
    metrics="$work/m_${batch}_${passes}_$rep.jsonl"
    timeout 300 "${mpi[@]}" -np 2 "$build/mnist_train" --steps 60 --batch-size "$batch" \
      --accumulate-steps "$passes" --overlap on --device cpu --log-every 0 \
      --metrics-out "$metrics" >"$work/log" 2>&1
    echo "$batch $passes $rep $(python3 "$(dirname "$0")/summary_field.py" "$metrics" step_ms \
      compute_ms comm_ms exposed_comm_ms images_per_sec test_accuracy)"
  done
done
