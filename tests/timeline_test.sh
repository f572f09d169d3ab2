#!/usr/bin/env bash
# mnist_train --timeline as an operator meets it: a 2-rank run writes one Chrome trace with both
# ranks' processes, their threads, each layer's backward and each bucket's ready / allreduce
# events in order (checked by support/check_timeline.py), with overlap on and off and for both
# models; a bad path fails before training, naming --timeline and the path, and writes nothing;
# --strategy ps refuses it. Skips (77) without python3, which reads the JSON.
# Usage: timeline_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v python3 >/dev/null || { echo "skipped: no python3 to read the trace"; exit 77; }
# shellcheck source=tests/support/trainer_run_lib.sh
source "$here/support/trainer_run_lib.sh"
short=(--steps 12 --batch-size 32 --log-every 0 --eval-batch 5000 --eval-every 6 --device cpu)

check() {  # check NAME TRACE NAMES...: the trace file passes check_timeline.py
  local name=$1 trace=$2
  shift 2
  local out
  if out=$(python3 "$here/support/check_timeline.py" "$trace" 2 "$@" 2>&1); then
    pass "$name: $out"
  else
    fail "$name: $out"
  fi
}

common_names=(step data forward backward optimizer evaluation "wait for gradients"
              "bucket 0 ready" "allreduce bucket 0")
run cnn_overlap 120 2 "${short[@]}" --model cnn --overlap on --timeline "$work/cnn.json"
if [ "$status" -eq 0 ] && [ -f "$work/cnn.json" ]; then
  check "cnn, overlap on" "$work/cnn.json" "${common_names[@]}" "backward 0.conv3x3(1->8)" \
    "backward 7.dense(784->10)"
  python3 -c "import json,sys; t=json.load(open(sys.argv[1])); \
names={(e['pid'],e['tid'],e['args']['name']) for e in t['traceEvents'] if e['name']=='thread_name'}; \
sys.exit(0 if (0,1,'communication') in names and (1,0,'compute') in names else 1)" "$work/cnn.json" ||
    fail "cnn: the threads are not named compute / communication"
  has cnn_overlap "timeline: " || fail "cnn: no 'timeline:' line in the log"
else
  fail "cnn, overlap on: exited $status or wrote no trace: $(tail -n 20 cnn_overlap.log)"
fi

run mlp_no_overlap 120 2 "${short[@]}" --model mlp --overlap off --checkpoint-dir "$work/ck" \
  --checkpoint-every 6 --timeline "$work/mlp.json"
if [ "$status" -eq 0 ] && [ -f "$work/mlp.json" ]; then
  check "mlp, overlap off, checkpoints" "$work/mlp.json" "${common_names[@]}" \
    "backward 5.dense(500->10)"
  grep -q '"name":"checkpoint"' "$work/mlp.json" || fail "mlp: no checkpoint event"
else
  fail "mlp, overlap off: exited $status or wrote no trace: $(tail -n 20 mlp_no_overlap.log)"
fi

run local_sgd 120 2 "${short[@]}" --strategy local-sgd --average-every 4 --timeline "$work/l.json"
if [ "$status" -eq 0 ] && [ -f "$work/l.json" ]; then
  check "local-sgd" "$work/l.json" step data forward backward optimizer "parameter average"
else
  fail "local-sgd: exited $status or wrote no trace: $(tail -n 20 local_sgd.log)"
fi

# A bad path: refused before training, naming the flag and the path, nothing written.
run missing_dir 60 2 "${short[@]}" --timeline "$work/nowhere/t.json"
if [ "$status" -eq 0 ]; then
  fail "a missing folder: exited 0"
else
  has missing_dir "--timeline $work/nowhere/t.json" || fail "missing folder: $(tail -n 5 missing_dir.log)"
  grep -q '"event":"train"' "$work/missing_dir.jsonl" 2>/dev/null && fail "missing folder: it trained"
  [ -e "$work/nowhere" ] && fail "missing folder: something was created"
  pass "a missing folder is refused (exit $status)"
fi
mkdir -p "$work/a_folder"
run folder 60 2 "${short[@]}" --timeline "$work/a_folder"
[ "$status" -ne 0 ] && has folder "is a folder" || fail "a folder as the path: $(tail -n 5 folder.log)"

run ps 60 3 "${short[@]}" --strategy ps --num-ps 1 --timeline "$work/ps.json"
[ "$status" -eq 2 ] && has ps "--timeline" || fail "--strategy ps: exit $status: $(tail -n 5 ps.log)"
[ -e "$work/ps.json" ] && fail "--strategy ps wrote a trace"

finish timeline
