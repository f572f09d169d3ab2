#!/usr/bin/env bash
# The step model (scripts/scaling_model.py, docs/scaling-model.md): its unit cases, and a
# compute profile read from a real 2-rank mlp run's --timeline (--overlap off, 8 steps): every
# parameter in one bucket, buckets ready in order inside backward. The launch runs under
# `timeout`.
# Usage: scaling_model_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
# shellcheck source=tests/support/trainer_run_lib.sh
source "$here/support/trainer_run_lib.sh"

# 784-64-10: 784 x 64 + 64 + 64 x 10 + 10 parameters
run traced 120 2 --steps 8 --batch-size 32 --hidden 64 --log-every 0 --eval-batch 5000 \
  --device cpu --overlap off --timeline "$work/trace.json"
[ "$status" -eq 0 ] || fail "the traced run (exit $status): $(tail -n 5 traced.log)"
if python3 "$here/scaling_model_test.py" "$work/trace.json" $((784 * 64 + 64 + 64 * 10 + 10)) \
    >model.log 2>&1; then
  pass "scaling_model.py: $(tail -n 1 model.log)"
else
  fail "scaling_model.py: $(tail -n 30 model.log)"
fi
# scripts/predict_scaling: a measured profile is taken and said; bad --profile and --out are
# refused naming them, writing nothing; with matplotlib, the document and its two plots.
predict=$here/../scripts/predict_scaling
python3 "$here/../scripts/scaling_model.py" profile "$work/trace.json" >"$work/p.profile" 2>model.log ||
  fail "scaling_model.py profile: $(tail -n 3 model.log)"
if out=$(python3 "$predict" --out "$work/none/sm.md" 2>&1); then
  fail "predict_scaling --out into a missing folder exited 0"
else
  grep -qF -- "--out $work/none/sm.md" <<<"$out" || fail "predict_scaling --out refusal does not name it: $out"
fi
if out=$(python3 "$predict" --out "$work/sm.md" --profile bogus="$work/p.profile" 2>&1); then
  fail "predict_scaling --profile bogus=... exited 0"
else
  grep -qF "bogus" <<<"$out" || fail "predict_scaling --profile refusal does not name it: $out"
fi
if out=$(python3 "$predict" --out "$work/sm.md" --profile mlp="$work/model.log" 2>&1); then
  fail "predict_scaling --profile mlp=<not JSON> exited 0"
fi
[ -e "$work/sm.md" ] && fail "a refused predict_scaling wrote $work/sm.md"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || python3 -c 'import matplotlib' 2>/dev/null; then
  if python3 "$predict" --out "$work/sm.md" --validation "$work/none.md" \
      --profile mlp="$work/p.profile" >predict.log 2>&1; then
    for want in "ring, overlap" "ring, no overlap" "parameter servers" "local SGD" "1024 GPUs" \
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
