#!/usr/bin/env bash
# The lost-scaling account end to end (docs/overlap.md, "Lost scaling"), every launch under
# `timeout`. Each injected cost is a sleep, so each expectation is a lower bound that holds on
# any machine, however loaded (a sleep never ends early), plus a comparison between the account's
# figures, never a timing of the machine itself:
#  (a) rank 2 of 3 sleeps 40 ms before each step: the account names rank 2 the last in most
#      steps (at least half: 3 ranks share 2 cores, so another rank may be descheduled longer) and books at least half the sleep as waiting for the slowest rank, more than
#      it books as exposed communication;
#  (b) a slowed transport (every bucket's allreduce sleeps 15 ms, on every rank; overlap off, so
#      that it is all exposed): at least 80% of buckets x 15 ms is exposed communication, and less
#      than half that is waiting for a slowest rank.
# Usage: lost_scaling_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"
field() { python3 "$(dirname "${BASH_SOURCE[0]}")/../scripts/summary_field.py" "$1.jsonl" "$2"; }
holds() {  # holds WHAT PYTHON-EXPRESSION
  if python3 -c "import sys; sys.exit(0 if ($2) else 1)"; then pass "$1"; else fail "$1 ($2)"; fi
}
common=(--steps 20 --batch-size 16 --log-every 10 --eval-batch 5000 --device cpu)

# ---- (a) one rank late ----
run delayed 180 3 "${common[@]}" --test-slow-rank 2 --test-slow-ms 40
if [ "$status" -ne 0 ]; then
  fail "(a) the delayed run exited $status: $(tail -n 5 delayed.log)"
else
  wait_ms=$(field delayed slowest_wait_ms) wire_ms=$(field delayed exposed_wire_ms)
  holds "(a) the late rank is named: rank $(field delayed slowest_rank)" \
    "$(field delayed slowest_rank) == 2 and $(field delayed slowest_share) >= 0.5"
  holds "(a) waiting for the slowest rank: $wait_ms ms per step (rank 2 sleeps 40)" \
    "$wait_ms >= 20"
  holds "(a) the wait, not the wire: $wait_ms ms waiting, $wire_ms ms exposed communication" \
    "$wait_ms > $wire_ms"
  has delayed "rank 2 was the last to hand in its gradients in" ||
    fail "(a) the summary does not name the late rank: $(grep 'lost scaling' delayed.log)"
  grep -q '"event":"scaling".*"slowest_rank":2' delayed.jsonl ||
    fail "(a) no periodic scaling record names rank 2: $(grep scaling delayed.jsonl)"
fi

# ---- (b) a slowed link ----
run throttled 180 2 "${common[@]}" --test-comm-delay-ms 15 --overlap off
if [ "$status" -ne 0 ]; then
  fail "(b) the throttled run exited $status: $(tail -n 5 throttled.log)"
else
  buckets=$(field throttled buckets)
  wait_ms=$(field throttled slowest_wait_ms) wire_ms=$(field throttled exposed_wire_ms)
  holds "(b) exposed communication: $wire_ms ms per step ($buckets buckets x 15 ms of sleep)" \
    "$wire_ms >= 0.8 * $buckets * 15"
  holds "(b) the wire, not a slow rank: $wait_ms ms waiting" "$wait_ms < 0.5 * $wire_ms"
  holds "(b) an achieved and a reference bandwidth are reported" \
    "$(field throttled comm_busbw_gbps) > 0 and $(field throttled reference_busbw_gbps) > 0"
fi

finish "lost scaling"
