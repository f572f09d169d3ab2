#!/usr/bin/env bash
# Scaling benchmark: training throughput against the number of ranks.
#
# For each model (mlp batch 32 and 128, cnn batch 128, the wide mlp --hidden 4096,4096 at batch
# 128), one thread per rank, it measures ringtrain at 1, 2 and 4 ranks (4 is oversubscribed on
# this 2-core machine and marked so), in its default mode (--overlap auto) and with overlap
# forced on or off:
#   - on shared memory (one node; MPI's vader transport), beside PyTorch DDP (gloo, same
#     models, same per-rank batch, same sampler) in the same run;
#   - across an emulated cluster network (scripts/netns_cluster.sh: one network namespace per
#     rank, rate-limited veth links, Open MPI over TCP), default 10 Gbit/s; needs root.
# It reports images/s, scaling efficiency (images/s at N / (N x images/s at 1)), comm_ms,
# exposed_comm_ms and overlap efficiency, writes docs/benchmarks-scaling.md (BENCH_OUT), a CSV
# beside it and a PNG of the speedup against ranks, one panel per model (scripts/plot_scaling.py;
# matplotlib, Debian's python3-matplotlib, installed if missing).
#
# Usage: scripts/bench_scaling.sh      (about 10 minutes)
#   RINGTRAIN_DATA / first argument: data (default ../shared/data/mnist, else data/mnist,
#   else Fashion-MNIST); RATE=10gbit; RANKS="1 2 4"; MODELS="mlp32 mlp128 cnn128 wide128";
#   SKIP_NET=1 / SKIP_DDP=1 to leave a part out; BENCH_QUICK=1 for a smoke test.
# Before any timing, unless SKIP_DDP=1, it checks the BLAS the PyTorch peer loads
# (scripts/peer_blas.sh): on netlib's reference BLAS it installs libopenblas0-openmp and checks
# again, and exits 3 without a verdict if the peer is still not on OpenBLAS, MKL or BLIS
# (PEER_BLAS_INSTALL=0: never install). Every DDP run's own report is checked the same way.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${BUILD_DIR:-$repo/build}"
out_md="${BENCH_OUT:-$repo/docs/benchmarks-scaling.md}"
out_csv="${out_md%.md}.csv"
out_png="${out_md%.md}.png"
rate="${RATE:-10gbit}"
ranks_list="${RANKS:-1 2 4}"
models="${MODELS:-mlp32 mlp128 cnn128 wide128}"
quick="${BENCH_QUICK:-0}"
cores="$(nproc)"
log() { echo "[bench_scaling] $*" >&2; }

if [[ $# -ge 1 && -n "$1" ]]; then data="$1"
elif [[ -n "${RINGTRAIN_DATA:-}" ]]; then data="$RINGTRAIN_DATA"
elif [[ -d "$repo/../shared/data/mnist" ]]; then data="$(cd "$repo/../shared/data/mnist" && pwd)"
elif [[ -d "$repo/data/mnist" ]]; then data="$repo/data/mnist"
else data=/usr/share/datasets/fashion-mnist; fi

# ---- dependencies (benchmark-only: not on the test path) ----
install_pkgs() {
  log "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
}
# (RINGTRAIN_PEER_BLAS, a test's stand-in for the peer, needs no torch)
if [[ "${SKIP_DDP:-0}" != "1" && -z "${RINGTRAIN_PEER_BLAS:-}" ]] &&
  ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  install_pkgs python3-torch libopenblas0-openmp
fi
# ---- the DDP peer's BLAS, before any timing (one thread, as the ranks run) ----
peer_blas="not checked (SKIP_DDP=1: no PyTorch peer)"
if [[ "${SKIP_DDP:-0}" != "1" ]]; then
  # shellcheck source=scripts/peer_blas.sh
  source "$repo/scripts/peer_blas.sh"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 peer_blas_check bench_scaling   # or exits 3
  peer_blas="$PEER_BLAS"
fi
# the figure (scripts/plot_scaling.py runs itself under /usr/bin/python3 if python3 lacks it)
python3 -c 'import matplotlib' 2>/dev/null || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
  install_pkgs python3-matplotlib
"$repo/scripts/build.sh" >&2

mpi_base=(--bind-to none)
[[ "$(id -u)" -eq 0 ]] && mpi_base+=(--allow-run-as-root)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# model spec: name|ringtrain/ddp model flags|per-rank batch|steps
model_spec() {
  local steps_scale=1
  [[ "$quick" == "1" ]] && steps_scale=10
  case "$1" in
    mlp32) echo "--model mlp|32|$((300 / steps_scale))" ;;
    mlp128) echo "--model mlp|128|$((200 / steps_scale))" ;;
    cnn128) echo "--model cnn|128|$((150 / steps_scale))" ;;
    wide128) echo "--model mlp --hidden 4096,4096|128|$((12 / (steps_scale > 1 ? 4 : 1)))" ;;
    *) echo "unknown model $1" >&2; exit 1 ;;
  esac
}

field() { python3 "$repo/scripts/summary_field.py" "$1" "$2"; }  # FILE KEY of the summary line

echo "transport,framework,model,batch,ranks,oversubscribed,overlap,overlapped,images_per_sec,step_ms,compute_ms,comm_ms,exposed_comm_ms,overlap_efficiency" >"$out_csv"

# run_ringtrain TRANSPORT MODEL RANKS OVERLAP [mpirun prefix args...]
run_ringtrain() {
  local transport=$1 model=$2 np=$3 overlap=$4
  shift 4
  IFS='|' read -r flags batch steps <<<"$(model_spec "$model")"
  local metrics="$work/rt.jsonl" extra=(--overlap "$overlap")
  local over=no
  [[ "$np" -gt "$cores" ]] && over=yes
  rm -f "$metrics"
  # shellcheck disable=SC2086
  if ! timeout 900 mpirun "${mpi_base[@]}" "$@" -np "$np" $([[ $over == yes ]] && echo --oversubscribe) \
      "$build/mnist_train" --data-dir "$data" $flags --batch-size "$batch" --steps "$steps" \
      --optimizer sgd --momentum 0.9 --lr 0.01 --threads 1 --log-every 0 --eval-batch 2000 \
      --metrics-out "$metrics" "${extra[@]}" >"$work/rt.log" 2>&1; then
    log "ringtrain $transport $model np=$np overlap=$overlap FAILED:"; tail -5 "$work/rt.log" >&2
    return 0
  fi
  local row
  row="$transport,ringtrain,$model,$batch,$np,$over,$overlap"
  for key in overlap images_per_sec step_ms compute_ms comm_ms exposed_comm_ms overlap_efficiency; do
    row+=",$(field "$metrics" "$key")"
  done
  echo "$row" >>"$out_csv"
  log "$row"
}

run_ddp() {
  local model=$1 np=$2
  IFS='|' read -r flags batch steps <<<"$(model_spec "$model")"
  local over=no
  [[ "$np" -gt "$cores" ]] && over=yes
  # shellcheck disable=SC2086
  if ! OMP_NUM_THREADS=1 timeout 900 /usr/bin/python3 "$repo/scripts/bench_ddp.py" --nproc "$np" \
      --data-dir "$data" $flags --batch-size "$batch" --steps "$steps" --warmup 5 \
      >"$work/ddp.jsonl" 2>"$work/ddp.log"; then
    log "ddp $model np=$np FAILED:"; tail -5 "$work/ddp.log" >&2
    return 0
  fi
  # the timed ranks' own BLAS (rank 0's report): no verdict against a peer on netlib
  peer_blas_recheck bench_scaling "$(field "$work/ddp.jsonl" blas_kind)" "$(field "$work/ddp.jsonl" blas)"
  local row="shm,pytorch-ddp,$model,$batch,$np,$over,n/a,True,$(field "$work/ddp.jsonl" images_per_sec),$(field "$work/ddp.jsonl" step_ms),,,,"
  echo "$row" >>"$out_csv"
  log "$row"
}

# ---- shared memory: ringtrain (overlap / no overlap) and DDP, interleaved per configuration ----
for model in $models; do
  for np in $ranks_list; do
    run_ringtrain shm "$model" "$np" auto --mca btl self,vader
    if [[ "$np" -gt 1 ]]; then
      run_ringtrain shm "$model" "$np" on --mca btl self,vader
      run_ringtrain shm "$model" "$np" off --mca btl self,vader
    fi
    [[ "${SKIP_DDP:-0}" == "1" ]] || run_ddp "$model" "$np"
  done
done

# ---- the emulated cluster network: one namespace per rank ----
net_note="not measured"
if [[ "${SKIP_NET:-0}" != "1" ]]; then
  if why=$(bash "$repo/scripts/netns_cluster.sh" check 2>&1); then
    for np in $ranks_list; do
      [[ "$np" -gt 1 ]] || continue
      export -f run_ringtrain model_spec field log
      export build data cores work quick out_csv repo
      export mpi_base_str="${mpi_base[*]}"
      bash "$repo/scripts/netns_cluster.sh" run "$np" --rate "$rate" -- bash -c '
        read -ra mpi_base <<<"$mpi_base_str"
        read -ra net <<<"$RINGTRAIN_NETNS_MPIRUN_ARGS"
        for model in '"$models"'; do
          run_ringtrain net-'"$rate"' "$model" '"$np"' auto "${net[@]}"
          run_ringtrain net-'"$rate"' "$model" '"$np"' off "${net[@]}"
        done' >&2
    done
    net_note="$rate links, one network namespace per rank (scripts/netns_cluster.sh), Open MPI over TCP"
  else
    net_note="skipped: ${why}"
    log "emulated network $net_note"
  fi
fi

# ---- report ----
python3 - "$out_csv" "$out_md" "$out_png" "$net_note" "$data" "$rate" "$peer_blas" <<'PY'
import csv, sys, subprocess, datetime, os
csv_path, md_path, png_path, net_note, data, rate, peer_blas = sys.argv[1:8]
rows = list(csv.DictReader(open(csv_path)))
def get(transport, fw, model, np, overlap):
    for r in rows:
        if (r["transport"], r["framework"], r["model"], r["ranks"], r["overlap"]) == (transport, fw, model, str(np), overlap):
            return r
    return None
def ips(r): return float(r["images_per_sec"]) if r and r["images_per_sec"] else None
names = {"mlp32": "mlp, batch 32", "mlp128": "mlp, batch 128", "cnn128": "cnn, batch 128", "wide128": "mlp 4096,4096, batch 128"}
models = [m for m in ["mlp32", "mlp128", "cnn128", "wide128"] if any(r["model"] == m for r in rows)]
ranks = sorted({int(r["ranks"]) for r in rows})
out = []
out.append("## Scaling: throughput against ranks\n")
out.append(f"- Date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; ringtrain {subprocess.run(['git','rev-parse','--short','HEAD'],capture_output=True,text=True).stdout.strip()}; data `{data}`")
out.append(f"- Command: `scripts/bench_scaling.sh`; one thread per rank; SGD momentum 0.9; per-rank batch as listed; ranks > {os.cpu_count()} are oversubscribed (marked *)")
out.append("- images/s = global batch x steps / rank 0's training time; scaling efficiency = images/s at N / (N x images/s at 1 rank); comm, exposed (ms per step) and overlap efficiency = 1 - exposed / comm are those of the --overlap on run")
out.append("- default = `--overlap auto`: overlap on unless one node's ranks x threads fill its cores (then the communication thread only takes cycles from backward); here that means off on shared memory at 2+ ranks and on across the emulated network")
out.append(f"- PyTorch DDP's BLAS, checked before timing (scripts/peer_blas.sh; a verdict needs OpenBLAS, MKL or BLIS): {peer_blas}")
out.append(f"- Emulated network: {net_note}\n")
for transport, title in [("shm", "Shared memory (one node)"), (f"net-{rate}", f"Emulated cluster network, {rate}")]:
    if not any(r["transport"] == transport for r in rows): continue
    out.append(f"### {title}\n")
    out.append("| model | ranks | ringtrain img/s (default) | overlapped? | scaling eff. | comm ms | exposed ms | overlap eff. | --overlap on img/s | --overlap off img/s | step, on vs off |" + (" PyTorch DDP img/s | ringtrain / DDP |" if transport == "shm" else ""))
    out.append("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if transport == "shm" else ""))
    for m in models:
        base = ips(get("shm", "ringtrain", m, 1, "auto"))
        for n in ranks:
            r = get(transport, "ringtrain", m, n, "auto")
            if r is None: continue
            on = r if r["overlapped"] == "True" else get(transport, "ringtrain", m, n, "on")
            nr = r if r["overlapped"] == "False" else get(transport, "ringtrain", m, n, "off")
            d = get("shm", "pytorch-ddp", m, n, "n/a")
            star = "*" if r["oversubscribed"] == "yes" else ""
            eff = f"{ips(r) / (n * base):.2f}" if base else "-"
            multi = n > 1 and on is not None
            cells = [names[m], f"{n}{star}", f"{ips(r):,.0f}", ("yes" if r["overlapped"] == "True" else "no") if n > 1 else "-", eff,
                     f"{float(on['comm_ms']):.2f}" if multi else "-", f"{float(on['exposed_comm_ms']):.2f}" if multi else "-",
                     f"{float(on['overlap_efficiency'])*100:.0f}%" if multi else "-",
                     f"{ips(on):,.0f}" if multi else "-",
                     f"{ips(nr):,.0f}" if n > 1 and nr else "-",
                     f"{(float(nr['step_ms']) - float(on['step_ms'])) / float(nr['step_ms']) * 100:+.0f}% shorter" if multi and nr else "-"]
            if transport == "shm":
                cells += [f"{ips(d):,.0f}" if d else "-", f"{ips(r)/ips(d):.2f}x" if d else "-"]
            out.append("| " + " | ".join(cells) + " |")
    out.append("")
# targets
out.append("### Targets\n")
def ratio(a, b): return a / b if a and b else None
checks = []
for m, need in [("mlp128", 1.7), ("cnn128", 1.7)]:
    v = ratio(ips(get("shm", "ringtrain", m, 2, "auto")), ips(get("shm", "ringtrain", m, 1, "auto")))
    checks.append((f"shared memory, {names[m]}: np=2 / np=1 >= {need}x", v, need, "x"))
for m, need in [("mlp32", 2.0), ("cnn128", 2.0), ("mlp128", 1.5)]:
    v = ratio(ips(get("shm", "ringtrain", m, 2, "auto")), ips(get("shm", "pytorch-ddp", m, 2, "n/a")))
    checks.append((f"shared memory, {names[m]}: ringtrain np=2 / DDP np=2 >= {need}x", v, need, "x"))
w, wn = get(f"net-{rate}", "ringtrain", "wide128", 2, "auto"), get(f"net-{rate}", "ringtrain", "wide128", 2, "off")
if w is not None and w["overlapped"] != "True": w = None
v = (float(wn["step_ms"]) - float(w["step_ms"])) / float(wn["step_ms"]) if w and wn else None
checks.append((f"{rate} network, wide mlp np=2: step with overlap >= 20% shorter than --no-overlap", v, 0.2, "%"))
v = float(w["overlap_efficiency"]) if w else None
checks.append((f"{rate} network, wide mlp np=2: overlap efficiency >= 60%", v, 0.6, "%"))
out.append("| target | measured | met? |")
out.append("|---|---|---|")
for text, v, need, unit in checks:
    shown = "-" if v is None else (f"{v:.2f}x" if unit == "x" else f"{v*100:.0f}%")
    out.append(f"| {text} | {shown} | {'-' if v is None else ('yes' if v >= need else '**no**')} |")
out.append(f"\nAll rows: [{os.path.basename(csv_path)}]({os.path.basename(csv_path)}); plot: ![speedup against ranks, one panel per model]({os.path.basename(png_path)})\n")
open(md_path, "w").write("\n".join(out) + "\n")
print(open(md_path).read())
PY
# the figure: one panel per model, speedup against ranks (a failed plot leaves the report whole)
python3 "$repo/scripts/plot_scaling.py" "$out_csv" "$out_png" >&2 ||
  log "WARNING: scripts/plot_scaling.py failed: $out_png not updated"
log "wrote $out_md, $out_csv, $out_png"
