#!/usr/bin/env bash
# Data parallelism end to end, under mpirun as an operator runs it:
#  (a) N ranks x batch b train the same weights as 1 rank x batch N*b after 1 and 3 steps,
#      within derived tolerances (ring, MPI_Allreduce), and --no-overlap is bit-identical to the
#      overlapped run;
#  (b) the replica check passes, and catches a rank that drifts and ends the whole job;
#  (c) communication really hides behind backward (and does not with --no-overlap);
#  (d) 2 ranks reach the accuracy bar of the 1-rank test;
#  (e) a failure, on every rank or on one, ends the job, naming its cause.
# Usage: dp_test.sh MPIRUN MNIST_TRAIN PARAMS_COMPARE NUMPROC_FLAG [MPIRUN FLAGS...]
# (CMake passes the same mpirun flags as ringtrain_add_mpi_test: --oversubscribe, self,vader.)
set -uo pipefail
mpirun=$1 trainer=$2 compare=$3 np_flag=$4
shift 4
mpi_flags=("$@")
# The default data is Fashion-MNIST unless $RINGTRAIN_DATA or ./data/mnist says otherwise
# (trainer_run_lib.sh unsets the first).
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"

# launch NP trainer-flags...: mpirun -np NP mnist_train flags (stdin closed), under a timeout:
# a hang ends with status 124, which every caller's checks count as a failure.
launch() {
  local np=$1
  shift
  timeout -k 5 300 "$mpirun" "$np_flag" "$np" "${mpi_flags[@]}" "$trainer" "$@" </dev/null
}
# field FILE KEY: KEY's value in the summary line (the last line) of a --metrics-out file.
field() { tail -n 1 "$1" | grep -o "\"$2\":[^,}]*" | head -n 1 | cut -d: -f2- | tr -d '"'; }
# check 'awk condition' on numbers a, b, c...: exit status 0 when it holds.
check() {
  local condition=$1
  shift
  awk -v a="${1:-}" -v b="${2:-}" -v c="${3:-}" "BEGIN { exit !($condition) }"
}
seconds_since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

# ---- (a) equivalence: the distributed sampler gives N ranks x b exactly the samples of one
# rank x N*b, and averaging gradients over ranks equals the gradient of the global batch up to
# float rounding (tests/test_grad_equivalence.cpp checks that for one gradient, within a derived
# bound). Here the whole trainer is compared after 1 and 3 steps, never over long runs: once a
# ReLU input that sits within rounding of 0 comes out on the other side in one of the two runs
# (where that happens depends on the CPU's GEMM blocking), the runs separate and momentum grows
# the gap (seen here with seed 7: 2e-7 through step 41, 1e-4 at step 42, 0.1 by step 100; on an
# Intel Xeon, 3.8e-4 after 25 steps of this configuration).
# The tolerances, as max |a-b| / max |a| (params_compare), for this configuration (mlp, global
# batch 96, lr 0.05, max |p| ~0.11); the magnitudes below are properties of the data, the seed
# and the model, not of the CPU (measured here, they agree elsewhere to rounding):
#  - 1 step: p1 = p0 - lr g, so the difference is lr |g_N - g_1| plus 1 ulp of the update's
#    rounding (2^-23 = 1.2e-7 relative). Rounding in g: <= 2 gamma(K) G with K ~ 2400 (the
#    forward and backward chains of the 784-500-500-10 mlp and the batch sum), 2 gamma(K) ~ 3e-4
#    of the absolute-value gradient G, whose step lr G / max|p| is at most ~10x the step itself
#    (lr max|g| / max|p| = 3.8e-2 measured): <= 1.1e-4. A ReLU flip of one unit of one sample
#    changes that sample's contribution through the unit, at most lr max|g_s| / B in a hidden
#    layer: lr max|g_s| <= 0.013 measured at batch 1 (3 seeds) gives 1.3e-4 / 0.11 = 1.2e-3,
#    3e-3 with a 2.5x allowance. Total ~3.2e-3: the tolerance is 4e-3. Observed without a flip:
#    6.8e-8 (1 ulp of the largest weights). A sum instead of the mean (N=2) moves the weights by
#    lr max|g|, 3.8e-2, and a missing shard (batch 48 on one rank) by 2.9e-2: 7x or more above.
#  - 3 steps: momentum 0.9 carries each step's difference into the later ones, 1 + 1.9 + 2.71 =
#    5.61 times the per-step bound (the gradient's dependence on a parameter difference of this
#    size adds a few percent in 2 steps at lr 0.05): 1.8e-2, so 2e-2. Observed: 1.3e-7. A sum
#    instead of the mean gives 1.7e-1 and batch 48 instead of 96 gives 4.9e-2: 2.4x or more.
# --no-overlap against the overlapped run is bit-identical by construction (the same ranks
# reduce the same buckets in the same order; only the timing differs), over 25 steps. ----
sgd=(--seed 3 --optimizer sgd --momentum 0.9 --lr 0.05 --log-every 0 --eval-batch 2000)
run_params() {  # run_params NAME NP BATCH STEPS [flags]: trains, saves $work/NAME.bin
  local name=$1 np=$2 batch=$3 steps=$4
  shift 4
  launch "$np" "${sgd[@]}" --steps "$steps" --batch-size "$batch" --save-params "$work/$name.bin" \
    "$@" >"$work/$name.log" 2>&1 || fail "(a) $name exited non-zero: $(tail -n 20 "$work/$name.log")"
}
for steps in 1 3; do
  tolerance=4e-3
  [ "$steps" -eq 3 ] && tolerance=2e-2
  run_params "np1_$steps" 1 96 "$steps"
  run_params "np2_ring_$steps" 2 48 "$steps" --allreduce ring --overlap on
  run_params "np2_mpi_$steps" 2 48 "$steps" --allreduce mpi
  run_params "np3_ring_$steps" 3 32 "$steps" --allreduce ring
  for run in np2_ring np2_mpi np3_ring; do
    case $run in
      np2_ring) what="np=2 x 48 (ring)" ;;
      np2_mpi) what="np=2 x 48 (mpi)" ;;
      np3_ring) what="np=3 x 32 (ring)" ;;
    esac
    compare_params "(a) $steps step(s): $what vs np=1 x 96 (rel $tolerance)" \
      "$work/np1_$steps.bin" "$work/${run}_$steps.bin" --rel-tol "$tolerance"
  done
done
run_params np2_overlap 2 48 25 --allreduce ring --overlap on
run_params np2_no_overlap 2 48 25 --allreduce ring --no-overlap
compare_params "(a) 25 steps: np=2 --no-overlap vs overlapped, bit-identical" \
  "$work/np2_overlap.bin" "$work/np2_no_overlap.bin" --expect-identical

# ---- (b) replicas: identical on every rank; a rank that drifts is caught and ends the job ----
replicas=(--steps 25 --seed 3 --batch-size 32 --log-every 0 --eval-batch 2000 --check-replicas 5)
if launch 3 "${replicas[@]}" >"$work/replicas.log" 2>&1; then
  pass "(b) np=3 --check-replicas 5: replicas identical"
else
  fail "(b) np=3 --check-replicas 5 exited non-zero: $(tail -n 20 "$work/replicas.log")"
fi
start=$(date +%s.%N)
timeout -k 10 90 "$mpirun" "$np_flag" 3 "${mpi_flags[@]}" "$trainer" "${replicas[@]}" \
  --test-perturb-rank 2 </dev/null >"$work/perturbed.log" 2>&1
status=$?
took=$(seconds_since "$start")
# The error line names the drifted rank(s) ("rank(s) 2 hold parameters that differ"); the
# "[rank N]" log tags are removed first so that they cannot match.
if [ "$status" -eq 0 ]; then
  fail "(b) --test-perturb-rank 2 exited 0: the replica check missed the drift"
elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ] || check 'a >= 60' "$took"; then
  fail "(b) --test-perturb-rank 2: the job did not end within 60 s (${took} s, status $status)"
elif ! grep 'diverged' "$work/perturbed.log" | sed 's/\[rank [0-9]*\]//g' |
    grep -qE 'rank(\(s\)|s)? 2([^0-9]|$)'; then
  fail "(b) --test-perturb-rank 2: no 'diverged' line naming rank 2:" \
    "$(tail -n 20 "$work/perturbed.log")"
else
  pass "(b) --test-perturb-rank 2: exit $status after ${took} s:" \
    "$(grep -m 1 -o 'replicas diverged[^;]*' "$work/perturbed.log")"
fi

# ---- (c) overlap: with a slowed transport (--test-comm-delay-ms sleeps before each bucket's
# reduction, using no CPU) the overlapped run hides most of the communication behind backward;
# --no-overlap hides none of it. The configuration makes the sleeps dominate and backward long:
#  - 8 narrow hidden layers cut into 9 buckets (one per layer, the small first bucket holding
#    only the output layer): only the last bucket, ready when backward ends, is always
#    exposed, so the ideal efficiency is about 8/9;
#  - a large per-rank batch (2048) gives backward ~60+ ms of real work per step against only
#    0.66 M gradients (2.6 MB: the real reductions take a few ms), so the 9 x 5 ms of delays
#    fit inside backward with 1.5x+ to spare.
# (One wide bucket after a small first one, e.g. --hidden 2048,2048,2048 --fusion-threshold-mb
# 0, cannot pass: its big last bucket is always exposed, capping efficiency near 0.5.)
# Measured on the 2-core test machine: efficiency 0.63-0.92 overlapped with other work on the
# machine, 0.60-0.90 with three CPU burners beside it (larger delays with larger batches did
# no better); 0 with --no-overlap. Rank imbalance counts as exposed (rank 0 waits for a peer
# that a busy scheduler slowed), so the bar is 0.5 and the overlapped run gets a second
# attempt when the first misses it: an engine that does not overlap scores ~0 every time, so
# a retry cannot hide that.
delay_ms=5
overlap=(--hidden 256,256,256,256,256,256,256,256 --batch-size 2048 --steps 15 --seed 3
         --fusion-threshold-mb 0.2 --first-bucket-mb 0.01 --test-comm-delay-ms "$delay_ms"
         --log-every 0 --eval-batch 5000)
# overlap_run MODE ATTEMPT: runs np=2; sets $numbers and returns 0 when MODE's bar is met,
# 1 when it is missed ($why says how), 2 when the run itself failed.
overlap_run() {
  local mode=$1 attempt=$2 flags=()
  flags=(--overlap on)  # explicit: "auto" turns overlap off where ranks fill the cores
  [ "$mode" = no_overlap ] && flags=(--no-overlap)
  local metrics="$work/${mode}_$attempt.jsonl" log="$work/${mode}_$attempt.log"
  numbers="" why=""
  launch 2 "${overlap[@]}" "${flags[@]}" --metrics-out "$metrics" >"$log" 2>&1
  if [ $? -ne 0 ] || ! [ -s "$metrics" ]; then
    why="the run failed: $(tail -n 20 "$log")"
    return 2
  fi
  local buckets comm exposed efficiency
  buckets=$(field "$metrics" buckets)
  comm=$(field "$metrics" comm_ms)
  exposed=$(field "$metrics" exposed_comm_ms)
  efficiency=$(field "$metrics" overlap_efficiency)
  numbers="$buckets buckets, comm ${comm} ms, exposed ${exposed} ms per step"
  numbers+=", efficiency ${efficiency}"
  # Every bucket's delay lies inside its reduction, so comm_ms holds at least buckets x delay.
  if ! check 'a >= 4 && b >= a * c' "$buckets" "$comm" "$delay_ms"; then
    why="expected >= 4 buckets and comm_ms >= buckets x ${delay_ms} ms"
    return 1
  fi
  if [ "$mode" = overlapped ]; then
    check 'a >= 0.5 && b <= 0.5 * c' "$efficiency" "$exposed" "$comm" && return 0
    why="efficiency below 0.5 (exposed not well below comm)"
  else
    # Reduced after backward: all of it is exposed, by construction.
    check 'a <= 0.05 && a >= -0.05' "$efficiency" && return 0
    why="efficiency should be ~0 (exposed == comm)"
  fi
  return 1
}
for attempt in 1 2; do
  overlap_run overlapped "$attempt"
  result=$?
  if [ "$result" -eq 0 ]; then
    pass "(c) overlapped np=2 (attempt $attempt): $numbers"
    break
  elif [ "$result" -eq 1 ] && [ "$attempt" -eq 1 ]; then
    echo "note: (c) overlapped attempt 1 missed the bar on a busy machine ($why: $numbers);" \
      "retrying"
  else
    fail "(c) overlapped np=2 (attempt $attempt): $why${numbers:+: $numbers}"
    break
  fi
done
if overlap_run no_overlap 1; then
  pass "(c) --no-overlap np=2: $numbers"
else
  fail "(c) --no-overlap np=2: $why${numbers:+: $numbers}"
fi

# ---- (d) accuracy: 2 ranks x 32 = global batch 64 reach the bar of the 1-rank test in
# tests/test_train.cpp (400 Adam steps of 64 at lr 1e-3: >= 0.78 on Fashion-MNIST), and so
# does 1 rank x 64 here. ----
adam=(--steps 400 --optimizer adam --lr 1e-3 --seed 7 --log-every 0)
for setup in "2 32" "1 64"; do
  read -r np batch <<<"$setup"
  name="accuracy_np$np"
  if ! launch "$np" "${adam[@]}" --batch-size "$batch" --metrics-out "$work/$name.jsonl" \
    >"$work/$name.log" 2>&1; then
    fail "(d) np=$np exited non-zero: $(tail -n 20 "$work/$name.log")"
    continue
  fi
  accuracy=$(field "$work/$name.jsonl" test_accuracy)
  world=$(field "$work/$name.jsonl" world_size)
  global=$(field "$work/$name.jsonl" global_batch)
  data=$(field "$work/$name.jsonl" data_dir)
  numbers="test accuracy $accuracy, world_size $world, global_batch $global, data $data"
  if ! grep -q "fashion-mnist" <<<"$data"; then
    fail "(d) np=$np did not train on the default Fashion-MNIST (the bar is for it): $numbers"
  elif [ "$world" != "$np" ] || [ "$global" != 64 ]; then
    fail "(d) np=$np x $batch: expected world_size $np and global_batch 64: $numbers"
  elif check 'a >= 0.78' "$accuracy"; then
    pass "(d) np=$np x $batch, 400 Adam steps: $numbers"
  else
    fail "(d) np=$np x $batch, 400 Adam steps: test accuracy below 0.78: $numbers"
  fi
done

# ---- (f) large mini-batch: --lr-scaling linear ramps the rate from --lr to --lr x ranks over
# the warm-up (Goyal et al.): at 2 ranks, 0.01 -> 0.02 over 10 steps; the train lines every 5
# steps carry the rate of their last step: steps 4, 9, 14, 19 -> 0.014, 0.019, 0.02, 0.02. ----
if launch 2 --steps 20 --batch-size 32 --optimizer sgd --lr 0.01 --lr-scaling linear \
  --warmup-steps 10 --log-every 5 --metrics-out "$work/scaling.jsonl" >"$work/scaling.log" 2>&1; then
  rates=$(grep '"event":"train"' "$work/scaling.jsonl" | grep -o '"lr":[^,}]*' | cut -d: -f2 | tr '\n' ' ')
  read -r r5 r10 r15 r20 <<<"$rates"
  if check 'a > 0.0139 && a < 0.0141 && b > 0.0189 && b < 0.0191 && c > 0.0199 && c < 0.0201' \
    "$r5" "$r10" "$r20"; then
    pass "(f) --lr-scaling linear at 2 ranks: lr at steps 5, 10, 15, 20: $rates"
  else
    fail "(f) --lr-scaling linear at 2 ranks: expected 0.014 0.019 0.02 0.02, got: $rates"
  fi
else
  fail "(f) --lr-scaling linear run exited non-zero: $(tail -n 20 "$work/scaling.log")"
fi

# ---- (e) a failure ends the whole job: a data folder whose training images are truncated.
# First on every rank (all fail alike), then on rank 1 only (mpirun's "A : B" form gives rank 1
# its own flags) while rank 0 loads good data and, if it gets there first, waits for rank 1 in
# the initial broadcast: the failing rank must take the whole job down, not leave rank 0
# waiting. Either way mpirun must return, non-zero, within 60 s, and the output must name the
# file. ----
mkdir -p "$work/bad"
for f in train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  cp /usr/share/datasets/fashion-mnist/$f.gz "$work/bad/"
done
gzip -dc /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz | head -c 100000 \
  >"$work/bad/train-images-idx3-ubyte"
short=(--steps 5 --batch-size 32 --log-every 0)
for where in "every rank" "rank 1 only"; do
  if [ "$where" = "every rank" ]; then
    app=("$np_flag" 2 "$trainer" --data-dir "$work/bad" "${short[@]}")
  else
    app=("$np_flag" 1 "$trainer" "${short[@]}"
         : "$np_flag" 1 "$trainer" --data-dir "$work/bad" "${short[@]}")
  fi
  start=$(date +%s.%N)
  timeout -k 10 90 "$mpirun" "${mpi_flags[@]}" "${app[@]}" </dev/null >"$work/bad.log" 2>&1
  status=$?
  took=$(seconds_since "$start")
  what="(e) truncated training images on $where, np=2"
  if [ "$status" -eq 0 ]; then
    fail "$what: exited 0"
  elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ] || check 'a >= 60' "$took"; then
    fail "$what: the job did not end within 60 s (${took} s, status $status)"
  elif ! grep -q "train-images-idx3-ubyte" "$work/bad.log"; then
    fail "$what: the output does not name train-images-idx3-ubyte: $(tail -n 20 "$work/bad.log")"
  else
    pass "$what: exit $status after ${took} s, the error names train-images-idx3-ubyte"
  fi
done

finish data-parallel
