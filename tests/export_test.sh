#!/usr/bin/env bash
# mnist_train --export-onnx / --export-safetensors as a user meets them: short runs of the cnn
# (2 ranks, --ema-decay: the EMA weights are exported), an mlp with a --hidden list and
# --strategy ps write the files; tests/export_check.py then runs the ONNX file in OpenCV's DNN
# module (argmax equal to ringtrain's on >= 99.9% of the test set, logits within 1e-4) and
# loads the safetensors into PyTorch modules (the same prediction on every test image, and
# ringtrain's reported accuracy). ringtrain's own logits come from --test-dump-logits, computed
# by its forward under the weights that were exported. Bad paths are refused before training,
# naming the flag and the path, with nothing written.
# Skips (77) when /usr/bin/python3 lacks numpy, cv2 (python3-opencv) or torch (python3-torch);
# the ONNX checks skip (and the script exits 77 after the rest) on a build without libonnx-dev,
# where --export-onnx must be refused.
# Usage: export_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=/usr/bin/python3  # Debian's, which python3-opencv and python3-torch install into
"$py" -c "import numpy, cv2, torch" 2>/dev/null ||
  { echo "SKIPPED: $py cannot import numpy, cv2 and torch (python3-opencv, python3-torch)"; exit 77; }
# shellcheck source=tests/support/trainer_run_lib.sh
source "$here/support/trainer_run_lib.sh"
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "SKIPPED: no $data (dataset-fashion-mnist)"; exit 77; }
short=(--data-dir "$data" --batch-size 32 --log-every 0 --device cpu)
skipped_onnx=0

# A build without the ONNX exporter must refuse the flag before training.
run onnx_probe 60 1 "${short[@]}" --steps 1 --export-onnx "$work/probe.onnx"
if has onnx_probe "this build has no ONNX exporter"; then
  [ "$status" -eq 2 ] || fail "no-ONNX build: --export-onnx exited $status, not 2"
  echo "SKIPPED: the ONNX checks (this build has no ONNX exporter; install libonnx-dev)"
  skipped_onnx=1
elif [ "$status" -ne 0 ] || [ ! -s "$work/probe.onnx" ]; then
  fail "--export-onnx of a 1-step run: exit $status: $(tail -n 5 onnx_probe.log)"
fi

check() {  # check NAME KIND ARGS...: export_check.py KIND ARGS... passes
  local name=$1 out
  shift
  if out=$("$py" "$here/export_check.py" "$@" 2>&1); then pass "$name: $out"; else fail "$name: $out"; fi
}

# check_run NAME MODEL HIDDEN WEIGHTS: the files of run NAME against its logits and summary.
check_run() {
  local name=$1 model=$2 hidden=$3 weights=$4 accuracy
  if [ "$status" -ne 0 ]; then
    fail "$name: exited $status: $(tail -n 20 "$name.log")"
    return
  fi
  accuracy=$(python3 "$here/../scripts/summary_field.py" "$work/$name.jsonl" test_accuracy)
  if [ "$skipped_onnx" -eq 0 ]; then
    check "$name, ONNX in OpenCV" onnx "$work/$name.logits" "$work/$name.onnx" "$data"
    has "$name" "exported the model ($weights weights) to $work/$name.onnx: ONNX opset 13" ||
      fail "$name: no ONNX export line with $weights weights"
  fi
  check "$name, safetensors in PyTorch" safetensors "$work/$name.logits" \
    "$work/$name.safetensors" "$data" "$model" "$hidden" "$accuracy"
  head -c 4096 "$work/$name.safetensors" | grep -qF "\"ringtrain.weights\":\"$weights\"" ||
    fail "$name: the safetensors metadata does not say $weights weights"
}

exports() {  # the export flags of run NAME
  local name=$1
  [ "$skipped_onnx" -eq 0 ] && echo --export-onnx "$work/$name.onnx"
  echo --export-safetensors "$work/$name.safetensors" --test-dump-logits "$work/$name.logits"
}

# shellcheck disable=SC2046  # exports prints whole flags and paths without spaces
run cnn_ema 120 2 "${short[@]}" --model cnn --optimizer adam --lr 2e-3 --steps 100 --ema-decay 0.9 $(exports cnn_ema)
check_run cnn_ema cnn "" EMA
# shellcheck disable=SC2046
run mlp_hidden 120 1 "${short[@]}" --model mlp --hidden 256,128 --optimizer adam --lr 1e-3 \
  --steps 50 $(exports mlp_hidden)
check_run mlp_hidden mlp 256,128 trained
# shellcheck disable=SC2046
run mlp_ps 120 3 "${short[@]}" --model mlp --hidden 64 --strategy ps --num-ps 1 --steps 30 \
  $(exports mlp_ps)
check_run mlp_ps mlp 64 trained

# Bad paths: refused before training (no summary), naming the flag and the path, nothing made.
run missing_dir 60 2 "${short[@]}" --steps 20 --export-safetensors "$work/nowhere/m.safetensors"
if [ "$status" -eq 2 ] && has missing_dir "--export-safetensors $work/nowhere/m.safetensors" &&
  has missing_dir "does not exist" && ! grep -q '"event":"summary"' "$work/missing_dir.jsonl" 2>/dev/null &&
  [ ! -e "$work/nowhere" ]; then
  pass "a missing folder is refused before training (exit 2)"
else
  fail "a missing folder: exit $status: $(tail -n 5 missing_dir.log)"
fi
mkdir -p "$work/a_folder"
run folder 60 1 "${short[@]}" --steps 20 --export-safetensors "$work/a_folder"
[ "$status" -eq 2 ] && has folder "is a folder" && pass "a folder as the path is refused" ||
  fail "a folder as the path: exit $status: $(tail -n 5 folder.log)"
run same_path 60 1 "${short[@]}" --steps 20 --export-safetensors "$work/x" --save-params "$work/x"
[ "$status" -eq 2 ] && has same_path "--export-safetensors and --save-params both name" &&
  [ ! -e "$work/x" ] && pass "one path for two outputs is refused" ||
  fail "one path for two outputs: exit $status: $(tail -n 5 same_path.log)"

finish export
[ "$skipped_onnx" -eq 0 ] || exit 77
