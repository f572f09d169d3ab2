#!/usr/bin/env bash
# Speed benchmark: ringtrain (build/mnist_train) against PyTorch (scripts/bench_torch.py,
# Debian's python3-torch) on one CPU thread each, same models, data, batch and optimizer
# (SGD, momentum 0.9, lr 0.01).  Configs: mlp batch 32, mlp batch 128, cnn batch 128.
# For each config the two sides run alternately (ours, torch, ours, torch, ...) REPS times,
# because the machine is shared and noisy; images/s comes from each side's JSON summary
# line (training steps only: batch assembly + forward + loss + backward + update), and we
# report median and min-max per side and the ratio of the medians.  Also measures the
# peak RSS (/usr/bin/time -v) of a one-epoch ringtrain mlp run and a PyTorch mlp run.
# Writes a markdown section to $BENCH_OUT (default docs/benchmarks-speed.md).
#
# Before any timing it checks which BLAS the PyTorch peer really loads (scripts/peer_blas.sh:
# the files a torch process maps after a matmul).  On netlib's reference BLAS it installs
# libopenblas0-openmp and checks again; if the peer is still not on OpenBLAS, MKL or BLIS it
# says so and exits 3 without a verdict.  Every timed PyTorch run's own report is checked
# the same way, and the report records the peer's BLAS library and threads.
#
# Usage: scripts/bench_speed.sh [DATA_DIR]
#   DATA_DIR          first arg, else $RINGTRAIN_DATA, else ../shared/data/mnist (beside the checkout) or data/mnist if it
#                     exists, else /usr/share/datasets/fashion-mnist
#   BENCH_QUICK=1     smoke test: 50 steps per run, REPS=1 (figures not meaningful)
#   REPS=3            runs per side and config
#   STEPS_MLP_B32=600 STEPS_MLP_B128=300 STEPS_CNN_B128=200   steps per run
#   WARMUP=20         untimed PyTorch warmup steps (ringtrain times all its steps)
#   BUILD_DIR=build   where ringtrain is built (Release; configured and built if needed)
#   BENCH_OUT=docs/benchmarks-speed.md
#   BENCH_CHECK_ONLY=1   only the dependency and peer-BLAS checks: no build, no timing, no report
#   PEER_BLAS_INSTALL=0  never install a BLAS for the peer (refuse instead); see scripts/peer_blas.sh
#                        for RINGTRAIN_PEER_BLAS, the override tests/peer_blas_test.sh uses
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# ---- settings ----
if [[ "${BENCH_QUICK:-0}" == "1" ]]; then
  quick_steps=50
  REPS="${REPS:-1}"
else
  quick_steps=""
  REPS="${REPS:-3}"
fi
STEPS_MLP_B32="${STEPS_MLP_B32:-${quick_steps:-600}}"
STEPS_MLP_B128="${STEPS_MLP_B128:-${quick_steps:-300}}"
STEPS_CNN_B128="${STEPS_CNN_B128:-${quick_steps:-200}}"
WARMUP="${WARMUP:-20}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
BENCH_OUT="${BENCH_OUT:-$ROOT/docs/benchmarks-speed.md}"
OPT_ARGS=(--optimizer sgd --lr 0.01 --momentum 0.9)
SEED=42
RSS_EPOCH_STEPS=468   # one epoch of batch 128 over 60,000 images (the last partial batch dropped)

if [[ $# -ge 1 && -n "$1" ]]; then
  DATA_DIR="$1"
elif [[ -n "${RINGTRAIN_DATA:-}" ]]; then
  DATA_DIR="$RINGTRAIN_DATA"
elif [[ -d "$(dirname "${BASH_SOURCE[0]}")/../../shared/data/mnist" ]]; then
  DATA_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../shared/data/mnist" && pwd)"
elif [[ -d "$(dirname "${BASH_SOURCE[0]}")/../data/mnist" ]]; then
  DATA_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/mnist" && pwd)"
else
  DATA_DIR=/usr/share/datasets/fashion-mnist
fi
[[ "${BENCH_CHECK_ONLY:-0}" == "1" || -d "$DATA_DIR" ]] || { echo "bench_speed: data dir $DATA_DIR not found" >&2; exit 1; }

NCPU="$(env -u OMP_NUM_THREADS nproc)"   # nproc obeys OMP_NUM_THREADS, set below

# One thread everywhere: no stray OpenMP/OpenBLAS pools on either side.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

log() { echo "[bench_speed] $*" >&2; }

# ---- dependencies ----
apt_install() {
  local sudo=()
  [[ "$(id -u)" -eq 0 ]] || sudo=(sudo)
  log "installing: $*"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" ||
    { "${sudo[@]}" apt-get update && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"; }
}
# (RINGTRAIN_PEER_BLAS, a test's stand-in for the peer, needs no torch)
if [[ -z "${RINGTRAIN_PEER_BLAS:-}" ]] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  apt_install python3-torch libopenblas0-openmp
fi

# ---- the peer's BLAS, before any timing: OpenBLAS, MKL or BLIS, or no verdict (exit 3) ----
# shellcheck source=scripts/peer_blas.sh
source "$ROOT/scripts/peer_blas.sh"
peer_blas_check bench_speed   # sets PEER_BLAS, or exits 3
if [[ "${BENCH_CHECK_ONLY:-0}" == "1" ]]; then
  log "BENCH_CHECK_ONLY=1: peer BLAS accepted ($PEER_BLAS_KIND); no timing"
  exit 0
fi

[[ -x /usr/bin/time ]] || apt_install time
PY="$(command -v python3 || echo /usr/bin/python3)"   # any python3 will do for JSON parsing

# ---- build ringtrain (Release) if needed ----
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh" >&2  # configures (Release) and builds
BIN="$BUILD_DIR/mnist_train"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results.tsv"   # config <TAB> side <TAB> images_per_sec <TAB> step_ms
: >"$RESULTS"

# summary_field FILE FIELD: FIELD of the last {"event":"summary",...} line in FILE
summary_field() { "$PY" "$(dirname "${BASH_SOURCE[0]}")/summary_field.py" "$1" "$2"; }

# max_rss_mb FILE: "Maximum resident set size (kbytes)" of a /usr/bin/time -v log, in MB
max_rss_mb() {
  awk -F: '/Maximum resident set size/ { printf "%.1f", $2 / 1024 }' "$1"
}

# ours_cmd / torch_cmd MODEL BATCH STEPS: set CMD to one side's command line
ours_cmd() {
  CMD=("$BIN" --data-dir "$DATA_DIR" --model "$1" --batch-size "$2" --steps "$3"
    "${OPT_ARGS[@]}" --threads 1 --seed "$SEED" --log-every 0 --eval-every 0)
}
torch_cmd() {
  CMD=(/usr/bin/python3 "$ROOT/scripts/bench_torch.py" --data-dir "$DATA_DIR" --model "$1"
    --batch-size "$2" --steps "$3" "${OPT_ARGS[@]}" --threads 1 --seed "$SEED" --warmup "$WARMUP")
}

# run_side SIDE CONFIG MODEL BATCH STEPS: one run; appends its images/s to $RESULTS
run_side() {
  local side="$1" config="$2" out="$WORK/$1-$2.jsonl" errlog="$WORK/$1-$2.log"
  rm -f "$out"
  if [[ "$side" == ringtrain ]]; then
    ours_cmd "$3" "$4" "$5"
    "${CMD[@]}" --metrics-out "$out" >"$errlog" 2>&1 || { cat "$errlog" >&2; return 1; }
  else
    torch_cmd "$3" "$4" "$5"
    "${CMD[@]}" >"$out" 2>"$errlog" || { cat "$errlog" >&2; return 1; }
  fi
  local ips ms
  # the timed process's own BLAS (bench_torch.py reports what it mapped): no verdict on netlib
  [[ "$side" == ringtrain ]] ||
    peer_blas_recheck bench_speed "$(summary_field "$out" blas_kind)" "$(summary_field "$out" blas)"
  ips="$(summary_field "$out" images_per_sec)"
  ms="$(summary_field "$out" step_ms)"
  printf '%s\t%s\t%s\t%s\n' "$config" "$side" "$ips" "$ms" >>"$RESULTS"
  log "$config $side: $(printf '%.0f' "$ips") img/s, $(printf '%.2f' "$ms") ms/step"
}

# ---- speed: interleaved runs ----
CONFIGS=("mlp 32 $STEPS_MLP_B32" "mlp 128 $STEPS_MLP_B128" "cnn 128 $STEPS_CNN_B128")
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
for cfg in "${CONFIGS[@]}"; do
  read -r model batch steps <<<"$cfg"
  name="$model-b$batch"
  for ((rep = 1; rep <= REPS; rep++)); do
    log "$name rep $rep/$REPS ($steps steps)"
    run_side ringtrain "$name" "$model" "$batch" "$steps"
    run_side pytorch "$name" "$model" "$batch" "$steps"
  done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---- memory: peak RSS of a one-epoch mlp run on each side ----
log "peak RSS: ringtrain mlp batch 128, 1 epoch"
ours_rss_cmd=("$BIN" --data-dir "$DATA_DIR" --model mlp --batch-size 128 --epochs 1 "${OPT_ARGS[@]}"
  --threads 1 --seed "$SEED" --log-every 0 --eval-every 0 --metrics-out "$WORK/ours-rss.jsonl")
/usr/bin/time -v "${ours_rss_cmd[@]}" >"$WORK/ours-rss.log" 2>&1 || { cat "$WORK/ours-rss.log" >&2; exit 1; }
OURS_RSS="$(max_rss_mb "$WORK/ours-rss.log")"
OURS_RSS_SELF="$(printf '%.1f' "$(summary_field "$WORK/ours-rss.jsonl" peak_rss_mb)")"
log "peak RSS: pytorch mlp batch 128, $RSS_EPOCH_STEPS steps"
torch_rss_cmd=(/usr/bin/python3 "$ROOT/scripts/bench_torch.py" --data-dir "$DATA_DIR" --model mlp
  --batch-size 128 --steps "$RSS_EPOCH_STEPS" --warmup 0 "${OPT_ARGS[@]}" --threads 1 --seed "$SEED")
/usr/bin/time -v "${torch_rss_cmd[@]}" >"$WORK/torch-rss.jsonl" 2>"$WORK/torch-rss.log" ||
  { cat "$WORK/torch-rss.log" >&2; exit 1; }
TORCH_RSS="$(max_rss_mb "$WORK/torch-rss.log")"
TORCH_VERSION="$(summary_field "$WORK/torch-rss.jsonl" torch_version)"
TORCH_BLAS="$(summary_field "$WORK/torch-rss.jsonl" blas)"
peer_blas_recheck bench_speed "$(summary_field "$WORK/torch-rss.jsonl" blas_kind)" "$TORCH_BLAS"

# ---- report ----
CPU_MODEL="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
cpu_family="$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
cpu_model_no="$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
cpu_flags="$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
simd=""
for f in avx2 fma avx512f avx512_vnni avx512_bf16; do
  if [[ " $cpu_flags " == *" $f "* ]]; then simd+="$f "; fi
done
hypervisor="$(lscpu 2>/dev/null | sed -n 's/^Hypervisor vendor: *//p' || true)"
CPU_MODEL="${CPU_MODEL:-unknown} (family $cpu_family model $cpu_model_no; ${simd% }${hypervisor:+; VM: $hypervisor})"
env_prefix=""
for v in BENCH_QUICK REPS STEPS_MLP_B32 STEPS_MLP_B128 STEPS_CNN_B128 WARMUP RINGTRAIN_DATA BUILD_DIR BENCH_OUT; do
  # only the variables the caller set (they were exported or given on the command line)
  if printenv "$v" >/dev/null; then env_prefix+="$v=$(printf '%q' "$(printenv "$v")") "; fi
done
COMMAND="${env_prefix}scripts/bench_speed.sh"
[[ $# -eq 0 ]] || COMMAND+="$(printf ' %q' "$@")"
GIT_REV="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"

mkdir -p "$(dirname "$BENCH_OUT")"
DATE="$(date -u '+%Y-%m-%d %H:%M UTC')"
ours_cmd MODEL BATCH STEPS
OURS_CMD="${CMD[*]}"
OURS_CMD="${OURS_CMD//$ROOT\//}"
torch_cmd MODEL BATCH STEPS
TORCH_CMD="${CMD[*]}"
TORCH_CMD="${TORCH_CMD//$ROOT\//}"
STEPS_LIST="${CONFIGS[*]}"
BENCH_QUICK="${BENCH_QUICK:-0}"
export DATE CPU_MODEL NCPU TORCH_VERSION TORCH_BLAS PEER_BLAS COMMAND GIT_REV DATA_DIR REPS WARMUP LOAD_BEFORE \
  LOAD_AFTER OURS_RSS OURS_RSS_SELF TORCH_RSS RSS_EPOCH_STEPS BENCH_QUICK OURS_CMD TORCH_CMD STEPS_LIST
"$PY" - "$RESULTS" >"$BENCH_OUT" <<'PYEOF'
import os, statistics, sys

env = os.environ
rows = {}
for line in open(sys.argv[1]):
    config, side, ips, _ms = line.rstrip("\n").split("\t")
    rows.setdefault(config, {}).setdefault(side, []).append(float(ips))

targets = {"mlp-b32": 2.0, "mlp-b128": 1.3, "cnn-b128": 2.0}
steps = {}
parts = env["STEPS_LIST"].split()
for i in range(0, len(parts), 3):
    steps[f"{parts[i]}-b{parts[i + 1]}"] = parts[i + 2]

def cell(values):
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

out = []
out.append("## Speed: ringtrain vs PyTorch, 1 thread")
out.append("")
if env["BENCH_QUICK"] == "1":
    out.append("**Quick mode (BENCH_QUICK=1): smoke-test figures, not a measurement.**")
    out.append("")
out.append(f"- Date: {env['DATE']}")
out.append(f"- CPU: {env['CPU_MODEL']} ({env['NCPU']} CPUs visible); load average before/after: "
           f"{env['LOAD_BEFORE']} / {env['LOAD_AFTER']}")
out.append(f"- PyTorch: {env['TORCH_VERSION']} (Debian python3-torch)")
out.append(f"- PyTorch's BLAS, checked before timing (scripts/peer_blas.sh; a verdict needs OpenBLAS, "
           f"MKL or BLIS): {env['PEER_BLAS']}")
out.append(f"- PyTorch's BLAS as its timed runs reported it: {env['TORCH_BLAS']}")
out.append(f"- ringtrain: {env['GIT_REV']}; data: `{env['DATA_DIR']}`")
out.append(f"- Command: `{env['COMMAND']}`")
out.append(f"- Each run: ringtrain `{env['OURS_CMD']}`; PyTorch `{env['TORCH_CMD']}` "
           "(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 for both).")
out.append(f"- {env['REPS']} runs per side and config, interleaved (ours, torch, ours, torch, ...). "
           "images/s = batch x steps / time spent in training steps (batch assembly from uint8 "
           "with x/255, forward, loss, backward, SGD momentum 0.9 lr 0.01 update); evaluation and "
           f"data loading are not timed. PyTorch excludes its first {env['WARMUP']} steps from "
           "timing; ringtrain times all of its steps.")
out.append("")
out.append("| model | batch | ringtrain img/s (median, min-max) | PyTorch img/s (median, min-max) "
           "| ratio | target | met? |")
out.append("|---|---|---|---|---|---|---|")
for config in ("mlp-b32", "mlp-b128", "cnn-b128"):
    if config not in rows:
        continue
    ours, torch = rows[config]["ringtrain"], rows[config]["pytorch"]
    ratio = statistics.median(ours) / statistics.median(torch)
    target = targets[config]
    model, batch = config.split("-b")
    out.append(f"| {model} | {batch} | {cell(ours)} | {cell(torch)} | {ratio:.2f}x | "
               f">= {target:.1f}x | {'yes' if ratio >= target else 'no'} |")
out.append("")
out.append("Steps per run: " + ", ".join(f"{k} {v}" for k, v in steps.items()) + ".")
out.append("")
ours_rss = float(env["OURS_RSS"])
out.append(f"- Peak RSS, ringtrain mlp batch 128, 1 epoch (`/usr/bin/time -v`, Maximum resident set "
           f"size): {ours_rss:.1f} MB (ringtrain's own report: {env['OURS_RSS_SELF']} MB); "
           f"target <= 150 MB: {'met' if ours_rss <= 150 else 'not met'}")
out.append(f"- Peak RSS, PyTorch mlp batch 128, {env['RSS_EPOCH_STEPS']} steps (same measure): "
           f"{float(env['TORCH_RSS']):.1f} MB")
print("\n".join(out))
PYEOF
cat "$BENCH_OUT"
log "wrote $BENCH_OUT"
