#!/usr/bin/env bash
# scripts/plot_scaling.py (the figure of scripts/bench_scaling.sh, docs/benchmarks-scaling.png)
# on a small CSV written here: the speedups it plots (ringtrain and the emulated network against
# ringtrain's shared-memory 1-rank images/s, the network series starting from that point, DDP
# against its own 1 rank, the oversubscribed points marked), then a PNG of one panel per model
# (checked: a PNG of the figure's size for two models, nothing else written, here or in HOME).
# The refusals (a CSV that is missing, empty, or lacks the needed columns) exit non-zero naming
# the CSV and write nothing. Without matplotlib (Debian's python3-matplotlib) it checks the
# refusals, the speedups and the "install python3-matplotlib" exit (3), then reports skipped
# (77). Nothing is built or timed; a few seconds.
# Usage: tests/plot_scaling_test.sh      exit 0 pass, 1 fail, 77 skipped
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
plot=$here/../scripts/plot_scaling.py
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
# The interpreter itself, not a shim (pyenv's needs its HOME, which one check below replaces).
python=$(python3 -c 'import sys; print(sys.executable)')
export PYTHONDONTWRITEBYTECODE=1   # leave no __pycache__ in scripts/
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "PASS: $*"; }
finish() {
  if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
  echo "all plot_scaling checks passed"
}

header=transport,framework,model,batch,ranks,oversubscribed,overlap,overlapped,images_per_sec,step_ms,compute_ms,comm_ms,exposed_comm_ms,overlap_efficiency
cat >scaling.csv <<EOF
$header
shm,ringtrain,mlp32,32,1,no,auto,True,1000,1,1,0,0,0
shm,pytorch-ddp,mlp32,32,1,no,n/a,True,500,2,,,,
shm,ringtrain,mlp32,32,2,no,auto,False,1800,1,1,0.1,0.1,0
shm,ringtrain,mlp32,32,2,no,on,True,1700,1,1,0.1,0.05,0.5
shm,ringtrain,mlp32,32,2,no,off,False,1800,1,1,0.1,0.1,0
shm,pytorch-ddp,mlp32,32,2,no,n/a,True,900,2,,,,
shm,ringtrain,mlp32,32,4,yes,auto,False,2000,2,1,1,1,0
shm,pytorch-ddp,mlp32,32,4,yes,n/a,True,1000,4,,,,
shm,ringtrain,cnn128,128,1,no,auto,True,400,3,3,0,0,0
shm,pytorch-ddp,cnn128,128,1,no,n/a,True,100,10,,,,
shm,ringtrain,cnn128,128,2,no,auto,False,760,3,3,0.1,0.1,0
shm,pytorch-ddp,cnn128,128,2,no,n/a,True,150,12,,,,
shm,ringtrain,cnn128,128,4,yes,auto,False,800,6,4,2,2,0
shm,pytorch-ddp,cnn128,128,4,yes,n/a,True,160,24,,,,
net-10gbit,ringtrain,mlp32,32,2,no,auto,True,1500,2,1,1,0.5,0.5
net-10gbit,ringtrain,mlp32,32,2,no,off,False,1400,2,1,1,1,0
net-10gbit,ringtrain,mlp32,32,4,yes,auto,True,1200,4,1,3,2,0.3
net-10gbit,ringtrain,cnn128,128,2,no,auto,True,700,3,3,0.2,0.1,0.5
net-10gbit,ringtrain,cnn128,128,4,yes,auto,True,600,6,4,2,1,0.5
EOF

# ---- the speedups drawn (no matplotlib needed: the module's own reading of the CSV) ----
if out=$("$python" - "$here/../scripts" scaling.csv <<'PY' 2>&1
import sys
sys.path.insert(0, sys.argv[1])
import plot_scaling as p
ranks, panels = p.series_of(p.read_rows(sys.argv[2]))
got = {(title, label.split(" (")[0]): [(n, round(y, 6), over) for n, y, over in pts]
       for title, base, lines in panels for label, key, pts in lines}
want = {
    ("mlp, batch 32", "ringtrain, shared memory"): [(1, 1.0, False), (2, 1.8, False), (4, 2.0, True)],
    ("mlp, batch 32", "PyTorch DDP, shared memory"): [(1, 1.0, False), (2, 1.8, False), (4, 2.0, True)],
    ("mlp, batch 32", "ringtrain, emulated network 10gbit"): [(1, 1.0, False), (2, 1.5, False), (4, 1.2, True)],
    ("cnn, batch 128", "ringtrain, shared memory"): [(1, 1.0, False), (2, 1.9, False), (4, 2.0, True)],
    ("cnn, batch 128", "PyTorch DDP, shared memory"): [(1, 1.0, False), (2, 1.5, False), (4, 1.6, True)],
    ("cnn, batch 128", "ringtrain, emulated network 10gbit"): [(1, 1.0, False), (2, 1.75, False), (4, 1.5, True)],
}
assert ranks == [1, 2, 4], ranks
assert [t for t, _, _ in panels] == ["mlp, batch 32", "cnn, batch 128"], [t for t, _, _ in panels]
assert [b for _, b, _ in panels] == [1000.0, 400.0], [b for _, b, _ in panels]
assert got == want, f"got {got}"
print(f"{len(got)} series as expected")
PY
); then
  pass "speedups: ringtrain and the network against ringtrain's shm 1 rank, DDP against its own: $out"
else
  fail "the speedups plot_scaling.py draws: $out"
fi

# shellcheck source=tests/support/plot_run_lib.sh
source "$here/support/plot_run_lib.sh"
last=absent; plot_run "$last" "$work/absent.csv" out.png
refused "a CSV that does not exist" "$work/absent.csv"
: >empty.csv
last=empty; plot_run "$last" "$work/empty.csv" out.png
refused "an empty CSV" "$work/empty.csv is empty"
printf 'model,ranks,step_ms\nmlp32,1,1.5\n' >columns.csv
last=columns; plot_run "$last" "$work/columns.csv" out.png
refused "a CSV without the needed columns" \
  "$work/columns.csv lacks the column(s) transport, framework, oversubscribed, overlap, images_per_sec"
last=no_folder; plot_run "$last" scaling.csv "$work/absent/out.png"
refused "an output folder that does not exist" "does not exist"

matplotlib=no
"$python" -c 'import matplotlib' 2>/dev/null && matplotlib=yes
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && matplotlib=yes
if [ "$matplotlib" = no ]; then
  last=no_matplotlib; plot_run "$last" scaling.csv out.png
  if [ "$status" -eq 3 ] && grep -q 'install .*python3-matplotlib' no_matplotlib.out &&
    [ ! -e out.png ]; then
    pass "without matplotlib: exit 3, telling what to install, nothing written"
  else
    fail "without matplotlib (exit $status): $(cat no_matplotlib.out)"
  fi
  [ "$failures" -eq 0 ] || finish
  echo "skipped: no python3 here imports matplotlib (apt-get install python3-matplotlib)"
  exit 77
fi

# An empty home of its own: matplotlib's cache (~/.cache/matplotlib) must not land there either.
mkdir home
echo "an older figure" >scaling.png
before=$(find . -mindepth 1 ! -name scaling.png | sort)
last=plot
HOME=$work/home MPLCONFIGDIR='' plot_run "$last" scaling.csv scaling.png
# PNG signature, then the IHDR chunk's width and height (big-endian) at bytes 16..23.
size=$("$python" -c 'import struct,sys; b=open(sys.argv[1],"rb").read(24); \
print("%dx%d" % struct.unpack(">II", b[16:24]) if b[:8]==b"\x89PNG\r\n\x1a\n" else "no PNG")' \
  scaling.png 2>&1)
# two models: one row of two panels, 11.2 x 5.35 inches at 100 dpi
if [ "$status" -eq 0 ] && [ "$size" = "1120x535" ] &&
  grep -qF 'scaling.png: 2 panel(s), 6 series from scaling.csv' plot.out; then
  pass "a PNG of two models' panels over the older file: $size, $(stat -c %s scaling.png) bytes; $(cat plot.out)"
else
  fail "plot_scaling.py on the CSV (exit $status, image '$size'): $(cat plot.out)"
fi
after=$(find . -mindepth 1 ! -name scaling.png ! -name plot.out | sort)
if [ "$before" = "$after" ] && [ -z "$(ls -A home)" ]; then
  pass "nothing but the PNG was written (no temporary left, nothing in HOME)"
else
  fail "plot_scaling.py wrote more than its PNG: $(diff <(echo "$before") <(echo "$after")) $(ls -A home)"
fi

finish
