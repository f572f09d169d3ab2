#!/usr/bin/env bash
# --reproducible under mpirun (docs/reproducibility.md), every launch under `timeout`. Each
# claim holds by construction (micro-shards of fixed shape, an exact integer sum), so each is
# checked as byte equality of --save-params, on any CPU:
#  (a) the mlp with SGD and momentum: np = 1, 2, 3, 4 and 6 (G = 96, m = 8) give the same bits,
#      with overlap on and off;
#  (b) the cnn with Adam: np = 1, 2 and 4 give the same bits;
#  (c) a run on 4 ranks stopped at step 20 and resumed from its checkpoint on 3 ranks (and on
#      1) ends with the bits of the uninterrupted run;
#  (d) a rank count that cannot share the micro-shards, and flags the guarantee cannot keep,
#      are refused with exit 2 and a message naming the flag;
#  (e) --accumulate-steps K (K passes of G / K per optimizer step) gives the bits of one pass
#      of G: np x K = 1 x 4, 2 x 2 and 3 x 2;
#  (f) --strategy ps --ps-mode sync gives the ring's bits: 1 server and 2 workers, 2 servers
#      and 3 workers (mlp), 1 server and 2 workers (cnn with Adam); asynchronous servers and
#      backup workers are refused;
#  (g) a resume with another --micro-batch than the checkpoint's is refused (exit 3);
#  (h) a NaN in one worker's batch under the parameter servers ends the whole job with exit 5
#      (the servers too, which were waiting for its push), well before --collective-timeout.
# Usage: reproducible_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"
ok() {  # ok NAME: the run exited 0
  [ "$status" -eq 0 ] || fail "$1 exited $status: $(tail -n 20 "$1.log")"
  [ "$status" -eq 0 ]
}
same() {  # same WHAT A B: byte-identical parameter files
  if cmp -s "$2" "$3"; then pass "$1"; else fail "$1: $2 and $3 differ"; fi
}

repro=(--reproducible --global-batch-size 96 --micro-batch 8 --log-every 0 --eval-batch 5000
  --seed 5)
mlp=("${repro[@]}" --steps 40 --optimizer sgd --momentum 0.9 --lr 0.05)

# ---- (a) mlp, SGD with momentum, any rank count, overlap on and off ----
run mlp1 120 1 "${mlp[@]}" --save-params mlp1.bin && ok mlp1
for np in 2 3 4 6; do
  run "mlp$np" 180 "$np" "${mlp[@]}" --overlap on --save-params "mlp$np.bin" &&
    ok "mlp$np" && same "(a) mlp: np=$np with overlap equals np=1" mlp1.bin "mlp$np.bin"
done
for np in 2 6; do
  run "mlp${np}_off" 180 "$np" "${mlp[@]}" --overlap off --save-params "mlp${np}_off.bin" &&
    ok "mlp${np}_off" && same "(a) mlp: np=$np without overlap equals np=1" mlp1.bin \
    "mlp${np}_off.bin"
done
has mlp4 "12 micro-shards of 8 rows, 3 on each rank" ||
  fail "(a) the log does not say how the micro-shards are shared: $(grep -i micro mlp4.log)"

# ---- (b) cnn, Adam ----
cnn=("${repro[@]}" --model cnn --steps 12 --optimizer adam --lr 0.001)
run cnn1 180 1 "${cnn[@]}" --save-params cnn1.bin && ok cnn1
for np in 2 4; do
  run "cnn$np" 240 "$np" "${cnn[@]}" --save-params "cnn$np.bin" &&
    ok "cnn$np" && same "(b) cnn with Adam: np=$np equals np=1" cnn1.bin "cnn$np.bin"
done

# ---- (c) resume on another rank count ----
for target in 3 1; do
  ck="$work/ck$target"
  run "stop$target" 120 4 "${mlp[@]}" --checkpoint-dir "$ck" --checkpoint-every 20 \
    --test-fail-rank 1 --test-fail-at-step 25
  [ "$status" -ne 0 ] || fail "(c) the run meant to fail at step 25 exited 0"
  run "resume$target" 120 "$target" "${mlp[@]}" --checkpoint-dir "$ck" \
    --save-params "resume$target.bin" && ok "resume$target" &&
    same "(c) stopped on 4 ranks at step 20, resumed on $target: the uninterrupted bits" \
      mlp1.bin "resume$target.bin"
  has "resume$target" "resuming a 4-rank checkpoint on $target ranks" ||
    fail "(c) resume$target does not say it resumed a 4-rank checkpoint: $(grep -i resum \
      "resume$target.log")"
done

# ---- (d) refusals ----
refused() {  # refused WHAT NP TEXT flags...: exit 2 and TEXT in the log
  local what=$1 np=$2 text=$3
  shift 3
  run refused 60 "$np" --steps 1 "$@"
  if [ "$status" -eq 2 ] && has refused "$text"; then
    pass "(d) $what: exit 2"
  else
    fail "(d) $what: exit $status, wanted 2 with '$text': $(tail -n 3 refused.log)"
  fi
}
refused "5 ranks for 12 micro-shards" 5 "run on 1, 2, 3, 4, 6, 12 rank(s)" "${repro[@]}"
refused "--reproducible without --global-batch-size" 1 "--reproducible needs --global-batch-size" \
  --reproducible
refused "--micro-batch without --reproducible" 1 "--micro-batch is a flag of --reproducible" \
  --micro-batch 4
refused "a global batch that is not whole micro-shards" 1 "not a whole number of --micro-batch" \
  --reproducible --global-batch-size 100 --micro-batch 8
refused "--reproducible under --strategy local-sgd" 2 "--strategy ring or ps" "${repro[@]}" \
  --strategy local-sgd
refused "--reproducible with asynchronous servers" 3 "needs --ps-mode sync" "${repro[@]}" \
  --strategy ps --ps-mode async
refused "--reproducible with backup workers" 4 "would leave out the gradients of the slowest 1" \
  "${repro[@]}" --strategy ps --replicas-to-aggregate 2
refused "--global-batch-size that 5 ranks cannot share" 5 "cannot be shared evenly by 5" \
  --global-batch-size 96
refused "--accumulate-steps under --strategy ps" 2 "a flag of --strategy ring and local-sgd" \
  --strategy ps --accumulate-steps 2

# ---- (e) gradient accumulation: K passes of G / K per optimizer step, the same bits ----
for config in "1 4" "2 2" "3 2"; do
  read -r np passes <<<"$config"
  name="acc${np}x$passes"
  run "$name" 180 "$np" "${mlp[@]}" --accumulate-steps "$passes" --save-params "$name.bin" &&
    ok "$name" &&
    same "(e) mlp: np=$np x --accumulate-steps $passes equals np=1 in one pass" mlp1.bin \
      "$name.bin"
done
has acc2x2 "40 steps" && has acc2x2 "optimizer steps of 2 passes each" ||
  fail "(e) the summary does not count optimizer steps of 2 passes: $(grep summary acc2x2.log)"

# ---- (f) parameter servers in sync mode: the ring's bits ----
for config in "3 1" "5 2"; do
  read -r np servers <<<"$config"
  name="ps${np}_$servers"
  run "$name" 180 "$np" "${mlp[@]}" --strategy ps --num-ps "$servers" --save-params "$name.bin" &&
    ok "$name" &&
    same "(f) mlp: $servers server(s) and $((np - servers)) workers equal the ring on 1 rank" \
      mlp1.bin "$name.bin"
done
run ps_cnn 240 3 "${cnn[@]}" --strategy ps --num-ps 1 --save-params ps_cnn.bin && ok ps_cnn &&
  same "(f) cnn with Adam: 1 server and 2 workers equal the ring on 1 rank" cnn1.bin ps_cnn.bin

# ---- (g) a resume must keep --micro-batch ----
other_m=("${mlp[@]}")
other_m[4]=4  # repro's --micro-batch 8 becomes 4
run other_m 60 2 "${other_m[@]}" --checkpoint-dir "$work/ck3"
if [ "$status" -eq 3 ] && has other_m "pass --micro-batch 8"; then
  pass "(g) a resume with another --micro-batch: exit 3"
else
  fail "(g) a resume with another --micro-batch: exit $status: $(tail -n 3 other_m.log)"
fi

# ---- (h) a NaN on one parameter-server worker ends the job ----
start=$SECONDS
run ps_nan 120 3 "${mlp[@]}" --strategy ps --num-ps 1 --test-nan-rank 2 --test-nan-steps 5 \
  --collective-timeout 100
if [ "$status" -eq 5 ] && has ps_nan "NaN or infinite" && [ $((SECONDS - start)) -lt 60 ]; then
  pass "(h) a NaN on worker rank 2: exit 5 in $((SECONDS - start)) s"
else
  fail "(h) a NaN on worker rank 2: exit $status after $((SECONDS - start)) s: $(tail -n 3 ps_nan.log)"
fi

finish reproducible
