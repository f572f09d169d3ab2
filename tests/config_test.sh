#!/usr/bin/env bash
# mnist_train --config FILE and --print-config as an operator meets them (docs/usage.md,
# "Configuration files"): a file sets flags and the command line overrides it; --print-config
# round-trips (print, run with it, the same print); an unknown key or a bad value in the file
# (even one the command line overrides) exits 2 naming the file and the key; the flag rules
# (flag_rules.cpp) judge values from the file as they judge the command line's; and a 2-rank run
# repeated from its metrics file alone (scripts/metrics_config) writes the same --save-params
# bytes. Every launch runs under `timeout`. Skips (77) without python3 (metrics_config).
# Usage: config_test.sh MPIRUN MNIST_TRAIN NUMPROC_FLAG [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 trainer=$2 np_flag=$3
shift 3
mpi_flags=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
metrics_config=$here/../scripts/metrics_config
command -v python3 >/dev/null || { echo "skipped: no python3 for scripts/metrics_config"; exit 77; }
# shellcheck source=tests/support/trainer_run_lib.sh
source "$here/support/trainer_run_lib.sh"

# The trainer alone (no mpirun): --print-config and the refusals exit before MPI starts.
alone() {  # alone NAME flags...: output in NAME.out (and $out), exit status in $status
  local name=$1
  shift
  out=$name.out
  timeout -k 5 60 "$trainer" "$@" </dev/null >"$out" 2>&1
  status=$?
}
expect_refusal() {  # expect_refusal WHAT TEXT...: exit 2 and $out holds every TEXT
  local what=$1 text
  shift
  if [ "$status" -ne 2 ]; then
    fail "$what: exit $status, expected 2: $(head -n 5 "$out")"
    return
  fi
  for text in "$@"; do
    grep -qF -- "$text" "$out" || { fail "$what: no '$text' in: $(head -n 5 "$out")"; return; }
  done
  pass "$what: $(grep -F -- "$1" "$out" | head -n 1)"
}

cat >base.toml <<'TOML'
# A small MLP, trained briefly.
model = "mlp"
hidden = [64, 32]
steps = 20
batch-size = 16
lr = 0.05
momentum = 0.9
log-every = 0
eval-batch = 5000
device = "cpu"
TOML

# ---- the file sets flags; the command line overrides them ----
alone from_file --config base.toml --print-config
if [ "$status" -eq 0 ] && grep -qx 'hidden = \[64, 32\]' from_file.out && grep -qx 'lr = 0.05' from_file.out &&
  grep -qx 'steps = 20' from_file.out && grep -qx '# epochs = 1' from_file.out; then
  pass "--print-config shows the file's flags set and the others as defaults"
else
  fail "--print-config with base.toml (exit $status): $(cat from_file.out)"
fi
alone overridden --config base.toml --lr 0.2 --steps 7 --print-config
if [ "$status" -eq 0 ] && grep -qx 'lr = 0.2' overridden.out && grep -qx 'steps = 7' overridden.out &&
  grep -qx 'momentum = 0.9' overridden.out; then
  pass "command-line flags override the file"
else
  fail "--lr 0.2 --steps 7 over base.toml (exit $status): $(cat overridden.out)"
fi
# And the run itself trains what the two together say: 7 steps of the file's model.
run overridden_run 120 1 --config base.toml --steps 7
if [ "$status" -eq 0 ] && grep -q '"event":"summary".*"steps":7,' overridden_run.jsonl &&
  grep -q '"params":52650,' overridden_run.jsonl; then
  pass "a run with --config base.toml --steps 7 trains 7 steps of the 784-64-32-10 MLP"
else
  fail "--config base.toml --steps 7 (exit $status): $(tail -n 5 overridden_run.log) $(grep summary overridden_run.jsonl)"
fi

# ---- --print-config round-trips ----
alone first_print --config base.toml --nesterov --seed 11 --print-config
cp first_print.out printed.toml
alone second_print --config printed.toml --print-config
if [ "$status" -eq 0 ] && cmp -s first_print.out second_print.out; then
  pass "--print-config round-trips ($(grep -vc '^#' printed.toml) flags set)"
else
  fail "--print-config of its own output differs (exit $status): $(diff first_print.out second_print.out | head)"
fi

# ---- bad files ----
printf 'steps = 20\nlearning-rate = 0.1\n' >unknown.toml
alone unknown --config unknown.toml --print-config
expect_refusal "an unknown key" "--config unknown.toml" "unknown key 'learning-rate'"
printf 'steps = 20\n[optimizer]\nlr = 0.1\n' >section.toml
alone section --config section.toml
expect_refusal "a key in a section" "--config section.toml" "unknown key 'optimizer.lr'"
printf 'steps = 20\nlr = -1\n' >bad_value.toml
alone bad_value --config bad_value.toml
expect_refusal "a value out of range" "--config bad_value.toml" "key 'lr'" "must be in (0,"
alone bad_value_overridden --config bad_value.toml --lr 0.1 --print-config
expect_refusal "a bad value the command line overrides" "--config bad_value.toml" "key 'lr'"
printf 'steps = "twenty"\n' >not_number.toml
alone not_number --config not_number.toml
expect_refusal "a value that is no number" "--config not_number.toml" "key 'steps'" "twenty"
printf 'model = "resnet"\n' >bad_choice.toml
alone bad_choice --config bad_choice.toml
expect_refusal "a choice that is none of the flag's" "--config bad_choice.toml" "key 'model'" "resnet"
alone missing --config does-not-exist.toml
expect_refusal "a file that is not there" "does-not-exist.toml"
printf 'steps = 5\nepochs = 2\n' >exclusive.toml
alone exclusive --config exclusive.toml
expect_refusal "two flags that exclude each other" "excludes" \
  "the flags in --config exclusive.toml count as given"
# The rules that combine flags judge the file's values too.
printf 'steps = 5\nnum-ps = 2\n' >rule.toml
run rule 60 1 --config rule.toml --device cpu
out=rule.log
expect_refusal "a flag rule on a value from the file" "--num-ps is a flag of --strategy ps"

# ---- a run repeated from its metrics file alone ----
run original 180 2 --config base.toml --seed 5 --save-params "$work/original.params"
if [ "$status" -ne 0 ] || [ ! -s original.params ]; then
  fail "the original 2-rank run (exit $status): $(tail -n 5 original.log)"
elif ! python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); sys.exit(r["event"]!="config")' original.jsonl; then
  fail "the metrics file's first line is not the config record: $(head -c 200 original.jsonl)"
elif ! "$metrics_config" original.jsonl >repeat.toml 2>metrics_config.err; then
  fail "scripts/metrics_config original.jsonl: $(cat metrics_config.err)"
elif grep -q '^save-params\|^metrics-out' repeat.toml; then
  fail "metrics_config left the original's outputs set: $(grep 'save-params\|metrics-out' repeat.toml)"
else
  run repeat 180 2 --config "$work/repeat.toml" --save-params "$work/repeat.params"
  if [ "$status" -ne 0 ]; then
    fail "the repeated run (exit $status): $(tail -n 5 repeat.log)"
  elif cmp -s original.params repeat.params; then
    pass "the run repeated from its metrics file wrote the same --save-params bytes ($(stat -c %s repeat.params) bytes)"
  else
    fail "the repeated run's parameters differ from the original's"
  fi
  # A repeat without the file's settings would differ: the check above can fail.
  run defaults 180 2 --steps 20 --log-every 0 --eval-batch 5000 --device cpu --seed 5 \
    --save-params "$work/defaults.params"
  if [ "$status" -eq 0 ] && ! cmp -s original.params defaults.params; then
    pass "a run without the configuration's flags writes other parameters"
  else
    fail "a run without base.toml's flags (exit $status) wrote the same parameters"
  fi
fi

finish "--config"
