#!/usr/bin/env bash
# Nothing already saved is lost or poisoned (docs/failures.md, "What is never lost"), as an
# operator who makes every mistake once, or a hostile user of a shared file system, meets it:
#  (a) a stray or damaged file with a higher step number survives neither as a checkpoint nor as
#      a reason to delete valid ones: with --keep-checkpoints 1 the run resumed from step 10
#      still leaves a valid checkpoint, and the stray file's bytes are kept under a name that
#      claims no step;
#  (b) a damaged checkpoint at a step a resumed run writes again is set aside, not overwritten:
#      the name then holds the new run's state of that step, the old bytes are kept;
#  (c) a NaN on a rank other than the chief never reaches a checkpoint: the job ends (exit 5)
#      and the directory resumes;
#  (d) symbolic links planted in the checkpoint directory (the write probe's and a temporary's
#      names) and at --save-params are never written through;
#  (e) --resume FILE into a directory holding a later checkpoint of another run is refused (the
#      names would carry two states), and nothing there changes.
# Usage: saved_work_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
# shellcheck source=tests/support/trainer_run_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/trainer_run_lib.sh"
common=(--log-every 10 --eval-batch 5000 --momentum 0.9 --seed 11 --batch-size 32)
ckpt() { printf '%s/ckpt-%010d.rtckpt' "$1" "$2"; }

# ---- (a) a stray file with a higher number and --keep-checkpoints 1 ----
run stray_first 120 2 "${common[@]}" --steps 10 --checkpoint-dir "$work/ck-a" --checkpoint-every 10 \
  --keep-checkpoints 1
head -c 4096 /dev/urandom >"$(ckpt ck-a 999)"
cp "$(ckpt ck-a 999)" stray.bytes
run stray 120 2 "${common[@]}" --steps 30 --checkpoint-dir "$work/ck-a" --checkpoint-every 10 \
  --keep-checkpoints 1
if [ "$status" -eq 0 ] && [ -f "$(ckpt ck-a 30)" ] && [ ! -e "$(ckpt ck-a 999)" ] &&
   cmp -s stray.bytes "$(ckpt ck-a 999).damaged"; then
  pass "(a) the stray ckpt-999 was set aside (bytes kept as .damaged); the valid step-30 checkpoint is kept"
else
  fail "(a) stray file: exit $status; directory: $(ls ck-a | tr '\n' ' '): $(tail -n 5 stray.log)"
fi
run stray_resume 120 2 "${common[@]}" --steps 40 --checkpoint-dir "$work/ck-a" --checkpoint-every 10 \
  --keep-checkpoints 1
if [ "$status" -eq 0 ] && has stray_resume "resuming from $(ckpt "$work/ck-a" 30)"; then
  pass "(a) the next run resumed from step 30"
else
  fail "(a) resume after the stray file: exit $status: $(tail -n 5 stray_resume.log)"
fi

# ---- (b) a damaged checkpoint at a step the resumed run writes again ----
run first 120 2 "${common[@]}" --steps 30 --checkpoint-dir "$work/ck-b" --checkpoint-every 10
printf '\xff\xff\xff\xff' | dd of="$(ckpt ck-b 30)" bs=1 seek=5000 conv=notrunc 2>/dev/null
cp "$(ckpt ck-b 30)" damaged.bytes
run rewrite 120 2 "${common[@]}" --steps 30 --checkpoint-dir "$work/ck-b" --checkpoint-every 10 \
  --lr 0.02
if [ "$status" -eq 0 ] && has rewrite "resuming from $(ckpt "$work/ck-b" 20)" &&
   has rewrite "set aside as" && cmp -s damaged.bytes "$(ckpt ck-b 30).damaged" &&
   [ -f "$(ckpt ck-b 30)" ] && ! cmp -s damaged.bytes "$(ckpt ck-b 30)"; then
  pass "(b) the damaged step-30 checkpoint was set aside (bytes kept); step 30 was written afresh"
else
  fail "(b) damaged checkpoint: exit $status; directory: $(ls ck-b | tr '\n' ' '): $(tail -n 5 rewrite.log)"
fi

# ---- (c) a NaN on rank 1 never reaches a checkpoint ----
run nan 120 2 "${common[@]}" --steps 30 --checkpoint-dir "$work/ck-c" --checkpoint-every 1 \
  --test-nan-rank 1 --test-nan-steps 15
# Rank 1's own check, or the chief's refusal to checkpoint the poisoned state: whichever aborts
# the job first.
if [ "$status" -eq 5 ] && { has nan "the loss became nan at step 15" || has nan "was not written"; }; then
  pass "(c) a NaN on rank 1 at step 15 ended the job with exit 5"
else
  fail "(c) NaN on rank 1: exit $status (expected 5): $(tail -n 5 nan.log)"
fi
run nan_resume 120 2 "${common[@]}" --steps 30 --checkpoint-dir "$work/ck-c" --checkpoint-every 1
from=$(grep -o 'resuming from [^ ]*: step [0-9]*' nan_resume.log | grep -o '[0-9]*$')
if [ "$status" -eq 0 ] && [ -n "$from" ] && [ "$from" -le 15 ] && ! has nan_resume "skipping"; then
  pass "(c) the directory resumed from step $from (no checkpoint after the NaN, none skipped)"
else
  fail "(c) resume after the NaN: exit $status, from '$from': $(tail -n 5 nan_resume.log)"
fi

# ---- (d) planted symbolic links are never written through ----
mkdir -p ck-d out
printf 'precious\n' >victim
ln -s "$work/victim" ck-d/.ringtrain-write-probe
ln -s "$work/victim" "$(ckpt ck-d 10).tmp"
ln -s "$work/victim" out/params.bin
ln -s "$work/victim" out/params.bin.tmp
run links 120 2 "${common[@]}" --steps 20 --checkpoint-dir "$work/ck-d" --checkpoint-every 10 \
  --save-params "$work/out/params.bin"
if [ "$status" -eq 0 ] && [ "$(cat victim)" = precious ] && [ -f "$(ckpt ck-d 20)" ] &&
   [ ! -L out/params.bin ] && [ -s out/params.bin ]; then
  pass "(d) links at the probe's, a temporary's and --save-params' (and its temporary's) names: the target is unchanged"
else
  fail "(d) symlinks: exit $status, victim now '$(head -c 40 victim | tr -d '\0')': $(tail -n 5 links.log)"
fi
ln -s "$work/victim" metrics-link.jsonl
timeout -k 5 60 "$trainer" "${common[@]}" --steps 2 --metrics-out "$work/metrics-link.jsonl" \
  </dev/null >metrics_link.log 2>&1
code=$?
if [ "$code" -ne 0 ] && [ "$(cat victim)" = precious ] && has metrics_link "--metrics-out"; then
  pass "(d) a symbolic link at --metrics-out is refused (exit $code), naming the flag"
else
  fail "(d) --metrics-out link: exit $code: $(tail -n 3 metrics_link.log)"
fi

# ---- (e) --resume FILE into a directory with a later checkpoint of another run ----
cp "$(ckpt ck-b 10)" other-run-10.rtckpt
before=$(ls -l ck-b | md5sum)
run resume_file 120 2 "${common[@]}" --steps 40 --checkpoint-dir "$work/ck-b" \
  --resume "$work/other-run-10.rtckpt"
if [ "$status" -eq 3 ] && has resume_file "already holds a later checkpoint" &&
   [ "$(ls -l ck-b | md5sum)" = "$before" ]; then
  pass "(e) --resume FILE (step 10) into a directory holding step 30: refused, exit 3, nothing changed"
else
  fail "(e) --resume FILE: exit $status: $(tail -n 5 resume_file.log)"
fi

finish "saved-work"
