#!/bin/bash
# Fixed-seed runs whose --save-params outputs two builds must write byte for byte alike: run it
# with the build before a change and the one after, then compare the two OUT directories
# (for f in A/*.bin; do cmp "$f" "B/${f##*/}"; done). Covers the ring, MPI_Allreduce, no
# overlap, 3 ranks with Adam, the cnn, local SGD, parameter servers, the NaN guard, the EMA,
# linear LR scaling, a preempted run and its resumes. Fashion-MNIST (the default data).
# Usage: scripts/params_snapshot.sh MNIST_TRAIN OUT
set -u
bin=$1 out=$2
[ -e "$out" ] && { echo "params_snapshot: $out exists: name a new directory" >&2; exit 2; }
mkdir -p "$out"
root_flag=(); [ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)
mp() { local np=$1; shift; timeout 600 mpirun "${root_flag[@]}" --oversubscribe -np "$np" --mca btl self,vader "$bin" "$@"; }
common=(--log-every 0 --eval-batch 2000 --seed 11)
run() { local name=$1 np=$2; shift 2; mp "$np" "${common[@]}" --save-params "$out/$name.bin" --metrics-out "$out/$name.jsonl" "$@" >"$out/$name.log" 2>&1; echo "$name rc=$?" >>"$out/rc.txt"; }
run mlp1 1 --steps 30 --batch-size 64 --optimizer sgd --momentum 0.9 --lr 0.05
run mlp2ring 2 --steps 30 --batch-size 32 --allreduce ring --overlap on
run mlp2mpi 2 --steps 30 --batch-size 32 --allreduce mpi
run mlp2noov 2 --steps 30 --batch-size 32 --no-overlap
run mlp3 3 --steps 20 --batch-size 16 --optimizer adam --lr 0.001 --lr-schedule exponential --lr-decay-steps 5
run cnn1 1 --model cnn --steps 8 --batch-size 32
run cnn2 2 --model cnn --steps 8 --batch-size 16
run lsgd2 2 --strategy local-sgd --average-every 4 --steps 22 --batch-size 32
run ps3 3 --strategy ps --num-ps 1 --steps 20 --batch-size 32
run finite2 2 --check-finite --test-nan-rank 1 --test-nan-steps 3 --steps 20 --batch-size 32
run ema1 1 --ema-decay 0.9 --steps 20 --batch-size 32 --warmup-epochs 0.01
run hidden1 1 --hidden 64,32 --steps 20 --batch-size 50 --lr-scaling linear
rm -rf "$out/ck"; run ckA 2 --steps 12 --batch-size 32 --checkpoint-dir "$out/ck" --checkpoint-every 5 --test-preempt-rank 1 --test-preempt-at-step 7
run ckB 2 --steps 12 --batch-size 32 --checkpoint-dir "$out/ck" --checkpoint-every 5
run ckC 1 --steps 16 --checkpoint-dir "$out/ck"
