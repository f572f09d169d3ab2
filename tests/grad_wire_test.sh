#!/usr/bin/env bash
# --grad-wire as an operator runs it (docs/usage.md, "A 16-bit gradient wire"):
#  (a) np=2 trains with bf16 and fp16 gradients on the wire; the replicas end bitwise identical
#      (every run's final replica check, and --check-replicas every 5 steps);
#  (b) the summary's wire_bytes_per_step is half of fp32's, give or take the 16-bit wire's pads
#      and fp16's bound exchange (a few bytes per bucket), and the train records carry it too;
#  (c) where a 16-bit wire cannot run it is refused, exit 2, naming the flags.
# Usage: grad_wire_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"
# field FILE KEY: KEY's value in the summary record of a --metrics-out file.
field() { grep '"event":"summary"' "$1" | grep -o "\"$2\":[^,}]*" | head -n 1 | cut -d: -f2- | tr -d '"'; }
check() { awk -v a="${1:-}" -v b="${2:-}" "BEGIN { exit !($3) }"; }

short=(--model mlp --steps 20 --batch-size 32 --log-every 10 --eval-batch 2000
       --check-replicas 5 --fusion-threshold-mb 0.5 --first-bucket-mb 0.1)

# ---- (a), (b) ----
for wire in fp32 bf16 fp16; do
  run "$wire" 240 2 "${short[@]}" --device cpu --grad-wire "$wire"
  if [ "$status" -ne 0 ]; then
    fail "$wire: exited $status: $(tail -n 15 "$wire.log")"
    continue
  fi
  # Exit 0 means every replica check passed: check_replicas throws on any differing bit.
  [ "$(field "$wire.jsonl" grad_wire)" = "$wire" ] || fail "$wire: summary grad_wire is not $wire"
  pass "$wire: trained on 2 ranks, replicas identical; $(grep -m1 "wire:" "$wire.log" | sed 's/.*summary: //')"
done
fp32=$(field fp32.jsonl wire_bytes_per_step)
for wire in bf16 fp16; do
  [ -f "$wire.jsonl" ] || continue
  bytes=$(field "$wire.jsonl" wire_bytes_per_step)
  # 2 bytes a value instead of 4: half, plus at most 2 bytes per segment and 4 per bucket.
  if check "$bytes" "$fp32" 'a >= 0.5 * b && a <= 0.5 * b * 1.001'; then
    pass "$wire: $bytes bytes per step on the wire, fp32 $fp32"
  else
    fail "$wire: $bytes bytes per step on the wire, not about half of fp32's $fp32"
  fi
  train=$(grep '"event":"train"' "$wire.jsonl" | head -n 1 | grep -o '"wire_bytes_per_step":[^,}]*' | cut -d: -f2)
  check "$train" "$bytes" 'a == b' || fail "$wire: the train record says $train bytes per step, the summary $bytes"
done
[ "$(field fp16.jsonl fp32_fallbacks)" = 0 ] || fail "fp16: buckets fell back to fp32 on finite gradients"

# ---- (c) refusals: exit 2 on every rank, naming the flags ----
refused() {  # refused NAME TEXT flags...
  local name=$1 text=$2
  shift 2
  run "$name" 120 2 "${short[@]}" "$@"
  if [ "$status" -eq 2 ] && has "$name" "$text"; then
    pass "$name: refused (exit 2): $text"
  else
    fail "$name: exited $status, expected 2 with '$text': $(tail -n 5 "$name.log")"
  fi
}
refused mpi "--allreduce mpi runs the library's collective" --grad-wire bf16 --allreduce mpi
refused reproducible "--reproducible sums over its own exact fixed-point ring" --grad-wire fp16 \
  --reproducible --global-batch-size 64
refused local_sgd "--strategy local-sgd has none" --grad-wire bf16 --strategy local-sgd
refused ps "--strategy ps has none" --grad-wire bf16 --strategy ps
refused cuda "the device ring moves fp32 only; --grad-wire needs --device cpu" --grad-wire fp16 \
  --device cuda
finish "--grad-wire"
