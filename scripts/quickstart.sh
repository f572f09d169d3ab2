#!/usr/bin/env bash
# The main job on a fresh machine: install the dependencies, build, and train the MLP of the
# source documents on the default data (Fashion-MNIST from Debian, or $RINGTRAIN_DATA, or
# data/mnist if present). Extra arguments go to mnist_train, e.g. --model cnn --epochs 5.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/install_deps.sh"
"$repo/scripts/build.sh"
cd "$repo"
exec "${BUILD_DIR:-$repo/build}/mnist_train" --model mlp --optimizer adam --lr 1e-3 \
  --batch-size 128 --epochs 1 --log-every 100 --metrics-out "${BUILD_DIR:-$repo/build}/quickstart-metrics.jsonl" "$@"
