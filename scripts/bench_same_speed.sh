#!/usr/bin/env bash
# Two builds side by side: does a change keep ringtrain's speed? Runs each training config
# with the BEFORE and the AFTER build alternately (before, after, before, after, ...) REPS
# times on the same data, and the allreduce bench likewise, and prints a markdown table of
# medians with the after/before ratio. Both builds must take the same flags.
#
# Usage: scripts/bench_same_speed.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR
#   (each holding mnist_train and allreduce_bench)
#   REPS=3            runs per build and config
#   DATA_DIR          --data-dir for mnist_train (default: its own default, Fashion-MNIST)
set -euo pipefail
before=$1 after=$2
REPS=${REPS:-3}
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

configs=(
  "1|--model mlp --batch-size 64 --steps 300"
  "1|--model cnn --batch-size 64 --steps 60"
  "2|--model mlp --batch-size 32 --steps 300 --overlap on"
  "2|--model mlp --batch-size 32 --steps 300 --overlap off --allreduce mpi"
  "2|--model mlp --hidden 1024,1024 --batch-size 32 --steps 100"
  "2|--model mlp --batch-size 32 --steps 300 --strategy local-sgd --average-every 4"
)
echo "| ranks | config | before images/s (median of $REPS) | after images/s | after / before |"
echo "|---|---|---|---|---|"
for entry in "${configs[@]}"; do
  np=${entry%%|*} flags=${entry#*|}
  for side in before after; do : >"$work/$side.txt"; done
  for ((r = 0; r < REPS; ++r)); do
    for side in before after; do
      dir=$before
      [[ $side == after ]] && dir=$after
      # shellcheck disable=SC2086
      timeout 600 "${mpi[@]}" -np "$np" "$dir/mnist_train" $flags "${data[@]}" --log-every 0 \
        --seed 5 --metrics-out "$work/m.jsonl" >"$work/log" 2>&1 ||
        { echo "failed: $dir/mnist_train $flags" >&2; tail -5 "$work/log" >&2; exit 1; }
      field "$work/m.jsonl" images_per_sec >>"$work/$side.txt"
    done
  done
  b=$(median <"$work/before.txt") a=$(median <"$work/after.txt")
  printf '| %s | `%s` | %.0f | %.0f | %.3f |\n' "$np" "$flags" "$b" "$a" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN {print a / b}')"
done

# The allreduce bench, 2 ranks: the busbw of the ring at a few sizes, medians of REPS runs.
echo
echo "| allreduce_bench np=2, ring | before busbw GB/s | after busbw GB/s | after / before |"
echo "|---|---|---|---|"
for side in before after; do : >"$work/$side.csv"; done
for ((r = 0; r < REPS; ++r)); do
  for side in before after; do
    dir=$before
    [[ $side == after ]] && dir=$after
    timeout 600 "${mpi[@]}" -np 2 "$dir/allreduce_bench" -b 64K -e 64M -f 16 -n 20 --repeats 3 \
      --csv "$work/r.csv" >/dev/null 2>&1 || { echo "failed: $dir/allreduce_bench" >&2; exit 1; }
    tail -n +2 "$work/r.csv" >>"$work/$side.csv"
  done
done
header=$(head -n 1 "$work/r.csv")
size_col=$(tr ',' '\n' <<<"$header" | grep -n '^size_bytes$' | cut -d: -f1)
bus_col=$(tr ',' '\n' <<<"$header" | grep -n '^busbw_gbps$' | cut -d: -f1)
for size in $(cut -d, -f"$size_col" "$work/before.csv" | sort -un); do
  b=$(awk -F, -v s="$size" -v c="$bus_col" -v k="$size_col" '$k == s {print $c}' "$work/before.csv" | median)
  a=$(awk -F, -v s="$size" -v c="$bus_col" -v k="$size_col" '$k == s {print $c}' "$work/after.csv" | median)
  printf '| %s bytes | %.3f | %.3f | %.3f |\n' "$size" "$b" "$a" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN {print (b > 0 ? a / b : 0)}')"
done
