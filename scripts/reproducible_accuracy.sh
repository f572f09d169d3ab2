#!/usr/bin/env bash
# Does --reproducible train as well? Each model for EPOCHS epochs on NP ranks at a fixed global
# batch, the default mode and --reproducible --micro-batch M, with the same seed; prints a
# markdown table of the final test accuracy and the difference in points. One run each: the
# two are different trajectories (different rounding), so their difference is of the size of
# the run-to-run spread of any two seeds.
#
# Usage: scripts/reproducible_accuracy.sh BUILD_DIR
#   EPOCHS=5  NP=2  M=8  SEED=5
#   DATA_DIR  --data-dir for mnist_train (default: its own default, Fashion-MNIST)
set -euo pipefail
build=$1
EPOCHS=${EPOCHS:-5} NP=${NP:-2} M=${M:-8} SEED=${SEED:-5}
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

models=(
  "mlp|--model mlp --global-batch-size 128 --optimizer sgd --momentum 0.9 --lr 0.05"
  "cnn|--model cnn --global-batch-size 128 --optimizer adam --lr 0.001"
)
echo "| model (np=$NP, $EPOCHS epochs, seed $SEED) | default test accuracy | --reproducible --micro-batch $M | difference (points) |"
echo "|---|---|---|---|"
for entry in "${models[@]}"; do
  name=${entry%%|*} flags=${entry#*|}
  acc=()
  for extra in "" "--reproducible --micro-batch $M"; do
    # shellcheck disable=SC2086
    timeout 1800 "${mpi[@]}" -np "$NP" "$build/mnist_train" $flags $extra "${data[@]}" \
      --epochs "$EPOCHS" --log-every 0 --eval-batch 10000 --seed "$SEED" \
      --metrics-out "$work/m.jsonl" >"$work/log" 2>&1 ||
      { echo "failed: mnist_train $flags $extra" >&2; tail -5 "$work/log" >&2; exit 1; }
    acc+=("$(field "$work/m.jsonl" test_accuracy)")
    rm -f "$work/m.jsonl"
  done
  printf '| %s | %.4f | %.4f | %+.2f |\n' "$name" "${acc[0]}" "${acc[1]}" \
    "$(awk -v a="${acc[0]}" -v b="${acc[1]}" 'BEGIN {print 100 * (b - a)}')"
done
