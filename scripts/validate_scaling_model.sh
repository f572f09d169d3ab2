#!/usr/bin/env bash
# The step model (scripts/scaling_model.py) against measurement on the emulated cluster
# (scripts/netns_cluster.sh: one network namespace per rank, rate-limited links, Open MPI over
# TCP). For each link rate (and added delay, where the kernel can add one) and each N, on that
# cluster it
#   1. measures the link: allreduce_bench sweeps (ring, 16 KiB to 16 MiB), once waiting as
#      mnist_train's main thread waits (the library's 1 ms spin: --overlap off) and once as its
#      overlap thread does (--spin-us 50: --overlap on);
#   2. measures the step with --overlap on and off (--timeline: the median step), in rounds;
#   3. takes each model's compute profile from its --overlap off runs: data, forward, backward,
#      each bucket's ready time, optimizer, each step's figures those of the rank the ring waits
#      for (the slowest to finish backward); their communication is not an input;
#   4. predicts each step from 1 and 3 alone (scripts/scaling_validation.py): the link fitted
#      to the sweep rows around the model's bucket sizes, of this N alone and of every N at once.
# It writes docs/scaling-validation.md (OUT) with one row per configuration and, last, a line
# `max relative error X`, and a CSV beside it.
#
# Usage: scripts/validate_scaling_model.sh [BUILD_DIR]    (root; about 15 minutes)
#   RATES="1gbit 10gbit"  RANKS="2 3 4"  MODELS="mlp cnn wide"
#   DELAYS="0 100us 1ms"  one-way delays; a delay the kernel cannot add (no sch_netem) is
#                         skipped and the report says so
#   ROUNDS=3              runs of each kind per configuration, interleaved
#   RINGTRAIN_DATA        data (default ../shared/data/mnist, else Fashion-MNIST)
#   OUT                   the report (default docs/scaling-validation.md); it and its CSV are
#                         written only when the run completes
#   KEEP=DIR              keep the traces, profiles and sweeps behind every figure in DIR
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build}"
out_md="${OUT:-$repo/docs/scaling-validation.md}"
out_csv="${out_md%.md}.csv"
rates="${RATES:-1gbit 10gbit}"
ranks_list="${RANKS:-2 3 4}"
models="${MODELS:-mlp cnn wide}"
delays="${DELAYS:-0 100us 1ms}"
rounds="${ROUNDS:-3}"
model_py="$repo/scripts/scaling_model.py"
net="$repo/scripts/netns_cluster.sh"
log() { echo "[validate_scaling_model] $*" >&2; }

if [[ -n "${RINGTRAIN_DATA:-}" ]]; then data="$RINGTRAIN_DATA"
elif [[ -d "$repo/../shared/data/mnist" ]]; then data="$(cd "$repo/../shared/data/mnist" && pwd)"
else data=/usr/share/datasets/fashion-mnist; fi
for exe in mnist_train allreduce_bench; do
  [[ -x "$build/$exe" ]] || { log "$build/$exe is missing: build first (scripts/build.sh) or pass BUILD_DIR"; exit 3; }
done
why=$(bash "$net" check 2>&1) || { log "the emulated cluster cannot run here: $why"; exit 3; }

[[ -d "$(dirname "$out_md")" ]] || { log "OUT=$out_md: the folder $(dirname "$out_md") does not exist"; exit 2; }
for model in $models; do
  case $model in mlp | cnn | wide) ;; *) log "MODELS: unknown model '$model' (mlp, cnn, wide)"; exit 2 ;; esac
done
if [[ -n "${KEEP:-}" ]]; then
  mkdir -p "$KEEP" && [[ -z "$(ls -A "$KEEP")" ]] || { log "KEEP=$KEEP must be an empty or new folder"; exit 2; }
  work="$(cd "$KEEP" && pwd)"
  trap 'bash "$net" down >/dev/null 2>&1 || true' EXIT
else
  work="$(mktemp -d)"
  trap 'bash "$net" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
fi
stamp="$(date -u '+%Y-%m-%d %H:%M UTC'), ringtrain $(git -C "$repo" describe --always --dirty)"

# model flags|per-rank batch|steps (the first 3 are left out of every median)
model_spec() {
  case "$1" in
    mlp) echo "--model mlp|128|60" ;;
    cnn) echo "--model cnn|128|60" ;;
    wide) echo "--model mlp --hidden 4096,4096|128|11" ;;
    *) return 2 ;;  # MODELS is checked before anything runs
  esac
}
common=(--data-dir "$data" --optimizer sgd --momentum 0.9 --lr 0.01 --threads 1 --log-every 0
  --eval-batch 2000 --seed 1)
root=()
[[ "$(id -u)" -eq 0 ]] && root=(--allow-run-as-root)

# train NP OVERLAP MODEL TRACE [mpirun args...]
train() {
  local np=$1 overlap=$2 model=$3 trace=$4
  shift 4
  IFS='|' read -r flags batch steps <<<"$(model_spec "$model")"
  # shellcheck disable=SC2086
  timeout 600 mpirun "${root[@]}" --oversubscribe --bind-to none "$@" -np "$np" \
    "$build/mnist_train" "${common[@]}" $flags --batch-size "$batch" --steps "$steps" \
    --overlap "$overlap" --timeline "$trace" >"$work/train.log" 2>&1 ||
    { log "mnist_train -np $np $flags --overlap $overlap failed:"; tail -5 "$work/train.log" >&2; return 1; }
}

csv="$work/validation.csv"
echo "rate,delay,ranks,model,overlap,measured_ms,compute_ms,predicted_ms,error,predicted_one_link_ms,error_one_link,alpha_us,bandwidth_gbps,fit_rows,fit_error" >"$csv"
skipped=()
for rate in $rates; do
  for delay in $delays; do
    measured=""
    for np in $ranks_list; do
      if ! bash "$net" up "$np" --rate "$rate" --delay "$delay" >"$work/up.log" 2>&1; then
        # Only a delay this kernel cannot add is a skip; any other failure to make the cluster
        # is an error.
        grep -q "needs the kernel's netem qdisc" "$work/up.log" ||
          { log "netns_cluster.sh up $np --rate $rate --delay $delay failed:"; cat "$work/up.log" >&2; exit 1; }
        skipped+=("$rate, delay $delay: $(tail -1 "$work/up.log")")
        log "skipped: $(tail -1 "$work/up.log")"
        break
      fi
      measured+=" $np"
      read -ra netargs <<<"$(bash "$net" mpirun-args | tr '\n' ' ')"
      log "link: $rate, delay $delay, $np ranks"
      for spin in 1000 50; do
        timeout 600 mpirun "${netargs[@]}" -np "$np" "$build/allreduce_bench" -b 16K -e 16M -f 2 \
          -n 10 -w 2 -c 0 --repeats 3 --spin-us "$spin" \
          --csv "$work/bench-$rate-$delay-$np-spin$spin.csv" >"$work/bench.log" 2>&1 ||
          { log "allreduce_bench failed:"; tail -5 "$work/bench.log" >&2; exit 1; }
      done
      # Rounds of (overlap on, overlap off), so that a slow spell of the machine falls on both
      # kinds of run alike; each figure is the median over every kept step of its runs.
      for ((round = 1; round <= rounds; round++)); do
        for model in $models; do
          log "round $round: $model, $np ranks, $rate, delay $delay: overlap on, off"
          for overlap in on off; do
            train "$np" "$overlap" "$model" "$work/meas-$rate-$delay-$model-$np-$overlap-r$round.json" "${netargs[@]}"
          done
        done
      done
      # The compute profile: the --overlap off runs' compute parts (their communication, the
      # wait for the gradients, is not an input), each step's slowest rank.
      for model in $models; do
        python3 "$model_py" profile --rank slowest "$work/meas-$rate-$delay-$model-$np-off"-r*.json \
          >"$work/prof-$rate-$delay-$model-$np.profile"
      done
      bash "$net" down >/dev/null
    done
    [[ -n $measured ]] || continue
    python3 "$repo/scripts/scaling_validation.py" rows "$work" "$rate" "$delay" "$measured" "$models" >>"$csv"
  done
done

python3 "$repo/scripts/scaling_validation.py" report "$csv" "$stamp" "$data" \
  "$(printf '%s\n' "${skipped[@]+"${skipped[@]}"}")" >"$work/validation.md"
# Through fresh temporaries beside each output, renamed over it: a link there is replaced, not
# written through.
publish() {  # publish FROM TO
  local tmp
  tmp=$(mktemp "$(dirname "$2")/.$(basename "$2").XXXXXX")
  cp "$1" "$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$2"
}
publish "$csv" "$out_csv"
publish "$work/validation.md" "$out_md"
cat "$out_md"
log "wrote $out_md and $out_csv${KEEP:+; the runs behind them are in $work}"
