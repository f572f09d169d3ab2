#!/usr/bin/env bash
# The step model (scripts/scaling_model.py, docs/scaling-model.md): its unit cases, and a
# compute profile read from a real 2-rank mlp run's --timeline (--overlap off, 8 steps): every
# parameter in one bucket, buckets ready in order inside backward. The launch runs under
# `timeout`.
# Also scripts/predict_scaling: a measured profile taken and said, its refusals.
# Usage: scaling_model_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
# shellcheck source=tests/support/trainer_run_lib.sh
source "$here/support/trainer_run_lib.sh"

# the default mlp, 784-500-500-10, and one of 784-64-10
run traced 120 2 --steps 8 --batch-size 32 --log-every 0 --eval-batch 5000 \
  --device cpu --overlap off --timeline "$work/trace.json"
[ "$status" -eq 0 ] || fail "the traced run (exit $status): $(tail -n 5 traced.log)"
run small 120 2 --steps 8 --batch-size 32 --hidden 64 --log-every 0 --eval-batch 5000 \
  --device cpu --overlap off --timeline "$work/small.json"
[ "$status" -eq 0 ] || fail "the small traced run (exit $status): $(tail -n 5 small.log)"
if python3 "$here/scaling_model_test.py" "$work/trace.json" \
    $((784 * 500 + 500 + 500 * 500 + 500 + 500 * 10 + 10)) >model.log 2>&1; then
  pass "scaling_model.py: $(tail -n 1 model.log)"
else
  fail "scaling_model.py: $(tail -n 30 model.log)"
fi
# scripts/predict_scaling: a measured profile is taken and said; bad --profile and --out are
# refused naming them, writing nothing; with matplotlib, the document and its two plots.
predict=$here/../scripts/predict_scaling
python3 "$here/../scripts/scaling_model.py" profile "$work/trace.json" >"$work/p.profile" 2>model.log ||
  fail "scaling_model.py profile: $(tail -n 3 model.log)"
python3 "$here/../scripts/scaling_model.py" profile "$work/small.json" >"$work/small.profile" 2>model.log ||
  fail "scaling_model.py profile (small): $(tail -n 3 model.log)"
refused() {  # refused WHAT TEXT ARGS...: predict_scaling exits non-zero naming TEXT
  local what=$1 text=$2
  shift 2
  if out=$(python3 "$predict" "$@" 2>&1); then
    fail "predict_scaling $what: exited 0"
  elif ! grep -qF -- "$text" <<<"$out"; then
    fail "predict_scaling $what: the message lacks '$text': $out"
  fi
}
refused "--out into a missing folder" "--out $work/none/sm.md" --out "$work/none/sm.md"
refused "--out a folder" "name a Markdown file" --out "$work"
refused "--profile bogus=..." "bogus" --out "$work/sm.md" --profile bogus="$work/p.profile"
refused "--profile of no JSON" "$work/model.log" --out "$work/sm.md" --profile mlp="$work/model.log"
refused "--profile of another model" "a profile of another model" --out "$work/sm.md" \
  --profile mlp="$work/small.profile"
refused "--validation that does not exist" "--validation $work/none.md" --out "$work/sm.md" \
  --validation "$work/none.md"
[ -e "$work/sm.md" ] && fail "a refused predict_scaling wrote $work/sm.md"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || python3 -c 'import matplotlib' 2>/dev/null; then
  if python3 "$predict" --out "$work/sm.md" --profile mlp="$work/p.profile" >predict.log 2>&1; then
    for want in "ring, overlap" "ring, no overlap" "two-level ring, overlap (not in ringtrain)" \
        "parameter servers" "local SGD" "1024 GPUs" \
        "assumed:" "measured: $work/p.profile" "25.6M-parameter"; do
      grep -qF -- "$want" "$work/sm.md" || fail "predict_scaling's document lacks '$want'"
    done
    for png in sm-throughput.png sm-efficiency.png; do
      [ "$(head -c 8 "$work/$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
        fail "predict_scaling did not write the PNG $png"
    done
    [ "$failures" -eq 0 ] && pass "predict_scaling: the document and both plots"
  else
    fail "predict_scaling: $(tail -n 5 predict.log)"
  fi
else
  echo "predict_scaling's plots not checked: no python3 here imports matplotlib"
fi
finish "scaling model"
