#!/usr/bin/env bash
# What the safety features cost, measured side by side in one run (the machine is shared and
# noisy: the variants are interleaved and the medians compared). 2 ranks, mlp, batch 128:
#   base      no guards
#   finite    --check-finite (one allgather of a flag and one pass over the gradients per step)
#   ckpt      --checkpoint-every 100 (rank 0 writes a checkpoint every 100 steps; images/s counts
#             the training steps only, so the write time is reported from the log instead)
# Usage: scripts/bench_guards.sh [--steps N] [--reps R]   (defaults 400 and 3)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=400 reps=3
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "bench_guards: unknown argument $1" >&2; exit 2 ;;
  esac
done
"$repo/scripts/build.sh" >/dev/null
trainer=$repo/build/mnist_train
mpi=(mpirun -np 2 --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A rates
for rep in $(seq "$reps"); do
  for variant in base finite ckpt; do
    extra=()
    case $variant in
      finite) extra=(--check-finite) ;;
      ckpt) rm -rf "$work/ckpt"; extra=(--checkpoint-dir "$work/ckpt" --checkpoint-every 100) ;;
    esac
    "${mpi[@]}" "$trainer" --steps "$steps" --batch-size 128 --log-every 0 --eval-batch 5000 \
      --metrics-out "$work/m.jsonl" "${extra[@]}" >"$work/$variant.$rep.log" 2>&1
    rate=$(tail -n 1 "$work/m.jsonl" | grep -o '"images_per_sec":[0-9.]*' | cut -d: -f2)
    rates[$variant]="${rates[$variant]:-} $rate"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
base=$(median <<<"${rates[base]}")
echo "| variant | images/s (median of $reps) | vs base |"
echo "|---|---|---|"
for variant in base finite ckpt; do
  m=$(median <<<"${rates[$variant]}")
  awk -v v="$variant" -v m="$m" -v b="$base" 'BEGIN { printf "| %s | %.0f | %.3f |\n", v, m, m / b }'
done
writes=$(cat "$work"/ckpt.*.log | grep -o "written to .* in [0-9]* ms" | awk '{print $(NF-1)}' | sort -g | tr '\n' ' ')
echo
echo "checkpoint writes (ms, all reps, sorted): $writes"
