#!/usr/bin/env bash
# Allreduce benchmark (issue 3): ringtrain's ring allreduce against Open MPI's MPI_Allreduce,
# 2 ranks on this 2-core machine, float32 sum, 4 KiB to 256 MiB. Both run back to back at each
# size (allreduce_bench --backend both: interleaved, the order alternating between repeats),
# each timed measurement repeated REPEATS times, every size checked against the closed form
# (-c 1; a wrong result fails the script). Reports the median busbw with its min-max spread and
# the ring/MPI ratio of the medians, against the targets:
#   64 MiB and 256 MiB:    ring busbw >= 3.0 GB/s
#   256 KiB to 16 MiB:     ring busbw >= 0.9 x MPI busbw (medians)
# Writes the CSV and a markdown section to $BENCH_OUT (default docs/benchmarks-allreduce.md).
#
# Usage: scripts/bench_allreduce.sh
#   BENCH_QUICK=1     smoke test: 4 KiB..64 MiB by 4, 2 iterations, 2 repeats (figures not
#                     meaningful)
#   NP=2 MINBYTES=4K MAXBYTES=256M FACTOR=2 ITERS=20 WARMUP=5 REPEATS=5
#   EXTRA_ARGS=""     more allreduce_bench flags (e.g. "--segment-kb 512 --window 8")
#   BUILD_DIR=build   where ringtrain is built (Release; configured and built if needed)
#   BENCH_OUT=docs/benchmarks-allreduce.md   BENCH_CSV=${BENCH_OUT%.md}.csv
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# ---- settings ----
if [[ "${BENCH_QUICK:-0}" == "1" ]]; then
  MAXBYTES="${MAXBYTES:-64M}" FACTOR="${FACTOR:-4}" ITERS="${ITERS:-2}" WARMUP="${WARMUP:-1}"
  REPEATS="${REPEATS:-2}"
fi
NP="${NP:-2}"
MINBYTES="${MINBYTES:-4K}"
MAXBYTES="${MAXBYTES:-256M}"
FACTOR="${FACTOR:-2}"
ITERS="${ITERS:-20}"
WARMUP="${WARMUP:-5}"
REPEATS="${REPEATS:-5}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
BENCH_OUT="${BENCH_OUT:-$ROOT/docs/benchmarks-allreduce.md}"
BENCH_CSV="${BENCH_CSV:-${BENCH_OUT%.md}.csv}"
NCPU="$(nproc)"

log() { echo "[bench_allreduce] $*" >&2; }
command -v mpirun >/dev/null || { log "mpirun not found: run scripts/install_deps.sh"; exit 1; }
PY="$(command -v python3 || echo /usr/bin/python3)"  # any python3 will do for the report

# ---- build (Release) if needed ----
BUILD_DIR="$BUILD_DIR" "$ROOT/scripts/build.sh" >&2  # configures (Release) and builds
BIN="$BUILD_DIR/allreduce_bench"

# ---- run ----
MPIRUN=(mpirun -np "$NP")
[[ "$(id -u)" -eq 0 ]] && MPIRUN+=(--allow-run-as-root)
if ((NP > NCPU)); then MPIRUN+=(--oversubscribe); else MPIRUN+=(--bind-to core); fi
read -r -a extra <<<"$EXTRA_ARGS"
mkdir -p "$(dirname "$BENCH_OUT")" "$(dirname "$BENCH_CSV")"
BENCH_CMD=("${MPIRUN[@]}" "$BIN" -b "$MINBYTES" -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS"
  -w "$WARMUP" -c 1 --op sum --backend both --repeats "$REPEATS" --csv "$BENCH_CSV" "${extra[@]}")

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
log "running: ${BENCH_CMD[*]}"
start=$SECONDS
if ! "${BENCH_CMD[@]}" 2>&1 | tee "$WORK/bench.out" >&2; then
  log "allreduce_bench failed (a wrong result or an error above); no report written"
  exit 1
fi
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
log "benchmark took $((SECONDS - start)) s"

# ---- report ----
CPU_MODEL="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
hypervisor="$(lscpu 2>/dev/null | sed -n 's/^Hypervisor vendor: *//p' || true)"
l3="$(lscpu 2>/dev/null | sed -n 's/^L3 cache: *//p' || true)"
CPU_MODEL="${CPU_MODEL:-unknown}${l3:+, L3 $l3}${hypervisor:+, VM: $hypervisor}"
MPI_VERSION="$(ompi_info --version 2>/dev/null | head -n1 || true)"
[[ -n "$MPI_VERSION" ]] || MPI_VERSION="$(mpirun --version 2>&1 | head -n1)"
env_prefix=""
for v in BENCH_QUICK NP MINBYTES MAXBYTES FACTOR ITERS WARMUP REPEATS EXTRA_ARGS BUILD_DIR BENCH_OUT BENCH_CSV; do
  # only the variables the caller set
  if printenv "$v" >/dev/null; then env_prefix+="$v=$(printf '%q' "$(printenv "$v")") "; fi
done
GIT_REV="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
RUN_CMD="${BENCH_CMD[*]}"
DATE="$(date -u '+%Y-%m-%d %H:%M UTC')"
export DATE CPU_MODEL NCPU MPI_VERSION GIT_REV LOAD_BEFORE LOAD_AFTER REPEATS ITERS WARMUP NP
export BENCH_QUICK="${BENCH_QUICK:-0}" SCRIPT_CMD="${env_prefix}scripts/bench_allreduce.sh"
export RUN_CMD="${RUN_CMD//$ROOT\//}" CSV_NAME="${BENCH_CSV//$ROOT\//}"
"$PY" - "$BENCH_CSV" "$WORK/bench.out" >"$BENCH_OUT" <<'PYEOF'
import csv, os, sys

env = os.environ
KIB, MIB = 1024, 1024 * 1024
rows = {}
for r in csv.DictReader(open(sys.argv[1])):
    rows.setdefault(int(r["size_bytes"]), {})[r["backend"]] = r
    if r["wrong"] not in ("", "0"):
        sys.exit(f"{r['backend']} at {r['size_bytes']} B: #wrong = {r['wrong']}")

def size_name(b):
    for unit, name in ((MIB, "MiB"), (KIB, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"

def cell(r):
    return (f"{float(r['busbw_gbps']):.2f} ({float(r['busbw_gbps_min']):.2f}-"
            f"{float(r['busbw_gbps_max']):.2f})")

out = [f"## Allreduce: ring vs MPI_Allreduce, {env['NP']} ranks, float32 sum", ""]
if env["BENCH_QUICK"] == "1":
    out += ["**Quick mode (BENCH_QUICK=1): smoke-test figures, not a measurement.**", ""]
out += [
    f"- Date: {env['DATE']}; ringtrain {env['GIT_REV']}",
    f"- CPU: {env['CPU_MODEL']} ({env['NCPU']} CPUs visible); load average before/after: "
    f"{env['LOAD_BEFORE']} / {env['LOAD_AFTER']}",
    f"- MPI: {env['MPI_VERSION']}",
    f"- Command: `{env['SCRIPT_CMD']}`, which ran `{env['RUN_CMD']}`; all columns per size and "
    f"backend in `{env['CSV_NAME']}`.",
    f"- Time of one allreduce = the slowest rank's time for {env['ITERS']} back-to-back calls "
    f"(after {env['WARMUP']} warm-up call(s) and a barrier) / {env['ITERS']}; algbw = size / time; "
    "busbw = algbw x 2(N-1)/N (nccl-tests' convention; = algbw at 2 ranks). Each timed "
    f"measurement ran {env['REPEATS']} times per size, ring and MPI alternating (the order "
    "swapping each repeat); cells show the median busbw in GB/s (min-max). Every size was "
    "checked against the closed form on every rank, bit-identical across ranks (#wrong = 0).",
    "",
    "| size | ring busbw GB/s median (min-max) | MPI busbw GB/s median (min-max) | ring/MPI "
    "| target | met? |",
    "|---:|---|---|---:|---|---|",
]
met = total = 0
for size in sorted(rows):
    ring, mpi = rows[size].get("ring"), rows[size].get("mpi")
    if ring is None or mpi is None:
        continue
    ring_bw, mpi_bw = float(ring["busbw_gbps"]), float(mpi["busbw_gbps"])
    ratio = ring_bw / mpi_bw if mpi_bw > 0 else float("inf")
    if size in (64 * MIB, 256 * MIB):
        target, ok = "ring >= 3.0 GB/s", ring_bw >= 3.0
    elif 256 * KIB <= size <= 16 * MIB:
        target, ok = "ring >= 0.9x MPI", ratio >= 0.9
    else:
        target, ok = "-", None
    if ok is not None:
        total += 1
        met += ok
    verdict = "-" if ok is None else ("met" if ok else "**not met**")
    out.append(f"| {size_name(size)} | {cell(ring)} | {cell(mpi)} | {ratio:.2f}x | {target} | "
               f"{verdict} |")
out += ["", f"Targets met: {met} of {total} rows.", "",
        "<details><summary>allreduce_bench output</summary>", "", "```"]
out += [line.rstrip("\n") for line in open(sys.argv[2])]
out += ["```", "", "</details>"]
print("\n".join(out))
PYEOF
cat "$BENCH_OUT"
log "wrote $BENCH_OUT and $BENCH_CSV"
