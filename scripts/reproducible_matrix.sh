#!/usr/bin/env bash
# The full --reproducible matrix (tests/reproducible_test.sh runs a shorter one in CI): the mlp
# and the cnn, SGD with momentum and Adam, overlap on and off, np = 1, 2, 3, 4 and 6 at global
# batch 96 and --micro-batch 8, STEPS steps each; prints one line per configuration with the
# md5 of every rank count's --save-params and whether they are all the same bits.
#
# Usage: scripts/reproducible_matrix.sh BUILD_DIR     (STEPS=200; DATA_DIR as for mnist_train)
set -euo pipefail
build=$1
STEPS=${STEPS:-200}
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
echo "| model | optimizer | overlap | np=1 | np=2 | np=3 | np=4 | np=6 | same bits |"
echo "|---|---|---|---|---|---|---|---|---|"
for model in mlp cnn; do
  for opt in "sgd --momentum 0.9 --lr 0.05" "adam --lr 0.001"; do
    for overlap in on off; do
      sums=()
      for np in 1 2 3 4 6; do
        # shellcheck disable=SC2086
        timeout 1800 "${mpi[@]}" -np "$np" "$build/mnist_train" --model "$model" --optimizer $opt \
          --reproducible --global-batch-size 96 --micro-batch 8 --steps "$STEPS" --seed 5 \
          --overlap "$overlap" --log-every 0 --eval-batch 10000 "${data[@]}" \
          --save-params "$work/p.bin" >"$work/log" 2>&1 ||
          { echo "failed: $model $opt np=$np" >&2; tail -5 "$work/log" >&2; exit 1; }
        sums+=("$(md5sum <"$work/p.bin" | cut -c1-12)")
      done
      same=yes
      for s in "${sums[@]}"; do [[ $s == "${sums[0]}" ]] || same=no; done
      printf '| %s | %s | %s | %s | %s |\n' "$model" "${opt%% *}" "$overlap" \
        "$(IFS='|'; echo "${sums[*]}" | sed 's/|/ | /g')" "$same"
    done
  done
done
