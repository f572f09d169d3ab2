#!/usr/bin/env bash
# Accuracy benchmark: trains ringtrain (build/mnist_train) for ACC_EPOCHS epochs (default 5)
# on three tasks -- mlp on MNIST, cnn on MNIST, mlp on Fashion-MNIST -- with the settings
# below, reads the final test accuracy (full test set) from each run's --metrics-out summary
# line and writes a markdown table with the exact commands and the targets to $ACC_OUT
# (default docs/benchmarks-accuracy.md).  A task whose data is missing is skipped and
# reported as such.
#
# Usage: scripts/bench_accuracy.sh
#   RINGTRAIN_MNIST_DIR    MNIST IDX files (default ../shared/data/mnist, else data/mnist)
#   RINGTRAIN_FASHION_DIR  Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
#   ACC_EPOCHS=5           epochs per run (BENCH_QUICK=1 makes the default 1: a smoke test)
#   BENCH_THREADS=1        --threads for every run
#   MLP_ARGS / CNN_ARGS / FASHION_MLP_ARGS   override the settings below (one string each)
#   BUILD_DIR=build  ACC_OUT=docs/benchmarks-accuracy.md
set -euo pipefail

# ---- settings (tune here) ----
MLP_ARGS="${MLP_ARGS:---optimizer adam --lr 1e-3 --batch-size 128 --lr-schedule exponential --lr-decay-rate 0.6 --lr-decay-steps 468 --ema-decay 0.999}"
CNN_ARGS="${CNN_ARGS:---optimizer adam --lr 2e-3 --batch-size 128}"
FASHION_MLP_ARGS="${FASHION_MLP_ARGS:-$MLP_ARGS}"
if [[ "${BENCH_QUICK:-0}" == "1" ]]; then ACC_EPOCHS="${ACC_EPOCHS:-1}"; else ACC_EPOCHS="${ACC_EPOCHS:-5}"; fi
THREADS="${BENCH_THREADS:-1}"
SEED="${SEED:-42}"
# MNIST: $RINGTRAIN_MNIST_DIR, else the shared copy beside the checkout, else data/mnist
# (scripts/download_mnist.sh puts it there).
_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${RINGTRAIN_MNIST_DIR:-}" && -d "$_repo/../shared/data/mnist" ]]; then
  RINGTRAIN_MNIST_DIR="$(cd "$_repo/../shared/data/mnist" && pwd)"
fi
MNIST_DIR="${RINGTRAIN_MNIST_DIR:-$_repo/data/mnist}"
FASHION_DIR="${RINGTRAIN_FASHION_DIR:-/usr/share/datasets/fashion-mnist}"
# task name | model | data label | data dir | settings | target accuracy
TASKS=(
  "mlp-mnist|mlp|MNIST|$MNIST_DIR|$MLP_ARGS|0.978"
  "cnn-mnist|cnn|MNIST|$MNIST_DIR|$CNN_ARGS|0.983"
  "mlp-fashion|mlp|Fashion-MNIST|$FASHION_DIR|$FASHION_MLP_ARGS|0.88"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
ACC_OUT="${ACC_OUT:-$ROOT/docs/benchmarks-accuracy.md}"
PY="$(command -v python3 || echo /usr/bin/python3)"   # any python3 will do for JSON parsing
NCPU="$(env -u OMP_NUM_THREADS nproc)"

log() { echo "[bench_accuracy] $*" >&2; }

# ---- build ringtrain (Release) if needed ----
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh" >&2  # configures (Release) and builds
BIN="$BUILD_DIR/mnist_train"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# summary_field FILE FIELD: FIELD of the last {"event":"summary",...} line in FILE
summary_field() { "$PY" "$(dirname "${BASH_SOURCE[0]}")/summary_field.py" "$1" "$2"; }

has_idx() {  # DIR: does it hold the MNIST-format training images?
  [[ -f "$1/train-images-idx3-ubyte.gz" || -f "$1/train-images-idx3-ubyte" ]]
}

# ---- runs ----
ROWS="$WORK/rows.tsv"   # name, model, data, command, accuracy or "", target, seconds, img/s, note
: >"$ROWS"
for task in "${TASKS[@]}"; do
  IFS='|' read -r name model data dir settings target <<<"$task"
  read -ra settings_arr <<<"$settings"
  cmd=("$BIN" --data-dir "$dir" --model "$model" "${settings_arr[@]}" --epochs "$ACC_EPOCHS"
    --threads "$THREADS" --seed "$SEED" --log-every 0 --eval-every 0)
  shown="${cmd[*]}"
  shown="${shown//$ROOT\//}"
  if ! has_idx "$dir"; then
    log "SKIP $name: no $data IDX files in $dir (set the data dir variable to run it)"
    printf '%s\t%s\t%s\t%s\t\t%s\t\t\tskipped: no %s data in %s\n' \
      "$name" "$model" "$data" "$shown" "$target" "$data" "$dir" >>"$ROWS"
    continue
  fi
  log "$name: $shown"
  start=$SECONDS
  "${cmd[@]}" --metrics-out "$WORK/$name.jsonl" >"$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log" >&2; exit 1; }
  seconds=$((SECONDS - start))
  acc="$(summary_field "$WORK/$name.jsonl" test_accuracy)"
  ips="$(summary_field "$WORK/$name.jsonl" images_per_sec)"
  log "$name: test accuracy $acc (${seconds} s)"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n' \
    "$name" "$model" "$data" "$shown" "$acc" "$target" "$seconds" "$ips" >>"$ROWS"
done

# ---- report ----
cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
env_prefix=""
for v in BENCH_QUICK ACC_EPOCHS BENCH_THREADS SEED MLP_ARGS CNN_ARGS FASHION_MLP_ARGS \
  RINGTRAIN_MNIST_DIR RINGTRAIN_FASHION_DIR BUILD_DIR ACC_OUT; do
  # only the variables the caller set
  if printenv "$v" >/dev/null; then env_prefix+="$v=$(printf '%q' "$(printenv "$v")") "; fi
done
DATE="$(date -u '+%Y-%m-%d %H:%M UTC')"
CPU="${cpu:-unknown} ($NCPU CPUs visible)"
GIT_REV="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
COMMAND="${env_prefix}scripts/bench_accuracy.sh"
BENCH_QUICK="${BENCH_QUICK:-0}"
export DATE CPU GIT_REV COMMAND ACC_EPOCHS THREADS BENCH_QUICK
mkdir -p "$(dirname "$ACC_OUT")"
"$PY" - "$ROWS" >"$ACC_OUT" <<'PYEOF'
import os, sys

env = os.environ
out = ["## Accuracy: ringtrain on MNIST and Fashion-MNIST", ""]
if env["BENCH_QUICK"] == "1" or env["ACC_EPOCHS"] != "5":
    out += [f"**{env['ACC_EPOCHS']} epoch(s), not the 5 the targets assume: a smoke test, "
            "not a result.**", ""]
out += [
    f"- Date: {env['DATE']}",
    f"- CPU: {env['CPU']}; ringtrain: {env['GIT_REV']}",
    f"- Command: `{env['COMMAND']}`",
    f"- {env['ACC_EPOCHS']} epoch(s) per run, {env['THREADS']} thread(s); test accuracy on the full "
    "10,000-image test set after the last step (each run also gets `--metrics-out FILE`, "
    "where the accuracy is read from).",
    "",
    "| model | data | settings (the exact command) | test accuracy | target | met? |",
    "|---|---|---|---|---|---|",
]
notes = []
for line in open(sys.argv[1]):
    name, model, data, command, acc, target, seconds, ips, note = line.rstrip("\n").split("\t")
    target_f = float(target)
    if acc:
        acc_f = float(acc)
        met = "yes" if acc_f >= target_f else "no"
        acc_cell = f"{100 * acc_f:.2f}%"
        notes.append(f"- {name}: {seconds} s wall, {float(ips):,.0f} training images/s")
    else:
        met, acc_cell = "skipped", note
    out.append(f"| {model} | {data} | `{command}` | {acc_cell} | >= {100 * target_f:.1f}% | {met} |")
out.append("")
out += notes
print("\n".join(out))
PYEOF
cat "$ACC_OUT"
log "wrote $ACC_OUT"
