#!/usr/bin/env bash
# scripts/plot_metrics on a real run (docs/usage.md, "Plotting a run"): a short 2-rank run's
# metrics file and a 1-rank one drawn into one PNG (checked: a PNG of the figure's size), and
# nothing written beside it; docs/usage.md's metrics schema names every record and field these
# runs wrote; the refusals (no -o, a folder that does not exist, a file that is
# no metrics file, labels that do not match the files) exit non-zero and write nothing. Without
# matplotlib (Debian's python3-matplotlib, which scripts/install_deps.sh installs) it checks
# the refusals and the "install python3-matplotlib" exit (3), then reports skipped (77). Every
# launch runs under `timeout`.
# Usage: plot_metrics_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
plot=$here/../scripts/plot_metrics
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
# The interpreter itself, not a shim (pyenv's needs its HOME, which one check below replaces).
python=$(python3 -c 'import sys; print(sys.executable)')
# shellcheck source=tests/support/trainer_run_lib.sh
source "$here/support/trainer_run_lib.sh"

short=(--steps 40 --batch-size 32 --hidden 64 --log-every 5 --eval-every 10 --eval-batch 5000
       --device cpu)
run two_ranks 120 2 "${short[@]}"
[ "$status" -eq 0 ] || fail "the 2-rank run (exit $status): $(tail -n 5 two_ranks.log)"
run one_rank 120 1 "${short[@]}" --lr 0.05
[ "$status" -eq 0 ] || fail "the 1-rank run (exit $status): $(tail -n 5 one_rank.log)"

# docs/usage.md's schema names every field these runs wrote (the docs say what the code does).
if out=$(python3 - "$here/../docs/usage.md" two_ranks.jsonl one_rank.jsonl <<'PY' 2>&1
import json, re, sys
doc = open(sys.argv[1], encoding="utf-8").read()
schema = doc[doc.index("## The metrics file (schema)"):]
schema = schema[:schema.index("\n## ", 1)]
documented = set(re.findall(r"`([a-z0-9_]+)`", schema))
missing = set()
for path in sys.argv[2:]:
    for line in open(path, encoding="utf-8"):
        record = json.loads(line)
        missing |= {f"{record['event']}.{k}" for k in record
                    if k != "event" and k not in documented}
        if record["event"] not in documented:
            missing.add(record["event"])
print(", ".join(sorted(missing)) if missing else f"{len(documented)} names documented")
sys.exit(1 if missing else 0)
PY
); then
  pass "docs/usage.md's metrics schema covers every record and field written: $out"
else
  fail "docs/usage.md's metrics schema lacks: $out"
fi

# shellcheck source=tests/support/plot_run_lib.sh
source "$here/support/plot_run_lib.sh"
last=no_output; plot_run "$last" two_ranks.jsonl
refused "no -o" "-o/--output"
last=no_folder; plot_run "$last" -o "$work/absent/out.png" two_ranks.jsonl
refused "-o in a folder that does not exist" "does not exist"
printf 'not json\n' >garbage.jsonl
last=garbage; plot_run "$last" -o "$work/out.png" garbage.jsonl
refused "a file that is no metrics file" "garbage.jsonl:1: not a JSON line"
last=labels; plot_run "$last" -o "$work/out.png" two_ranks.jsonl one_rank.jsonl --label a
refused "one --label for two files" "1 --label(s) for 2 file(s)"

matplotlib=no
"$python" -c 'import matplotlib' 2>/dev/null && matplotlib=yes
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && matplotlib=yes
if [ "$matplotlib" = no ]; then
  last=no_matplotlib; plot_run "$last" -o "$work/out.png" two_ranks.jsonl
  if [ "$status" -eq 3 ] && grep -q 'install .*python3-matplotlib' no_matplotlib.out &&
    [ ! -e out.png ]; then
    pass "without matplotlib: exit 3, telling what to install, nothing written"
  else
    fail "without matplotlib (exit $status): $(cat no_matplotlib.out)"
  fi
  [ "$failures" -eq 0 ] || finish plot_metrics
  echo "skipped: no python3 here imports matplotlib (apt-get install python3-matplotlib)"
  exit 77
fi

# An empty home of its own: matplotlib's cache (~/.cache/matplotlib) must not land there either.
mkdir home
before=$(find . -mindepth 1 | sort)
last=plot
HOME=$work/home MPLCONFIGDIR='' plot_run "$last" -o "$work/runs.png" two_ranks.jsonl one_rank.jsonl \
  --label "2 ranks" --label "1 rank, lr 0.05" --title "plot_metrics test"
# PNG signature, then the IHDR chunk's width and height (big-endian) at bytes 16..23.
size=$("$python" -c 'import struct,sys; b=open(sys.argv[1],"rb").read(24); \
print("%dx%d" % struct.unpack(">II", b[16:24]) if b[:8]==b"\x89PNG\r\n\x1a\n" else "no PNG")' \
  runs.png 2>&1)
if [ "$status" -eq 0 ] && [ "$size" = "1200x800" ] && grep -q 'runs.png: 2 run(s), 24 points' plot.out; then
  pass "a PNG of two runs: $size, $(stat -c %s runs.png) bytes; $(cat plot.out)"
else
  fail "plot_metrics on two runs (exit $status, image '$size'): $(cat plot.out)"
fi
after=$(find . -mindepth 1 ! -name runs.png ! -name plot.out | sort)
if [ "$before" = "$after" ] && [ -z "$(ls -A home)" ]; then
  pass "nothing but the PNG was written (here or in HOME)"
else
  fail "plot_metrics wrote more than its PNG: $(diff <(echo "$before") <(echo "$after")) $(ls -A home)"
fi

finish plot_metrics
