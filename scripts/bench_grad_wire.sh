#!/usr/bin/env bash
# What --grad-wire bf16 / fp16 buy and cost (docs/benchmarks.md, "A 16-bit gradient wire"):
#  speed     the wide MLP (--model mlp --hidden 4096,4096) over the emulated cluster network of
#            scripts/netns_cluster.sh (one network namespace per rank, Open MPI over TCP, links
#            of each RATE), NP ranks, STEPS steps per run, --overlap off (so that comm_ms is the
#            averaging alone, not averaging slowed by backward on shared cores): step time,
#            communication time and bytes per step for fp32, bf16, fp16, and the ratios to fp32;
#            REPS runs of each, the wires interleaved, medians (the machine is shared).
#  accuracy  the test accuracy after EPOCHS epochs of the mlp and the cnn at np=NP_ACC on one
#            node (shared memory) with each wire, and its difference from fp32 in points.
# Prints markdown tables (stdout), each row with the exact command; progress on stderr.
#
# Usage: scripts/bench_grad_wire.sh BUILD_DIR [speed|accuracy|all]    (speed needs root)
#   RATES="1gbit 10gbit"  NPS="2 4"  STEPS=30  BATCH=128  REPS=1  (speed)
#   EPOCHS=5  NP_ACC=2  SEED=5                               (accuracy)
#   DATA_DIR  --data-dir for mnist_train (default: its own default)
set -euo pipefail
build=$(realpath "$1")
what=${2:-all}
RATES=${RATES:-1gbit 10gbit} NPS=${NPS:-2 4} STEPS=${STEPS:-30} BATCH=${BATCH:-128}
REPS=${REPS:-1}
EPOCHS=${EPOCHS:-5} NP_ACC=${NP_ACC:-2} SEED=${SEED:-5}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/bench_lib.sh
source "$repo/scripts/bench_lib.sh"
wires=(fp32 bf16 fp16)
# ratio A B: A / B to two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# stat RATE NP WIRE KEY: the median over the repetitions of KEY in the speed runs' summaries.
stat() {
  local rep
  for ((rep = 1; rep <= REPS; rep++)); do field "$work/speed-$1-$2-$3-$rep.jsonl" "$4"; done | median
}

speed() {
  local why
  if ! why=$(bash "$repo/scripts/netns_cluster.sh" check 2>&1); then
    echo "speed: skipped: $why" >&2
    return 0
  fi
  echo "| link | ranks | wire | step ms (median of $REPS) | comm ms (median) | comm / fp32 | MB sent per step | bound scan / allgather ms per step | command |"
  echo "|---|---|---|---|---|---|---|---|---|"
  local rate np
  for rate in $RATES; do
    for np in $NPS; do
      # One cluster per (rate, ranks); the three wires run inside it, one after another.
      local flags="--model mlp --hidden 4096,4096 --steps $STEPS --batch-size $BATCH --overlap off --device cpu --log-every 0 --eval-batch 10000 ${data[*]}"
      RINGTRAIN_BENCH_FLAGS=$flags \
      build=$build work=$work np=$np rate=$rate wires="${wires[*]}" reps=$REPS \
        bash "$repo/scripts/netns_cluster.sh" run "$np" --rate "$rate" -- bash -c '
          set -euo pipefail
          read -ra net <<<"$RINGTRAIN_NETNS_MPIRUN_ARGS"
          root=(); [[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
          for ((rep = 1; rep <= reps; rep++)); do
            for wire in $wires; do
              echo "speed: $rate, $np ranks, --grad-wire $wire, run $rep of $reps" >&2
              # shellcheck disable=SC2086
              timeout 1200 mpirun "${root[@]}" --oversubscribe "${net[@]}" -np "$np" \
                "$build/mnist_train" $RINGTRAIN_BENCH_FLAGS --grad-wire "$wire" \
                --metrics-out "$work/speed-$rate-$np-$wire-$rep.jsonl" >"$work/log" 2>&1 ||
                { echo "failed: $wire" >&2; tail -5 "$work/log" >&2; exit 1; }
            done
          done' >&2
      local base_comm comm
      base_comm=$(stat "$rate" "$np" fp32 comm_ms)
      for wire in "${wires[@]}"; do
        comm=$(stat "$rate" "$np" "$wire" comm_ms)
        printf '| %s | %s | %s | %.1f | %.1f | %s | %.2f | %.2f / %.2f | `mpirun --oversubscribe $(scripts/netns_cluster.sh mpirun-args) -np %s %s/mnist_train %s --grad-wire %s` |\n' \
          "$rate" "$np" "$wire" "$(stat "$rate" "$np" "$wire" step_ms)" "$comm" \
          "$(ratio "$comm" "$base_comm")" \
          "$(awk -v b="$(stat "$rate" "$np" "$wire" wire_bytes_per_step)" 'BEGIN { print b / 1e6 }')" \
          "$(stat "$rate" "$np" "$wire" bound_scan_ms)" "$(stat "$rate" "$np" "$wire" bound_exchange_ms)" "$np" "$build" "$flags" "$wire"
      done
    done
  done
}

accuracy() {
  local models=(
    "mlp|--model mlp --global-batch-size 128 --optimizer sgd --momentum 0.9 --lr 0.05"
    "cnn|--model cnn --global-batch-size 128 --optimizer adam --lr 0.001"
  )
  echo "| model (np=$NP_ACC, $EPOCHS epochs, seed $SEED) | wire | test accuracy | vs fp32 (points) | command |"
  echo "|---|---|---|---|---|"
  local entry name flags wire acc base
  for entry in "${models[@]}"; do
    name=${entry%%|*} flags=${entry#*|}
    for wire in "${wires[@]}"; do
      echo "accuracy: $name --grad-wire $wire" >&2
      # shellcheck disable=SC2086
      timeout 3600 "${mpi[@]}" -np "$NP_ACC" "$build/mnist_train" $flags "${data[@]}" \
        --device cpu --epochs "$EPOCHS" --log-every 0 --eval-batch 10000 --seed "$SEED" \
        --grad-wire "$wire" --metrics-out "$work/acc.jsonl" >"$work/log" 2>&1 ||
        { echo "failed: mnist_train $flags --grad-wire $wire" >&2; tail -5 "$work/log" >&2; exit 1; }
      acc=$(field "$work/acc.jsonl" test_accuracy)
      rm -f "$work/acc.jsonl"
      [[ $wire == fp32 ]] && base=$acc
      printf '| %s | %s | %.4f | %+.2f | `%s -np %s %s/mnist_train %s %s --device cpu --epochs %s --log-every 0 --eval-batch 10000 --seed %s --grad-wire %s` |\n' \
        "$name" "$wire" "$acc" "$(awk -v a="$base" -v b="$acc" 'BEGIN { print 100 * (b - a) }')" \
        "${mpi[*]}" "$NP_ACC" "$build" "$flags" "${data[*]}" "$EPOCHS" "$SEED" "$wire"
    done
  done
}

case $what in
  speed) speed ;;
  accuracy) accuracy ;;
  all) speed; echo; accuracy ;;
  *) echo "usage: $0 BUILD_DIR [speed|accuracy|all]" >&2; exit 2 ;;
esac
