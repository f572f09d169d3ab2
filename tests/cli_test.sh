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

unset RINGTRAIN_DATA
short=(--steps 30 --batch-size 32 --log-every 10 --eval-batch 2000)

"$trainer" --help >/dev/null || fail "--help exited non-zero"
expect_error "missing data dir" "$work/nowhere" "$trainer" --data-dir "$work/nowhere" "${short[@]}"
expect_error "zero batch" "--batch-size" "$trainer" --batch-size 0
expect_error "unknown model" "--model" "$trainer" --model resnet
expect_error "steps and epochs together" "--steps" "$trainer" --steps 5 --epochs 2
expect_error "unknown optimizer" "--optimizer" "$trainer" --optimizer lion "${short[@]}"
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
