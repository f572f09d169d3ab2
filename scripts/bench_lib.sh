# shellcheck shell=bash
# Shared by the benchmark scripts that launch mnist_train under mpirun and read its summary
# (bench_same_speed.sh, bench_reproducible.sh, reproducible_accuracy.sh,
# reproducible_matrix.sh); sourced after `set -euo pipefail`. It gives:
#  - mpi: the mpirun command line for one node (shared memory; --allow-run-as-root as root);
#  - data: --data-dir "$DATA_DIR" when DATA_DIR is set, else nothing (mnist_train's default);
#  - work: a scratch directory, removed on exit;
#  - field FILE KEY: KEY's value in the summary line of a --metrics-out file;
#  - median: the median of the numbers on standard input, one per line.
data=()
[[ -n "${DATA_DIR:-}" ]] && data=(--data-dir "$DATA_DIR")
mpi=(mpirun --oversubscribe --mca btl self,vader)
[[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() { grep '"event":"summary"' "$1" | grep -o "\"$2\":[^,}]*" | head -n 1 | cut -d: -f2; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
