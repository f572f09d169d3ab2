#!/usr/bin/env bash
# mnist_train as an operator meets it: flags, bad input, the files it writes, reproducibility.
# Usage: cli_test.sh PATH/TO/mnist_train
set -uo pipefail
trainer=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_error "what" "text the output must contain" command...
expect_error() {
  local what=$1 needle=$2
  shift 2
  local out status
  out=$("$@" 2>&1)
  status=$?
  if [ "$status" -eq 0 ]; then fail "$what: exited 0"; return; fi
  grep -qF -- "$needle" <<<"$out" || fail "$what: output lacks '$needle': $out"
}

# expect_exit "what" CODE "text the output must contain" command...: the exact exit status.
expect_exit() {
  local what=$1 code=$2 needle=$3
  shift 3
  local out status
  out=$("$@" 2>&1)
  status=$?
  [ "$status" -eq "$code" ] || fail "$what: exited $status, expected $code: $out"
  grep -qF -- "$needle" <<<"$out" || fail "$what: output lacks '$needle': $out"
}

unset RINGTRAIN_DATA
short=(--steps 30 --batch-size 32 --log-every 10 --eval-batch 2000)

"$trainer" --help >/dev/null || fail "--help exited non-zero"
expect_error "missing data dir" "$work/nowhere" "$trainer" --data-dir "$work/nowhere" "${short[@]}"
expect_error "zero batch" "--batch-size" "$trainer" --batch-size 0
expect_error "unknown model" "--model" "$trainer" --model resnet
expect_error "steps and epochs together" "--steps" "$trainer" --steps 5 --epochs 2
expect_exit "unknown optimizer" 2 "--optimizer" "$trainer" --optimizer lion "${short[@]}"
expect_exit "unknown schedule" 2 "--lr-schedule" "$trainer" --lr-schedule cosine "${short[@]}"
expect_exit "unknown log level" 2 "--log-level" "$trainer" --log-level loud "${short[@]}"
expect_exit "a test rank beyond the job" 2 "--test-fail-rank 5 names a rank outside the 1 rank(s)" \
  "$trainer" --test-fail-rank 5 "${short[@]}"
expect_error "hidden with cnn" "--hidden" "$trainer" --model cnn --hidden 10 "${short[@]}"
expect_error "save into a missing folder" "$work/missing/p.bin" \
  "$trainer" "${short[@]}" --save-params "$work/missing/p.bin"

# A data folder with a truncated training image file: the error names that file.
mkdir -p "$work/bad"
for f in train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  cp /usr/share/datasets/fashion-mnist/$f.gz "$work/bad/"
done
gzip -dc /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz | head -c 100000 >"$work/bad/train-images-idx3-ubyte"
expect_error "truncated images" "train-images-idx3-ubyte" "$trainer" --data-dir "$work/bad" "${short[@]}"

# Exit codes (docs/failures.md): 2 for flags, 3 for unusable input.
expect_exit "negative batch" 2 "--batch-size" "$trainer" --batch-size -4
expect_exit "infinite learning rate" 2 "--lr" "$trainer" --lr inf
expect_exit "NaN learning rate" 2 "--lr" "$trainer" --lr nan
expect_exit "--cuda-graphs on the CPU" 2 "--cuda-graphs needs a GPU" \
  "$trainer" --cuda-graphs --device cpu "${short[@]}"
expect_exit "--conv-impl cudnn on the CPU" 2 "--conv-impl cudnn needs a GPU" \
  "$trainer" --conv-impl cudnn --device cpu "${short[@]}"
expect_exit "--conv-impl of nothing known" 2 "--conv-impl" "$trainer" --conv-impl winograd
expect_exit "--data-on-gpu on the CPU" 2 "--data-on-gpu needs a GPU" \
  "$trainer" --data-on-gpu --device cpu "${short[@]}"
expect_exit "unknown model (exit 2)" 2 "--model" "$trainer" --model resnet
expect_exit "missing data (exit 3)" 3 "$work/nowhere" "$trainer" --data-dir "$work/nowhere" "${short[@]}"

# Every numeric flag has a range (docs/usage.md#allowed-ranges): each kind of bad value exits 2
# with a message naming the flag and its range, at once (before the data loads) or, for the
# checks against the data and the rank count, before any training. `timeout` only bounds a
# binary that would accept the value and train (or sleep) for ever.
# expect_range FLAG VALUE [more args]: exit 2, "FLAG: must be ..." in the output.
expect_range() {
  local flag=$1 value=$2
  shift 2
  expect_exit "$flag $value" 2 "$flag: must be" timeout 20 "$trainer" "$flag" "$value" "$@"
}
expect_range --batch-size 3000000000000000000 "${short[@]:0:2}"  # x ranks would overflow int64
expect_range --batch-size 99999999999999999999 --steps 1         # beyond int64 (CLI11 clamps)
expect_range --epochs 4919131752989214 --batch-size 32  # x 1875 steps per epoch wraps negative
expect_range --steps 9223372036854775807
expect_range --steps 1.5  # a fraction of an integer flag
expect_range --lr 1e39 "${short[@]}"                 # finite as a double, inf as a float
expect_range --momentum nan "${short[@]}"
expect_range --momentum 0.9999999999 "${short[@]}"   # 1 as a float
expect_range --weight-decay -1 "${short[@]}"
expect_range --adam-beta2 1 "${short[@]}"
expect_range --adam-epsilon 1e-50 "${short[@]}"      # 0 as a float
expect_range --lr-decay-rate 0 "${short[@]}"
expect_range --lr-decay-steps -1 "${short[@]}"
expect_range --warmup-steps -5 "${short[@]}"
expect_range --warmup-epochs nan "${short[@]}"
expect_range --reference-batch -1 "${short[@]}"
expect_range --ema-decay 1 "${short[@]}"
expect_range --seed -1 "${short[@]}"                 # CLI11 would read 2^64 - 1
expect_range --seed 99999999999999999999999 "${short[@]}"
expect_range --threads 1025 --steps 1 --log-every 0 --eval-batch 10000
expect_range --hidden 0 "${short[@]}"
expect_range --hidden 16,70000 "${short[@]}"
expect_range --log-every 9223372036854775807 "${short[@]:0:4}"
expect_range --check-replicas 9223372036854775807 "${short[@]}"
expect_range --eval-batch 9223372036854775807 "${short[@]:0:6}"  # start + batch overflows
expect_range --fusion-threshold-mb 1e300 "${short[@]}"
expect_range --first-bucket-mb nan "${short[@]}"
expect_range --average-every 9223372036854775807 --strategy local-sgd "${short[@]}"
expect_range --max-bad-steps 9223372036854775807 --check-finite "${short[@]}"
expect_range --checkpoint-secs 1e300 --checkpoint-dir "$work/ck-secs" "${short[@]}"
expect_range --keep-checkpoints 2000000 --checkpoint-dir "$work/ck-keep" "${short[@]}"
expect_range --collective-timeout 1e300 "${short[@]}"  # a steady_clock deadline overflows
# The testing-only flags are hidden from --help; their messages still name them.
expect_range --test-stall-seconds -5 "${short[@]}"
expect_range --test-slow-ms -1 "${short[@]}"
expect_range --test-comm-delay-ms nan "${short[@]}"
expect_range --test-fail-at-step -7 "${short[@]}"
expect_range --test-fail-rank 3000000000 "${short[@]}"
expect_range --test-nan-steps 3,-4 "${short[@]}"
# Against the data and the rank count (exit 2, naming the flag and its largest value here).
expect_exit "a batch larger than the data" 2 "--batch-size must be in [1, 60000]" \
  "$trainer" --steps 1 --batch-size 70000
expect_exit "--epochs x steps per epoch beyond the step limit" 2 \
  "--epochs must be in [1, 533333333]" timeout 20 "$trainer" --epochs 600000000 --batch-size 32
expect_exit "--warmup-epochs x steps per epoch beyond the step limit" 2 \
  "--warmup-epochs must be in [0, 533333333.3333333]" \
  "$trainer" --warmup-epochs 1e11 "${short[@]}"

# Checkpoints: a good one first, then every way one can be unusable.
"$trainer" "${short[@]}" --checkpoint-dir "$work/ck" --checkpoint-every 10 --keep-checkpoints 2 \
  >"$work/ck.log" 2>&1 || fail "the checkpointing run exited non-zero: $(cat "$work/ck.log")"
[ "$(ls "$work/ck" | tr '\n' ' ')" = "ckpt-0000000020.rtckpt ckpt-0000000030.rtckpt " ] ||
  fail "expected the 2 newest checkpoints (steps 20, 30), found: $(ls "$work/ck")"
good="$work/ck/ckpt-0000000030.rtckpt"
size=$(stat -c %s "$good")
head -c $((size / 2)) "$good" >"$work/truncated.rtckpt"
expect_exit "truncated checkpoint" 3 "truncated" "$trainer" "${short[@]}" --resume "$work/truncated.rtckpt"
cp "$good" "$work/corrupt.rtckpt"
printf '\x01' | dd of="$work/corrupt.rtckpt" bs=1 seek=4000 conv=notrunc 2>/dev/null
expect_exit "corrupt checkpoint" 3 "checksum mismatch" "$trainer" "${short[@]}" --resume "$work/corrupt.rtckpt"
cp "$good" "$work/future.rtckpt"
printf '\x09' | dd of="$work/future.rtckpt" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_exit "checkpoint of another version" 3 "format version 9" "$trainer" "${short[@]}" --resume "$work/future.rtckpt"
expect_exit "checkpoint of another model" 3 "is of model mlp" \
  "$trainer" "${short[@]}" --hidden 100 --resume "$good"
expect_exit "checkpoint of another seed" 3 "pass --seed 42" "$trainer" "${short[@]}" --seed 9 --resume "$good"
expect_exit "not a checkpoint at all" 3 "not a ringtrain checkpoint" \
  "$trainer" "${short[@]}" --resume /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz
expect_exit "missing checkpoint file" 3 "cannot open" "$trainer" "${short[@]}" --resume "$work/none.rtckpt"
expect_exit "--resume never over existing checkpoints" 3 "--resume auto" \
  "$trainer" "${short[@]}" --checkpoint-dir "$work/ck" --resume never
[ "$(ls "$work/ck" | wc -l)" -eq 2 ] || fail "--resume never changed the checkpoint directory"
mkdir -p "$work/older" && cp "$work/ck/ckpt-0000000020.rtckpt" "$work/older/"
expect_exit "--resume FILE into a directory with later checkpoints" 3 "holds a later checkpoint" \
  "$trainer" "${short[@]}" --resume "$work/older/ckpt-0000000020.rtckpt" --checkpoint-dir "$work/ck"
touch "$work/plain-file"
expect_exit "checkpoint dir below a file" 3 "--checkpoint-dir $work/plain-file/sub" \
  "$trainer" "${short[@]}" --checkpoint-dir "$work/plain-file/sub"
if [ "$(id -u)" -ne 0 ]; then
  mkdir "$work/readonly" && chmod 555 "$work/readonly"
  expect_exit "read-only checkpoint dir" 3 "cannot write there" \
    "$trainer" "${short[@]}" --checkpoint-dir "$work/readonly"
fi
# --checkpoint-secs: a tiny interval checkpoints after every step; --keep-checkpoints 2 keeps two.
"$trainer" --steps 6 --batch-size 32 --log-every 0 --eval-batch 5000 --checkpoint-dir "$work/secs" \
  --checkpoint-secs 0.000001 --keep-checkpoints 2 >"$work/secs.log" 2>&1 ||
  fail "the --checkpoint-secs run exited non-zero: $(cat "$work/secs.log")"
[ "$(grep -c "checkpoint: step" "$work/secs.log")" -eq 6 ] ||
  fail "--checkpoint-secs: expected 6 checkpoints written: $(grep checkpoint "$work/secs.log")"
[ "$(ls "$work/secs" | tr '\n' ' ')" = "ckpt-0000000005.rtckpt ckpt-0000000006.rtckpt " ] ||
  fail "--checkpoint-secs with --keep-checkpoints 2: found $(ls "$work/secs")"
# A run that is already complete resumes, trains nothing, and still evaluates.
expect_exit "resume a finished run" 0 "nothing left to train" \
  "$trainer" "${short[@]}" --checkpoint-dir "$work/ck"

# Default data, metrics and parameter files, bit-for-bit reproducibility.
for run in a b; do
  "$trainer" "${short[@]}" --seed 5 --eval-every 15 --metrics-out "$work/$run.jsonl" \
    --save-params "$work/$run.bin" >"$work/$run.log" 2>&1 || fail "run $run exited non-zero: $(cat "$work/$run.log")"
done
"$trainer" "${short[@]}" --seed 6 --save-params "$work/c.bin" >/dev/null 2>&1 || fail "run c exited non-zero"
grep -q "fashion-mnist (default" "$work/a.log" || fail "the log does not name the default data path"
grep -q "\[rank 0\]" "$work/a.log" || fail "log lines do not carry the rank"
cmp -s "$work/a.bin" "$work/b.bin" || fail "same seed, different parameters"
cmp -s "$work/a.bin" "$work/c.bin" && fail "different seeds, identical parameters"
[ "$(head -c 8 "$work/a.bin")" = "RTPARAMS" ] || fail "parameter file lacks the RTPARAMS magic"
expected_size=$((16 + 4 * (784 * 500 + 500 + 500 * 500 + 500 + 500 * 10 + 10)))
[ "$(stat -c %s "$work/a.bin")" -eq "$expected_size" ] || fail "parameter file size $(stat -c %s "$work/a.bin") != $expected_size"
last=$(tail -n 1 "$work/a.jsonl")
for key in '"event":"summary"' '"test_accuracy":' '"images_per_sec":' '"step_ms":' '"steps":30'; do
  grep -qF "$key" <<<"$last" || fail "summary line lacks $key: $last"
done
[ "$(grep -c '"event":"train"' "$work/a.jsonl")" -eq 3 ] || fail "expected 3 train lines (every 10 of 30 steps)"
[ "$(grep -c '"event":"eval"' "$work/a.jsonl")" -eq 1 ] || fail "expected 1 intermediate eval line (step 15)"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
