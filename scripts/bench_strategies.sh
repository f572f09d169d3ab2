#!/usr/bin/env bash
# Strategies benchmark: the ring against parameter servers (sync and async, 1 and 2 servers)
# and local SGD, with the same 2 workers, model (mlp, default --hidden), per-worker batch (64)
# and optimizer (SGD, momentum 0.9, lr 0.05) in every configuration:
#   ring             -np 2
#   ps sync / async  -np 3 (1 server) and -np 4 (2 servers): the first --num-ps ranks serve
#   local SGD        -np 2, --average-every 4 and 8
# For each it measures
#   - throughput: REPS runs (interleaved) of STEPS steps with no evaluation until the end;
#     images/s (median, min-max), the ratio to the ring's median, final test accuracy, and for
#     ps the servers' traffic (bytes in and out, all servers; the busiest server from the log),
#     dropped / rejected gradients and the largest staleness;
#   - time to a target accuracy (TARGET, default 0.95 on MNIST, 0.80 on Fashion-MNIST): one
#     run with --eval-every EVAL_EVERY; the first evaluation at or above the target gives the
#     step; time to target = that step x the median step time of the throughput runs (the eval
#     run's own clock is reported too, but under ps async the other workers keep training while
#     the chief evaluates off the clock, so there it counts short).
# And, with 3 workers of which one sleeps 20 ms before every step (--test-slow-rank), the ring,
# ps sync with every gradient (R = 3) and with a backup worker (R = 2), and ps async.
# It writes docs/benchmarks-strategies.md (BENCH_OUT), a CSV of every run beside it and a PNG
# (gnuplot, installed if missing): images/s per configuration and test accuracy against time.
#
# Usage: scripts/bench_strategies.sh      (about 3 minutes on the 2-core build machine)
#   RINGTRAIN_DATA / first argument: data (default ../shared/data/mnist, else data/mnist, else
#   Fashion-MNIST); BUILD_DIR (default build/); REPS=3; STEPS=468 (one epoch of the 2 workers'
#   global batch 128); SLOW_STEPS=150; EVAL_EVERY=24 (a multiple of every --average-every);
#   TARGET; BENCH_QUICK=1 for a smoke test (a few steps, one repetition).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${BUILD_DIR:-$repo/build}"
out_md="${BENCH_OUT:-$repo/docs/benchmarks-strategies.md}"
out_csv="${out_md%.md}.csv"
out_png="${out_md%.md}.png"
quick="${BENCH_QUICK:-0}"
reps="${REPS:-3}"
steps="${STEPS:-468}"
slow_steps="${SLOW_STEPS:-150}"
eval_every="${EVAL_EVERY:-24}"
batch=64
slow_ms=20
if [[ "$quick" == "1" ]]; then reps=1 steps=48 slow_steps=12; fi
cores="$(nproc)"
log() { echo "[bench_strategies] $*" >&2; }

if [[ $# -ge 1 && -n "$1" ]]; then data="$1"
elif [[ -n "${RINGTRAIN_DATA:-}" ]]; then data="$RINGTRAIN_DATA"
elif [[ -d "$repo/../shared/data/mnist" ]]; then data="$(cd "$repo/../shared/data/mnist" && pwd)"
elif [[ -d "$repo/data/mnist" ]]; then data="$repo/data/mnist"
else data=/usr/share/datasets/fashion-mnist; fi
if [[ -n "${TARGET:-}" ]]; then target="$TARGET"
elif [[ "${data,,}" == *fashion* ]]; then target=0.80
else target=0.95; fi

# ---- dependencies (benchmark-only: not on the test path) ----
if ! command -v gnuplot >/dev/null; then
  log "installing gnuplot-nox"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gnuplot-nox >&2
fi
BUILD_DIR="$build" "$repo/scripts/build.sh" >&2

mpi=(mpirun --bind-to none --oversubscribe --mca btl "self,vader")
[[ "$(id -u)" -eq 0 ]] && mpi+=(--allow-run-as-root)
common=(--data-dir "$data" --model mlp --batch-size "$batch" --optimizer sgd --momentum 0.9
        --lr 0.05 --threads 1 --log-every 0 --eval-batch 2000)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$repo" diff --quiet HEAD -- src include apps CMakeLists.txt 2>/dev/null || commit+=" plus uncommitted changes"
started=$(date +%s)

# name|ranks|flags: 2 workers each
main_configs=(
  "ring|2|--strategy ring"
  "ps sync, 1 server|3|--strategy ps --num-ps 1 --ps-mode sync"
  "ps sync, 2 servers|4|--strategy ps --num-ps 2 --ps-mode sync"
  "ps async, 1 server|3|--strategy ps --num-ps 1 --ps-mode async"
  "ps async, 2 servers|4|--strategy ps --num-ps 2 --ps-mode async"
  "local SGD, H=4|2|--strategy local-sgd --average-every 4"
  "local SGD, H=8|2|--strategy local-sgd --average-every 8"
)
# 3 workers; the last rank (a worker) sleeps $slow_ms ms before every step
slow_configs=(
  "ring|3|--strategy ring --test-slow-rank 2"
  "ps sync, R=3 of 3|4|--strategy ps --num-ps 1 --ps-mode sync --test-slow-rank 3"
  "ps sync, R=2 of 3 (backup worker)|4|--strategy ps --num-ps 1 --ps-mode sync --replicas-to-aggregate 2 --test-slow-rank 3"
  "ps async|4|--strategy ps --num-ps 1 --ps-mode async --test-slow-rank 3"
)

echo "phase,rep,config,ranks,oversubscribed,flags,steps,batch,rc,images_per_sec,train_seconds,global_batch,test_accuracy,params,server_bytes_received,server_bytes_sent,busiest_server_bytes,dropped_stale,rejected_stale,staleness_max,staleness_histogram,worker_steps_taken,replicas_to_aggregate,workers,evals" >"$out_csv"

# run PHASE REP "name|ranks|flags" STEPS [extra flags...]: one run, one CSV row
run() {
  local phase=$1 rep=$2 spec=$3 nsteps=$4
  shift 4
  local name np flags
  IFS='|' read -r name np flags <<<"$spec"
  local metrics="$work/m.jsonl" runlog="$work/run.log" over=no rc=0
  [[ "$np" -gt "$cores" ]] && over=yes
  rm -f "$metrics"
  # shellcheck disable=SC2086
  timeout 300 "${mpi[@]}" -np "$np" "$build/mnist_train" "${common[@]}" $flags --steps "$nsteps" \
    --metrics-out "$metrics" "$@" >"$runlog" 2>&1 || rc=$?
  if [[ $rc -ne 0 ]]; then log "$phase $name FAILED (rc $rc):"; tail -5 "$runlog" >&2; fi
  python3 - "$metrics" "$runlog" "$phase" "$rep" "$name" "$np" "$over" "$flags $*" "$nsteps" "$batch" "$rc" >>"$out_csv" <<'PY'
import csv, json, re, sys
metrics, runlog, phase, rep, name, np, over, flags, steps, batch, rc = sys.argv[1:12]
evals, summary = [], {}
try:
    for line in open(metrics):
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("event") == "eval": evals.append(r)
            elif r.get("event") == "summary": summary = r
except OSError:
    pass
s = summary.get
# ring and local SGD: the summary has the training time as steps x step_ms, the last
# evaluation is the summary's; ps: the last eval record is the final one
seconds = s("train_seconds") or ((s("steps") or 0) * (s("step_ms") or 0) / 1000.0 if summary else "")
points = [(int(e["step"]), float(e["train_seconds"]), float(e["test_accuracy"])) for e in evals]
if summary and (not points or points[-1][0] != s("steps")):
    points.append((int(s("steps")), float(seconds), float(s("test_accuracy"))))
busiest = ""
for m in re.finditer(r"server \d+: \d+ params, \d+ updates, in ([0-9.]+) MB, out ([0-9.]+) MB", open(runlog).read()):
    busiest = max(busiest or 0, int((float(m.group(1)) + float(m.group(2))) * 1e6))
row = [phase, rep, name, np, over, flags.strip(), steps, batch, rc, s("images_per_sec", ""), seconds,
       s("global_batch", ""), s("test_accuracy", ""), s("params", ""), s("server_bytes_received", ""),
       s("server_bytes_sent", ""), busiest, s("dropped_stale", ""), s("rejected_stale", ""),
       s("staleness_max", ""), s("staleness_histogram", ""), s("worker_steps_taken", ""),
       s("replicas_to_aggregate", ""), s("workers", ""),
       ";".join(f"{st}:{sec:.4f}:{acc:.4f}" for st, sec, acc in points) if phase == "curve" else ""]
csv.writer(sys.stdout, lineterminator="\n").writerow(row)
print(f"[bench_strategies] {phase} rep {rep}: {name} (-np {np}): {s('images_per_sec', 0):.0f} images/s, "
      f"accuracy {s('test_accuracy', 0):.4f}", file=sys.stderr)
PY
}

# ---- throughput: every configuration REPS times, interleaved; the slow-worker runs with them ----
for rep in $(seq "$reps"); do
  for spec in "${main_configs[@]}"; do run main "$rep" "$spec" "$steps"; done
  for spec in "${slow_configs[@]}"; do run slow "$rep" "$spec" "$slow_steps" --test-slow-ms "$slow_ms"; done
done
# ---- accuracy against steps: one run each with evaluations ----
for spec in "${main_configs[@]}"; do run curve 1 "$spec" "$steps" --eval-every "$eval_every"; done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
wall=$(( $(date +%s) - started ))

# ---- report ----
python3 - "$out_csv" "$out_md" "$out_png" "$data" "$target" "$reps" "$steps" "$slow_steps" \
  "$eval_every" "$batch" "$slow_ms" "$load_start" "$load_end" "$wall" "${common[*]}" "${mpi[*]}" \
  "$commit" <<'PY'
import csv, datetime, os, statistics, subprocess, sys
(csv_path, md_path, png_path, data, target, reps, steps, slow_steps, eval_every, batch, slow_ms,
 load_start, load_end, wall, common, mpi, commit) = sys.argv[1:18]
target = float(target)
rows = list(csv.DictReader(open(csv_path)))
ok = lambda r: r["rc"] == "0" and r["images_per_sec"]
def runs(phase, name): return [r for r in rows if r["phase"] == phase and r["config"] == name and ok(r)]
def names(phase):
    seen = []
    for r in rows:
        if r["phase"] == phase and r["config"] not in seen: seen.append(r["config"])
    return seen
def med(values): return statistics.median(values) if values else None
def ips(rs): return [float(r["images_per_sec"]) for r in rs]
def fmt_ips(rs):
    v = ips(rs)
    if not v: return "failed"
    return f"{med(v):,.0f} ({min(v):,.0f}-{max(v):,.0f})" if len(v) > 1 else f"{v[0]:,.0f}"
def step_seconds(rs): return med([float(r["train_seconds"]) / float(r["steps"]) for r in rs])
def mb(x): return f"{x / 1e6:.2f}"
def ring_traffic(r, every=1, buffers=1):
    # computed, not measured: a ring allreduce of P floats sends and receives 2 (N-1)/N P 4
    # bytes per rank
    n, p = int(r["ranks"]), int(r["params"])
    return 2 * (n - 1) / n * p * 4 * buffers / every
cpu = subprocess.run("lscpu | sed -n 's/^Model name: *//p'", shell=True, capture_output=True, text=True).stdout.strip()
out = ["## Strategies: ring, parameter servers, local SGD\n"]
out.append(f"- Date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; ringtrain {commit}; data `{data}`; machine: {os.cpu_count()} cores ({cpu}), shared VM; load average (1, 5, 15 min) {load_start} at the start, {load_end} at the end; the whole script took {wall} s")
out.append(f"- Command: `scripts/bench_strategies.sh`; each run: `timeout 300 {mpi} -np N mnist_train {common} --steps S --metrics-out F` plus the configuration's flags (listed in the CSV)")
out.append(f"- Every configuration has 2 workers, per-worker batch {batch} (global batch {2 * int(batch)}), the same seed; ranks beyond the {os.cpu_count()} cores are oversubscribed (*): the servers and mpirun compete with the workers for the cores")
out.append(f"- images/s = steps x global batch / the chief's training time (evaluations excluded: these runs evaluate only at the end); median of {reps} runs (min-max), interleaved; {steps} steps each")
out.append(f"- Time to {target:.2f}: one run of {steps} steps with `--eval-every {eval_every}`; the step of the first evaluation at or above {target:.2f} x the median step time of the throughput runs. A step is one global batch: for ps async, the servers' updates / workers. The eval run's own clock at that evaluation is given too; evaluations are off the clock in every strategy, but under ps async the other worker keeps training while the chief evaluates the 10,000 test images alone, so there that clock counts short")
out.append("- Traffic: ps: bytes the servers received and sent, all servers together, per step (measured by the servers; per step = per round of one batch on each worker); the ring and local SGD: computed, not measured, as 2 (N-1)/N x params x 4 bytes sent (and as many received) per rank per allreduce; local SGD averages the parameters and the momentum buffer every H steps\n")
out.append(f"### 2 workers, {steps} steps\n")
out.append(f"| configuration | ranks | images/s | vs ring | step at {target:.2f} | time to {target:.2f} (s) | eval-run clock at {target:.2f} (s) | final test accuracy | traffic per step, MB | dropped / rejected gradients | max staleness |")
out.append("|---|---|---|---|---|---|---|---|---|---|---|")
ring_ips = med(ips(runs("main", "ring")))
bars, curves = [], []
for name in names("main"):
    rs, cur = runs("main", name), runs("curve", name)
    r0 = rs[0] if rs else None
    star = "*" if r0 and r0["oversubscribed"] == "yes" else ""
    m = med(ips(rs))
    ratio = f"{m / ring_ips:.2f}x" if m and ring_ips else "-"
    reach, clock = "not reached", "-"
    tt = "not reached"
    if cur and rs:
        points = [tuple(map(float, p.split(":"))) for p in cur[0]["evals"].split(";") if p]
        hit = next((p for p in points if p[2] >= target), None)
        st = step_seconds(rs)
        curves.append((name, [(p[0] * st, p[2]) for p in points]))
        if hit:
            reach, tt, clock = f"{hit[0]:.0f}", f"{hit[0] * st:.2f}", f"{hit[1]:.2f}"
    elif not cur:
        reach = tt = "-"
    acc = med([float(r["test_accuracy"]) for r in rs])
    strat = r0["flags"].split()[1] if r0 else ""
    if not r0: traffic = "-"
    elif strat == "ps":
        inb = med([float(r["server_bytes_received"]) / float(r["steps"]) for r in rs])
        outb = med([float(r["server_bytes_sent"]) / float(r["steps"]) for r in rs])
        busiest = med([float(r["busiest_server_bytes"] or 0) / float(r["steps"]) for r in rs])
        traffic = f"{mb(inb)} in + {mb(outb)} out at the servers (busiest server {mb(busiest)})"
    elif strat == "ring":
        t = ring_traffic(r0)
        traffic = f"computed: {mb(t)} out + {mb(t)} in per rank"
    else:
        h = int(r0["flags"].split("--average-every")[1].split()[0])
        t = ring_traffic(r0, every=h, buffers=2)
        traffic = f"computed: {mb(t)} out + {mb(t)} in per rank"
    if strat == "ps":
        drops = f"{med([int(r['dropped_stale']) for r in rs]):g} / {med([int(r['rejected_stale']) for r in rs]):g}"
        stale = f"{max(int(r['staleness_max']) for r in rs)}"
    else:
        drops = stale = "-"
    out.append(f"| {name} | {r0['ranks'] if r0 else '-'}{star} | {fmt_ips(rs)} | {ratio} | {reach} | {tt} | {clock} | {acc:.4f} | {traffic} | {drops} | {stale} |" if rs else f"| {name} | - | failed | - | - | - | - | - | - | - | - |")
    if rs: bars.append((name, m, min(ips(rs)), max(ips(rs))))
hist = [(r["config"], r["staleness_histogram"]) for r in rows if r["phase"] == "main" and r["rep"] == "1" and r["staleness_histogram"]]
if hist:
    out.append("\nStaleness of the applied gradients (updates behind: count, all servers, first repetition): " + "; ".join(f"{n}: {h}" for n, h in hist))
out.append(f"\n### A slow worker: 3 workers, the last sleeps {slow_ms} ms before every step, {slow_steps} steps\n")
out.append("| configuration | ranks | images/s | vs ring | images/s in the updates | worker steps whose gradients were applied | dropped / rejected gradients | max staleness | final test accuracy |")
out.append("|---|---|---|---|---|---|---|---|---|")
sring = med(ips(runs("slow", "ring")))
for name in names("slow"):
    rs = runs("slow", name)
    if not rs:
        out.append(f"| {name} | - | failed | - | - | - | - | - | - |"); continue
    r0, m = rs[0], med(ips(rs))
    star = "*" if r0["oversubscribed"] == "yes" else ""
    frac = int(r0["replicas_to_aggregate"]) / int(r0["workers"]) if r0["workers"] and "sync" in r0["flags"] else 1.0
    applied = f"{m * frac:,.0f} (x {int(r0['replicas_to_aggregate'])}/{r0['workers']})" if frac < 1 else f"{m:,.0f}"
    taken = r0["worker_steps_taken"].replace(",", ", ") if r0["worker_steps_taken"] else "all"
    drops = (f"{med([int(r['dropped_stale']) for r in rs]):g} / {med([int(r['rejected_stale']) for r in rs]):g}"
             if r0["dropped_stale"] else "-")
    stale = f"{max(int(r['staleness_max']) for r in rs)}" if r0["staleness_max"] else "-"
    acc = med([float(r["test_accuracy"]) for r in rs])
    out.append(f"| {name} | {r0['ranks']}{star} | {fmt_ips(rs)} | {m / sring:.2f}x | {applied} | {taken} | {drops} | {stale} | {acc:.4f} |")
out.append(f"\nimages/s counts every worker's batch (steps x 3 x {batch}); with R=2 of 3 each update averages 2 of them, so the images that reach the parameters are 2/3 of it (the column 'in the updates', computed). Worker steps applied: per worker, first repetition; ps async runs until the servers have applied 3 x {slow_steps} updates, so the fast workers do more of them. Dropped: sync gradients that came after the update's R; rejected: async gradients over --max-staleness (default 2 x workers), recomputed (medians).")
out.append(f"\nAll runs: [{os.path.basename(csv_path)}]({os.path.basename(csv_path)}); plot: ![images/s and accuracy against time]({os.path.basename(png_path)})\n")
open(md_path, "w").write("\n".join(out) + "\n")

# ---- plot: bars of images/s (min-max) and accuracy against time ----
dat_bars, dat_curves = md_path[:-3] + ".bars.dat", md_path[:-3] + ".curves.dat"
with open(dat_bars, "w") as f:
    for name, m, lo, hi in bars:
        f.write(f'"{name}" {m} {lo} {hi}\n')
with open(dat_curves, "w") as f:
    for name, pts in curves:
        f.write(f'"{name}"\n' + "".join(f"{x} {y}\n" for x, y in pts) + "\n\n")
script = f"""set terminal pngcairo size 1400,600
set output '{png_path}'
set multiplot layout 1,2
set title 'images/s, 2 workers (median and min-max of {reps})'
set style data histogram; set style histogram errorbars gap 1 lw 1; set style fill solid 0.6
set ylabel 'images/s'; set yrange [0:*]; set grid ytics; set xtics rotate by -30 nomirror
plot '{dat_bars}' using 2:3:4:xtic(1) notitle lc rgb '#4477aa'
set style data linespoints; set xtics norotate autofreq; set grid xtics ytics
set title 'test accuracy against training time (step x median step time)'
set xlabel 'seconds'; set ylabel 'test accuracy'; set yrange [0.8:1]; set key bottom right
set arrow from graph 0, first {target} to graph 1, first {target} nohead dt 2
plot for [i=0:{len(curves) - 1}] '{dat_curves}' index i using 1:2 with linespoints title columnheader(1)
unset multiplot
"""
r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
if r.returncode != 0: print(r.stderr, file=sys.stderr)
os.remove(dat_bars); os.remove(dat_curves)
print(open(md_path).read())
PY
log "wrote $out_md, $out_csv, $out_png in ${wall} s of runs"
