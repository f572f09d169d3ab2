#!/usr/bin/env bash
# scripts/ringrun's argument handling, without SSH and without root: the mpirun command that
# --dry-run prints for -H and for hostfiles in both forms (mpirun's 'host slots=N' and
# horovodrun's 'host:N', with comments and blank lines), -x forwarding, the interface and SSH
# flags; the refusals (exit 2, naming the flag and what to do) of unsafe host names, bad ports,
# variables, ssh options and interfaces, slot totals below -np, duplicate hosts, broken
# hostfiles; then a few real localhost runs under mpirun: no ssh is touched, a -x value with
# shell characters arrives unchanged, the exit status passes through, and ringrun becomes
# mpirun (exec: same PID), so a TERM ends the job.
# Without python3 it prints "SKIPPED: why" and exits 77.
# Usage: ringrun_cli_test.sh
# shellcheck disable=SC2016  # single-quoted $... are meant literally: must reach ranks unexpanded
set -uo pipefail
command -v python3 >/dev/null || { echo "SKIPPED: python3 is missing (ringrun is a python3 script)"; exit 77; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ringrun=$repo/scripts/ringrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "PASS: $*"; }

# rr ARGS...: runs ringrun (stdin closed); sets $out (stdout+stderr) and $status.
rr() {
  out=$(timeout -k 5 60 python3 "$ringrun" "$@" </dev/null 2>&1)
  status=$?
}
# expect_ok WHAT ARGS...: exit 0.
expect_ok() {
  local what=$1
  shift
  rr "$@"
  if [ "$status" -ne 0 ]; then
    fail "$what: exit $status: $out"
    return 1
  fi
  return 0
}
# has WHAT FRAGMENT...: every fragment occurs in $out.
has() {
  local what=$1 fragment ok=1
  shift
  for fragment in "$@"; do
    grep -qF -- "$fragment" <<<"$out" || { ok=""; fail "$what: '$fragment' not in: $out"; }
  done
  [ -n "$ok" ] && pass "$what"
}
# refused WHAT 'message regex' ARGS...: exit 2 with a ringrun message matching the regex.
refused() {
  local what=$1 pattern=$2
  shift 2
  rr "$@"
  if [ "$status" -ne 2 ]; then
    fail "$what: exit $status, expected 2: $out"
  elif ! grep -qE -- "$pattern" <<<"$out"; then
    fail "$what: message does not match '$pattern': $out"
  else
    pass "$what: $(grep -m 1 -E -- "$pattern" <<<"$out")"
  fi
}

mpirun_path=$(command -v mpirun || echo mpirun)
root_flag=""
[ "$(id -u)" -ne 0 ] || root_flag=" --allow-run-as-root"

# ---- --help ----
rr --help
if [ "$status" -eq 0 ] && grep -q -- '-np N' <<<"$out" && grep -q -- '--hostfile' <<<"$out"; then
  pass "--help"
else
  fail "--help: exit $status: $out"
fi

# ---- dry runs: the exact mpirun command ----
if expect_ok "dry run, localhost" -np 3 --dry-run -- /bin/true; then
  expected="$mpirun_path -np 3 --host localhost:3$root_flag --bind-to none --map-by slot /bin/true"
  if [ "$out" = "$expected" ]; then
    pass "no -H: all ranks on localhost:3, no ssh flags: $out"
  else
    fail "no -H: expected '$expected', got '$out'"
  fi
fi

key=$work/id_test
: >"$key"
export RR_FORWARDED=from-here
if expect_ok "dry run, -H" -np 4 -H node1:2,node2:2 -p 2222 -i "$key" \
    --ssh-option UserKnownHostsFile=/etc/ssh/known_rr --network-interface eth0 \
    --network-interface 10.0.0.0/24 -x RR_FORWARDED -x 'RR_SET=a b' --dry-run -- \
    /bin/echo 'arg with space' '$HOME'; then
  expected="$mpirun_path -np 4 --host node1:2,node2:2$root_flag --bind-to none --map-by slot"
  expected+=" --mca plm_rsh_agent $(command -v ssh || echo ssh) --mca plm_rsh_args"
  expected+=" '-o BatchMode=yes -p 2222 -i $key -o UserKnownHostsFile=/etc/ssh/known_rr'"
  expected+=" --mca btl_tcp_if_include eth0,10.0.0.0/24 --mca oob_tcp_if_include eth0,10.0.0.0/24"
  expected+=" -x RR_FORWARDED -x 'RR_SET=a b' /bin/echo 'arg with space' '\$HOME'"
  if [ "$out" = "$expected" ]; then
    pass "-H with port, identity, ssh option, interfaces, -x: $out"
  else
    fail "-H: expected '$expected', got '$out'"
  fi
fi

cat >"$work/hostfile" <<'EOF'
# the cluster: both line forms, comments and blank lines

nodeA slots=2      # mpirun's form
nodeB:3            # horovodrun's form
   nodeC           # one slot
EOF
expect_ok "hostfile" -np 6 --hostfile "$work/hostfile" --dry-run -- /bin/true &&
  has "hostfile in both forms -> --host nodeA:2,nodeB:3,nodeC:1" "-np 6 --host nodeA:2,nodeB:3,nodeC:1 "
expect_ok "-H without slots" -np 2 -H nodeA,nodeB --dry-run -- /bin/true &&
  has "-H without :N gives 1 slot per host" "--host nodeA:1,nodeB:1 "
expect_ok "program without '--'" -np 2 -H nodeA:2 --dry-run true --flag &&
  has "PROGRAM without '--' (horovodrun style) is resolved on PATH" "$(command -v true) --flag"
expect_ok "--oversubscribe" -np 5 -H nodeA:2,nodeB:2 --oversubscribe --dry-run -- /bin/true &&
  has "--oversubscribe lets -np 5 run on 4 slots" "-np 5 --host nodeA:2,nodeB:2" "--oversubscribe"
expect_ok "--mpi-args" -np 2 --mpi-args '--bind-to core --tag-output' --dry-run -- /bin/true &&
  has "--mpi-args are passed on, and --bind-to there replaces the default" \
    "--map-by slot --bind-to core --tag-output /bin/true"
if grep -q -- '--bind-to none' <<<"$out"; then fail "--mpi-args --bind-to: default --bind-to none still given"; fi

# ---- refusals: exit 2 before anything runs, naming the problem ----
marker=$work/should-not-exist
refused "shell characters in a host name" "'a;rm -rf /' is not a valid host name" \
  -np 2 -H 'a;rm -rf /:2' --dry-run -- /bin/true
refused "command substitution in a host name" "is not a valid host name" \
  -np 2 -H "\$(touch $marker):2" -- /bin/true
if [ -e "$marker" ]; then fail "a shell ran the host name"; else pass "nothing ran for the unsafe host name"; fi
refused "a space in a host name" "is not a valid host name" -np 2 -H 'a b:2' --dry-run -- /bin/true
refused "user@host" "user names are not accepted.*--ssh-option User=NAME" \
  -np 2 -H alice@node1:2 --dry-run -- /bin/true
refused "an IPv6 literal" "looks like an IPv6 address" -np 2 -H fe80::1:2 --dry-run -- /bin/true
refused "0 slots" "slots must be a whole number of at least 1, got '0'" \
  -np 2 -H node1:0 --dry-run -- /bin/true
refused "port 0" "-p/--ssh-port must be a port number from 1 to 65535, got '0'" \
  -np 2 -H node1:2 -p 0 --dry-run -- /bin/true
refused "port 65536" "port number from 1 to 65535, got '65536'" \
  -np 2 -H node1:2 -p 65536 --dry-run -- /bin/true
refused "port with shell characters" "port number from 1 to 65535, got '22;id'" \
  -np 2 -H node1:2 -p '22;id' --dry-run -- /bin/true
refused "slot total below -np" "-np 5 is more than the 4 slot\(s\) of -H node1:2,node2:2.*--oversubscribe" \
  -np 5 -H node1:2,node2:2 --dry-run -- /bin/true
refused "slot total below -np (hostfile)" "-np 7 is more than the 6 slot\(s\) of --hostfile" \
  -np 7 --hostfile "$work/hostfile" --dry-run -- /bin/true
refused "a host listed twice" "host 'NODE1' is listed twice; list each host once with all its slots" \
  -np 2 -H node1:1,NODE1:1 --dry-run -- /bin/true
refused "-np 0" "-np must be a whole number of at least 1, got '0'" -np 0 --dry-run -- /bin/true
refused "no program" "no program given" -np 2 --dry-run --
refused "-H and --hostfile together" "not allowed with argument" \
  -np 2 -H node1:2 --hostfile "$work/hostfile" --dry-run -- /bin/true
refused "a bad variable name" "'BAD-NAME' is not a valid variable name" \
  -np 2 -x BAD-NAME=1 --dry-run -- /bin/true
refused "-x of an unset variable" "RR_SURELY_UNSET is not set here.*-x RR_SURELY_UNSET=VALUE" \
  -np 2 -x RR_SURELY_UNSET --dry-run -- /bin/true
refused "an ssh option that runs commands" "options that run commands are not accepted" \
  -np 2 -H node1:2 --ssh-option 'ProxyCommand=nc' --dry-run -- /bin/true
refused "an ssh option with a space" "expected KEY=VALUE as for ssh -o" \
  -np 2 -H node1:2 --ssh-option 'User=a b' --dry-run -- /bin/true
refused "an interface with shell characters" "'eth0;id' is not an interface name" \
  -np 2 --network-interface 'eth0;id' --dry-run -- /bin/true
refused "a bad subnet" "'10.0.0.0/33' is not a valid subnet" \
  -np 2 --network-interface 10.0.0.0/33 --dry-run -- /bin/true
refused "a missing identity file" "-i /nonexistent/key: no readable file" \
  -np 2 -H node1:2 -i /nonexistent/key --dry-run -- /bin/true
cp "$key" "$work/key with space"
refused "an identity path with a space" "the path may only hold" \
  -np 2 -H node1:2 -i "$work/key with space" --dry-run -- /bin/true
refused "--start-timeout 0" "--start-timeout must be a number of seconds in \(0, 3600\], got '0'" \
  -np 2 --start-timeout 0 --dry-run -- /bin/true

printf 'nodeA slots=2 max_slots=4\n' >"$work/hf_maxslots"
refused "hostfile: max_slots" "hf_maxslots:1: 'max_slots=4' is not understood" \
  -np 2 --hostfile "$work/hf_maxslots" --dry-run -- /bin/true
printf '# only a comment\n\nnodeA:2 slots=3\n' >"$work/hf_both"
refused "hostfile: both forms on one line" "hf_both:3: 'nodeA:2 slots=3': use either" \
  -np 2 --hostfile "$work/hf_both" --dry-run -- /bin/true
printf 'node;id slots=2\n' >"$work/hf_unsafe"
refused "hostfile: unsafe host name" "hf_unsafe:1: 'node;id' is not a valid host name" \
  -np 2 --hostfile "$work/hf_unsafe" --dry-run -- /bin/true
printf '# nothing\n' >"$work/hf_empty"
refused "hostfile: no hosts" "no hosts in it" -np 2 --hostfile "$work/hf_empty" --dry-run -- /bin/true
refused "hostfile: missing" "--hostfile $work/nope: cannot read it" \
  -np 2 --hostfile "$work/nope" --dry-run -- /bin/true

# Not argument errors but preflight ones (exit 1, nothing started): a program that is not here,
# and one machine under two names (both local).
rr -np 2 -- ringrun-no-such-program
if [ "$status" -eq 1 ] && grep -q "'ringrun-no-such-program' is not on PATH here" <<<"$out"; then
  pass "a program that is not here: $(head -n 1 <<<"$out")"
else
  fail "missing program: exit $status: $out"
fi
rr -np 2 -H localhost:1,127.0.0.1:1 -- /bin/true
if [ "$status" -eq 1 ] && grep -q "localhost and 127.0.0.1 are the same machine" <<<"$out"; then
  pass "localhost and 127.0.0.1: one machine under two names"
else
  fail "localhost twice: exit $status: $out"
fi

# No ssh here at all, and a remote host: the preflight says so (exit 1), it does not crash.
mkdir -p "$work/no-ssh-path"
python_binary=$(python3 -c 'import sys; print(sys.executable)')  # not a shim that needs PATH
out=$(timeout -k 5 60 env PATH="$work/no-ssh-path" "$python_binary" "$ringrun" -np 2 \
        -H node1:2 --mpirun "$mpirun_path" -- /bin/true </dev/null 2>&1)
status=$?
if [ "$status" -eq 1 ] && grep -q "ssh is not installed here (install openssh-client): needed to reach node1" <<<"$out"; then
  pass "no ssh installed: exit 1, 'ssh is not installed here'"
else
  fail "no ssh installed: exit $status: $out"
fi

# ---- real localhost runs (mpirun, no ssh) ----
# A fake ssh first on PATH records any call: a localhost-only run must not make one.
mkdir -p "$work/fakebin"
printf '#!/bin/sh\ntouch "%s"\nexit 255\n' "$work/ssh-was-called" >"$work/fakebin/ssh"
chmod 755 "$work/fakebin/ssh"
value='a b;$(echo INJECTED)`id`|&"'\''\*'
out=$(PATH="$work/fakebin:$PATH" timeout -k 5 60 python3 "$ringrun" -np 2 --verbose \
        -x "RR_PROBE=$value" -- /bin/sh -c 'echo "rank=$OMPI_COMM_WORLD_RANK value=[$RR_PROBE]"' \
        </dev/null 2>&1)
status=$?
if [ "$status" -ne 0 ]; then
  fail "localhost run: exit $status: $out"
elif ! grep -qxF "rank=0 value=[$value]" <<<"$out" || ! grep -qxF "rank=1 value=[$value]" <<<"$out"; then
  fail "localhost run: -x value did not arrive unchanged on both ranks: $out"
elif [ -e "$work/ssh-was-called" ]; then
  fail "localhost run: ssh was called"
elif ! grep -q 'preflight ok.*localhost (local' <<<"$out"; then
  fail "localhost run: no 'preflight ok ... localhost (local' line: $out"
else
  pass "localhost run: 2 ranks, no ssh, -x value with shell characters unchanged"
fi

rr -np 2 -- /bin/sh -c 'exit 7'
if [ "$status" -eq 7 ]; then pass "exit status passes through (7)"; else fail "exit status: $status, expected 7: $out"; fi

cores=$(nproc)
rr -np $((cores + 2)) -- /bin/true
if [ "$status" -eq 0 ]; then
  pass "-np $((cores + 2)) on $cores cores without -H needs no --oversubscribe"
else
  fail "-np $((cores + 2)) on localhost: exit $status: $out"
fi

# exec: ringrun's PID becomes mpirun's, so a TERM to it reaches mpirun, which ends the ranks.
python3 "$ringrun" -np 1 -- /bin/sleep 41.5 </dev/null >"$work/term.log" 2>&1 &
pid=$!
for ((tries = 0; tries < 100; tries++)); do
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = mpirun ] && pgrep -f 'sleep 41.5' >/dev/null && break
  sleep 0.1
done
comm=$(cat "/proc/$pid/comm" 2>/dev/null)
kill -TERM "$pid" 2>/dev/null
start=$(date +%s)
for ((tries = 0; tries < 150; tries++)); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  kill -KILL "$pid" 2>/dev/null
  fail "TERM: mpirun (PID $pid) still ran 15 s after TERM"
fi
wait "$pid"
status=$?
sleep 0.5
if [ "$comm" != mpirun ]; then
  fail "exec: PID $pid is '$comm', expected mpirun"
elif [ "$status" -eq 0 ]; then
  fail "TERM: exit status 0"
elif pgrep -f 'sleep 41.5' >/dev/null; then
  fail "TERM: the rank (sleep 41.5) outlived mpirun"
else
  pass "exec: PID $pid became mpirun; TERM ended the job in $(($(date +%s) - start)) s with exit $status, no rank left"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "ringrun_cli_test: all checks passed"
