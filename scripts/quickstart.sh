#!/usr/bin/env bash
# The main job on a fresh machine: install the dependencies, build, and train the MLP of the
# source documents data-parallel on 2 ranks (mpirun -np 2) on the default data (Fashion-MNIST
# from Debian, or $RINGTRAIN_DATA, or data/mnist if present). Extra arguments go to
# mnist_train, e.g. --model cnn --epochs 5; RANKS=N changes the number of ranks.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/install_deps.sh"
"$repo/scripts/build.sh"
cd "$repo"
build=${BUILD_DIR:-$repo/build}
ranks=${RANKS:-2}
mpirun_flags=(-np "$ranks")
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)
[ "$ranks" -gt "$(nproc)" ] && mpirun_flags+=(--oversubscribe)
# --batch-size is per rank: 2 ranks x 64 = a global batch of 128.
exec mpirun "${mpirun_flags[@]}" "$build/mnist_train" --model mlp --optimizer adam --lr 1e-3 \
  --batch-size 64 --epochs 1 --log-every 100 --metrics-out "$build/quickstart-metrics.jsonl" "$@"
