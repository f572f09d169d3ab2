#!/usr/bin/env bash
# ringrun across real SSH hosts: two network namespaces rrhost1 and rrhost2 (10.78.0.1 and .2 on
# bridge rrbr0, 10.78.0.254 here), each with its own hostname and its own sshd on port 2222
# (throwaway host and client keys, nothing of root's ~/.ssh is used). Checks:
#  (1) ringrun -np 4 -H rrhost1:2,rrhost2:2 -p 2222 -i KEY trains mnist_train through Open MPI's
#      ssh launcher: exit 0, the summary line, accuracy above chance, loss falling, the replica
#      check (every 10 steps and at the end) passing, mpirun's map naming both hosts;
#  (2) the ranks really ran in the namespaces: ranks 0,1 see hostname rrhost1 and address
#      10.78.0.1, ranks 2,3 rrhost2 and 10.78.0.2; a -x value full of shell characters arrives
#      unchanged through ssh;
#  (3) the preflight refuses, naming the host and the reason, within --start-timeout, and
#      starts nothing: wrong port (connection refused), an address with no machine behind it,
#      an sshd that accepts but never answers (timed out), a key that is not authorized, an
#      unknown host key, the program missing on one host, one machine under two names;
#  (5) ringrun --max-restarts: rrhost2 killed mid-run (ranks, orted, sshd): dropped, the job
#      finishes on rrhost1, byte-identical under --reproducible, and the restart latency;
#  (6) a host added back to the hostfile rejoins at the next restart;
#  (7) SIGTERM to ringrun: every rank stops at one step, checkpoint, exit 75, resumed bitwise;
#  (8) a failure every launch meets: a clear final error after --max-restarts;
#  (4) afterwards no namespace, bridge, sshd or /etc/hosts line of the test is left.
# Needs root, iproute2, openssh-server and openssh-client; without them it prints
# "SKIPPED: why" and exits 77 (ctest: skipped). Uses names and a subnet of its own (rrhost*,
# rralias1, rrbr0, 10.78.0.0/24, /etc/hosts lines marked "# ringrun-test"), so it cannot meet
# scripts/netns_cluster.sh's rtnode*/rtbr0/10.77.0.0/24; ctest still never runs the two at
# once (RESOURCE_LOCK netns).
# Usage: ringrun_test.sh PATH/TO/mnist_train     (or: ringrun_test.sh --cleanup)
# shellcheck disable=SC2016  # single-quoted $... are meant literally: expanded by a rank or a script
set -uo pipefail

readonly BRIDGE=rrbr0 BASE=10.78.0 SUBNET=10.78.0.0/24 PORT=2222 MARK="# ringrun-test"
readonly HOSTS_NS=(rrhost1 rrhost2)
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ringrun=$repo/scripts/ringrun
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "PASS: $*"; }
skip() { echo "SKIPPED: $*"; exit 77; }
seconds_since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }'; }

tmp="" made_run_sshd="" sshd_pids=()

# ---- teardown: everything this script made, also after a failure or a signal ----
# tidy_netns_dir: undoes /run/netns once it is empty (as scripts/netns_cluster.sh does).
# shellcheck source=scripts/netns_lib.sh
source "$repo/scripts/netns_lib.sh"
our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^rr(host[0-9]+|probe[0-9]+)$'; }
# stop_pids PID...: TERM, up to 2 s for them to go, then KILL.
stop_pids() {
  local pid tries alive
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null
  for ((tries = 0; tries < 20; tries++)); do
    alive=""
    for pid in "$@"; do ! kill -0 "$pid" 2>/dev/null || alive=1; done
    [ -n "$alive" ] || return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null
}
cleanup() {
  local pid ns pids=() kept
  for pid in "${sshd_pids[@]}"; do
    kill -CONT "$pid" 2>/dev/null  # one case stops an sshd; a stopped sshd reaps no children
  done
  # Whatever else is inside the namespaces was started by this test (sshd sessions, an orted or
  # a rank of a run that was cut short). Stop those first, while their sshd still lives to reap
  # them, then the sshds, which this shell reaps: nothing is left, not even a zombie. A process
  # left inside would also keep its namespace alive after the delete.
  for ns in $(our_namespaces); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [[ " ${sshd_pids[*]} " == *" $pid "* ]] || pids+=("$pid")
    done
  done
  stop_pids "${pids[@]}"
  stop_pids "${sshd_pids[@]}"
  [ ${#sshd_pids[@]} -eq 0 ] || wait "${sshd_pids[@]}" 2>/dev/null
  for ns in $(our_namespaces); do ip netns delete "$ns" 2>/dev/null; done
  for ns in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
              grep -E '^rrhost[0-9]+[hn]$'); do
    ip link delete "$ns" 2>/dev/null
  done
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link delete "$BRIDGE"
  if grep -qF "$MARK" /etc/hosts 2>/dev/null; then
    # /etc/hosts may be a bind mount (containers): rewrite it in place, never replace the file.
    kept=$(grep -vF "$MARK" /etc/hosts)
    printf '%s\n' "$kept" >/etc/hosts
  fi
  [ -z "$made_run_sshd" ] || rmdir /run/sshd 2>/dev/null
  tidy_netns_dir
  [ -z "$tmp" ] || rm -rf "$tmp"
  sshd_pids=() tmp="" made_run_sshd=""
}

if [ "${1:-}" = "--cleanup" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "ringrun_test: --cleanup needs root"; exit 1; }
  rm -rf /tmp/ringrun-test.*
  cleanup
  # A killed run cannot say whether it made sshd's /run/sshd: remove it when empty and no
  # sshd runs (a system sshd's service makes it again at start).
  if [ -d /run/sshd ] && [ -z "$(ls -A /run/sshd)" ] && ! pgrep -x sshd >/dev/null; then
    rmdir /run/sshd
  fi
  echo "ringrun_test: removed rrhost*/rrprobe* namespaces, bridge $BRIDGE and '$MARK' lines"
  exit 0
fi
[ $# -eq 1 ] || { echo "usage: $0 PATH/TO/mnist_train | --cleanup"; exit 2; }
trainer=$(realpath -e "$1" 2>/dev/null) || { echo "FAIL: no trainer at '$1'"; exit 1; }

# ---- can it run here? ----
[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces and sshd need root)"
command -v ip >/dev/null || skip "the 'ip' command is missing (install iproute2)"
[ -x /usr/sbin/sshd ] || skip "/usr/sbin/sshd is missing (install openssh-server)"
if ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
  skip "ssh or ssh-keygen is missing (install openssh-client)"
fi
command -v unshare >/dev/null || skip "the 'unshare' command is missing (install util-linux)"
command -v python3 >/dev/null || skip "python3 is missing (ringrun is a python3 script)"
[ -w /etc/hosts ] || skip "/etc/hosts is not writable"
[ -x "$trainer" ] || { echo "FAIL: no trainer at '$trainer'"; exit 1; }
if [ -n "$(our_namespaces)" ] || ip link show "$BRIDGE" >/dev/null 2>&1 ||
   grep -qF "$MARK" /etc/hosts; then
  echo "FAIL: rrhost* namespaces, bridge $BRIDGE or '$MARK' lines in /etc/hosts already exist" \
       "(a run of this test that was killed?); remove them with: bash $0 --cleanup"
  exit 1
fi
if ip -o -4 addr show | grep -q " inet $BASE\."; then
  skip "subnet $SUBNET is already used by an interface here"
fi
probe=rrprobe$$
if ! why=$(ip netns add "$probe" 2>&1); then
  skip "cannot create a network namespace: $why"
fi
if ! why=$(ip netns exec "$probe" unshare --uts --mount sh -c 'hostname rrprobe' 2>&1); then
  ip netns delete "$probe" 2>/dev/null
  tidy_netns_dir
  skip "cannot run a command in a namespace with its own hostname: $why"
fi
ip netns delete "$probe"
tidy_netns_dir

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
unset RINGTRAIN_DATA  # the default data (Fashion-MNIST) unless data/mnist is in the cwd
tmp=$(mktemp -d /tmp/ringrun-test.XXXXXX)
cd "$tmp" || exit 1
test_start=$(date +%s.%N)

# ---- keys: a host key shared by both sshds, the client key, a key nobody authorized ----
ssh-keygen -q -t ed25519 -N '' -C ringrun-test-host -f "$tmp/host_key" || exit 1
ssh-keygen -q -t ed25519 -N '' -C ringrun-test-client -f "$tmp/client_key" || exit 1
ssh-keygen -q -t ed25519 -N '' -C ringrun-test-stranger -f "$tmp/stranger_key" || exit 1
cp "$tmp/client_key.pub" "$tmp/authorized_keys"
# known_hosts for port 2222 under every name the test uses, so that the client checks the
# host key strictly (no StrictHostKeyChecking=no); rrhost3 has no machine behind it.
for name in rrhost1 rrhost2 rrhost3 rralias1; do
  echo "[$name]:$PORT $(cut -d' ' -f1,2 "$tmp/host_key.pub")"
done >"$tmp/known_hosts"
: >"$tmp/empty_known_hosts"

# ---- the network: bridge rrbr0 here, one veth into each namespace ----
setup_network() {
  ip link add "$BRIDGE" type bridge &&
    ip addr add "$BASE.254/24" dev "$BRIDGE" &&
    ip link set "$BRIDGE" up || return 1
  local i ns
  for i in 1 2; do
    ns=rrhost$i
    ip netns add "$ns" &&
      ip -n "$ns" link set lo up &&
      ip link add "${ns}h" type veth peer name "${ns}n" &&
      ip link set "${ns}n" netns "$ns" &&
      ip -n "$ns" link set "${ns}n" name eth0 &&
      ip -n "$ns" addr add "$BASE.$i/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      ip link set "${ns}h" master "$BRIDGE" &&
      ip link set "${ns}h" up || return 1
  done
  # rrhost3: an address in the subnet with no machine behind it. rralias1: a second name
  # for rrhost1.
  printf '%s\n' "$BASE.1 rrhost1 $MARK" "$BASE.2 rrhost2 $MARK" "$BASE.3 rrhost3 $MARK" \
    "$BASE.1 rralias1 $MARK" >>/etc/hosts
}
setup_network || { echo "FAIL: could not set up the namespaces and the bridge"; exit 1; }

# ---- sshd in each namespace, with its own hostname (UTS namespace) so the ranks can tell
# where they are. On rrhost2 a private tmpfs hides $tmp/local-only: a program that exists
# here but not there. ----
mkdir -p "$tmp/local-only"
printf '#!/bin/sh\ntouch "$1"\n' >"$tmp/local-only/mark"
mkdir -p "$tmp/bin"
cp "$tmp/local-only/mark" "$tmp/bin/mark"
chmod 755 "$tmp/local-only/mark" "$tmp/bin/mark"
if [ ! -d /run/sshd ]; then
  mkdir -p /run/sshd && made_run_sshd=1  # sshd's privilege separation directory
fi
readonly SUBREAPER='import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
os.execv(sys.argv[1], sys.argv[1:])'
start_sshd() {  # start_sshd NS [extra shell before sshd]
  local ns=$1 before=${2:-true} cfg=$tmp/sshd_$1.conf
  cat >"$cfg" <<EOF
Port $PORT
HostKey $tmp/host_key
PidFile $tmp/sshd_$ns.pid
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
X11Forwarding no
MaxStartups 50
EOF
  /usr/sbin/sshd -t -f "$cfg" || return 1
  # `ip netns exec`, unshare, sh and the python below all exec, so $! is sshd's own PID. The
  # python makes sshd a child subreaper (prctl PR_SET_CHILD_SUBREAPER = 36, kept across exec):
  # a session process whose parent dies while the test tears down is then adopted and reaped by
  # its sshd instead of PID 1, which on some machines reaps late and would show sshd zombies.
  ip netns exec "$ns" unshare --uts --mount sh -c \
    "hostname $ns && $before && exec python3 -c '$SUBREAPER' /usr/sbin/sshd -D -e -f '$cfg'" \
    >"$tmp/sshd_$ns.log" 2>&1 &
  sshd_pids+=("$!")
}
start_sshd rrhost1 || { echo "FAIL: sshd config rejected"; exit 1; }
start_sshd rrhost2 "mount -t tmpfs ringrun-test '$tmp/local-only'" || { echo "FAIL: sshd config rejected"; exit 1; }
for i in 1 2; do
  for ((tries = 0; tries < 50; tries++)); do
    timeout 1 bash -c "exec 3<>/dev/tcp/$BASE.$i/$PORT" 2>/dev/null && break
    sleep 0.1
  done
  if [ "$tries" -ge 50 ]; then
    echo "FAIL: sshd on rrhost$i did not listen on port $PORT within 5 s: $(cat "$tmp/sshd_rrhost$i.log")"
    exit 1
  fi
done
echo "setup: rrhost1, rrhost2 up with sshd on port $PORT in $(seconds_since "$test_start") s"

ssh_flags=(-p "$PORT" -i "$tmp/client_key" --ssh-option "UserKnownHostsFile=$tmp/known_hosts"
           --ssh-option StrictHostKeyChecking=yes --network-interface "$SUBNET")

# ---- (1) training across the two hosts ----
run_start=$(date +%s.%N)
timeout -k 5 100 python3 "$ringrun" -np 4 -H rrhost1:2,rrhost2:2 "${ssh_flags[@]}" \
  --start-timeout 10 --verbose --mpi-args=--display-map -- \
  "$trainer" --steps 30 --batch-size 32 --log-every 10 --check-replicas 10 \
  --metrics-out "$tmp/metrics.jsonl" </dev/null >"$tmp/train.log" 2>&1
status=$?
took=$(seconds_since "$run_start")
summary=$(grep '"event":"summary"' "$tmp/metrics.jsonl" 2>/dev/null | tail -n 1)
field() { grep -o "\"$1\":[^,}]*" <<<"$summary" | head -n 1 | cut -d: -f2- | tr -d '"'; }
loss_at() { grep "\"step\":$1," "$tmp/metrics.jsonl" | grep -o '"loss":[^,}]*' | cut -d: -f2; }
accuracy=$(field test_accuracy) world=$(field world_size)
loss10=$(loss_at 10) loss30=$(loss_at 30)
if [ "$status" -ne 0 ]; then
  fail "(1) training over ssh exited $status after $took s: $(tail -n 30 "$tmp/train.log")"
elif [ -z "$summary" ] || ! grep -q 'summary: test accuracy' "$tmp/train.log"; then
  fail "(1) no summary line: $(tail -n 30 "$tmp/train.log")"
elif [ "$world" != 4 ]; then
  fail "(1) world_size is '$world', expected 4"
elif ! awk -v a="$accuracy" 'BEGIN { exit !(a > 0.2) }'; then
  fail "(1) test accuracy $accuracy is not above chance (0.1) by a margin (> 0.2)"
elif ! awk -v a="$loss10" -v b="$loss30" 'BEGIN { exit !(a != "" && b != "" && b < a) }'; then
  fail "(1) training loss did not fall: step 10 '$loss10', step 30 '$loss30'"
elif grep -q 'diverged' "$tmp/train.log"; then
  fail "(1) the replica check reported diverged replicas: $(grep -m 1 diverged "$tmp/train.log")"
elif ! grep -qE 'Data for node: rrhost1[[:space:]]+Num slots: 2' "$tmp/train.log" ||
     ! grep -qE 'Data for node: rrhost2[[:space:]]+Num slots: 2' "$tmp/train.log"; then
  fail "(1) mpirun's map does not show rrhost1 and rrhost2 with 2 slots: $(grep -A3 'Data for node' "$tmp/train.log")"
elif ! grep -q 'preflight ok' "$tmp/train.log"; then
  fail "(1) no 'preflight ok' line from ringrun --verbose"
else
  pass "(1) 4 ranks on rrhost1:2,rrhost2:2 over ssh in $took s: world_size 4, test accuracy" \
       "$accuracy, loss $(printf '%.4f' "$loss10") (step 10) -> $(printf '%.4f' "$loss30")" \
       "(step 30), replicas identical at steps 10, 20, 30"
fi
grep -E 'ringrun:|Data for node|summary:' "$tmp/train.log" | sed 's/^/    /'

# ---- (2) where the ranks ran, and -x through ssh ----
value='a b;$(echo INJECTED)`id`|&"'\''\*'
probe_script='printf "probe rank=%s host=%s addr=%s value=[%s]\n" "$OMPI_COMM_WORLD_RANK" "$(hostname)" "$(ip -4 -o addr show dev eth0 | awk "{print \$4}")" "$RR_PROBE"'
timeout -k 5 40 python3 "$ringrun" -np 4 -H rrhost1:2,rrhost2:2 "${ssh_flags[@]}" \
  --start-timeout 10 -x "RR_PROBE=$value" -- /bin/sh -c "$probe_script" \
  </dev/null >"$tmp/probe.log" 2>&1
status=$?
placement_ok=1
for rank in 0 1 2 3; do
  host=rrhost$((rank / 2 + 1)) address=$BASE.$((rank / 2 + 1))/24
  line=$(grep "^probe rank=$rank " "$tmp/probe.log")
  if [ "$line" != "probe rank=$rank host=$host addr=$address value=[$value]" ]; then
    placement_ok=""
    fail "(2) rank $rank: expected host=$host addr=$address value=[$value], got '$line'"
  fi
done
if [ "$status" -ne 0 ]; then
  fail "(2) the probe run exited $status: $(tail -n 20 "$tmp/probe.log")"
elif [ -n "$placement_ok" ]; then
  pass "(2) ranks 0,1 ran on rrhost1 ($BASE.1), ranks 2,3 on rrhost2 ($BASE.2); -x value" \
       "with shell characters arrived unchanged"
fi
sed 's/^/    /' "$tmp/probe.log"

# ---- (3) preflight failures: exit 1, a line naming the host and the reason, within the
# start timeout, and nothing started (the program would create a marker file; no orted runs
# in the namespaces; ringrun never reached exec). ----
start_timeout=5
bound=$((start_timeout + 2))  # the timeout itself plus python's and ssh's start-up
case_number=0
expect_refusal() {  # expect_refusal WHAT 'HOST: REASON regex'... -- ringrun args (before --)
  local what=$1
  shift
  local patterns=()
  while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
  shift
  case_number=$((case_number + 1))
  local marker=$tmp/started.$case_number program=${PROGRAM_OVERRIDE:-$tmp/bin/mark}
  local start took status out pattern ok=1 ns pid
  start=$(date +%s.%N)
  out=$(timeout -k 2 15 python3 "$ringrun" "$@" --start-timeout "$start_timeout" --verbose \
          -- "$program" "$marker" </dev/null 2>&1)
  status=$?
  took=$(seconds_since "$start")
  [ "$status" -eq 1 ] || { ok=""; fail "(3) $what: exit $status, expected 1"; }
  for pattern in "${patterns[@]}"; do
    grep -qE "^  $pattern" <<<"$out" || { ok=""; fail "(3) $what: no line matching '  $pattern'"; }
  done
  grep -q 'nothing was started' <<<"$out" || { ok=""; fail "(3) $what: no 'nothing was started'"; }
  if ! awk -v t="$took" -v b="$bound" 'BEGIN { exit !(t <= b) }'; then
    ok=""
    fail "(3) $what: took $took s, more than --start-timeout $start_timeout s + 2"
  fi
  [ ! -e "$marker" ] || { ok=""; fail "(3) $what: the program ran although the preflight failed"; }
  ! grep -q 'ringrun: exec ' <<<"$out" || { ok=""; fail "(3) $what: ringrun went on to exec mpirun"; }
  for ns in "${HOSTS_NS[@]}"; do
    for pid in $(ip netns pids "$ns"); do
      if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = orted ]; then
        ok=""
        fail "(3) $what: an orted runs in $ns"
      fi
    done
  done
  if [ -n "$ok" ]; then
    pass "(3) $what: refused in $took s (bound $bound s), nothing started:"
  else
    echo "    ringrun said:"
  fi
  grep -E '^  |preflight failed' <<<"$out" | sed 's/^/    /'
}
# shellcheck disable=SC2054  # the comma belongs to ringrun's -H
two=(-np 4 -H rrhost1:2,rrhost2:2)
expect_refusal "wrong port" \
  'rrhost1: connection refused on port 2223' 'rrhost2: connection refused on port 2223' -- \
  "${two[@]}" -p 2223 -i "$tmp/client_key" --ssh-option "UserKnownHostsFile=$tmp/known_hosts"
expect_refusal "no machine at the address (rrhost3 = $BASE.3)" \
  'rrhost3: (no route to host|timed out)' -- \
  -np 4 -H rrhost1:2,rrhost3:2 "${ssh_flags[@]}"
# An sshd that accepts TCP (the kernel completes the handshake) but never answers: only a
# timeout ends the wait.
kill -STOP "${sshd_pids[1]}"
expect_refusal "sshd on rrhost2 accepts but never answers" \
  'rrhost2: timed out' -- "${two[@]}" "${ssh_flags[@]}"
# A TERM while the preflight waits (a scheduler cancelling the job): ringrun ends at once with
# 143, takes its ssh children with it and starts nothing.
python3 "$ringrun" "${two[@]}" "${ssh_flags[@]}" --start-timeout 30 -- "$tmp/bin/mark" \
  "$tmp/started.term" </dev/null >"$tmp/term.log" 2>&1 &
rr_pid=$!
sleep 1.5
kill -TERM "$rr_pid"
term_start=$(date +%s.%N)
for ((tries = 0; tries < 50; tries++)); do
  kill -0 "$rr_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$rr_pid" 2>/dev/null; then
  kill -KILL "$rr_pid"
  fail "(3) TERM during the preflight: ringrun still ran 5 s later"
fi
wait "$rr_pid"
status=$?
took=$(seconds_since "$term_start")
if [ "$status" -ne 143 ]; then
  fail "(3) TERM during the preflight: exit $status, expected 143: $(cat "$tmp/term.log")"
elif pgrep -f -- '-- rrhost2 sh -c' >/dev/null; then
  fail "(3) TERM during the preflight: its ssh to rrhost2 is still running"
elif [ -e "$tmp/started.term" ]; then
  fail "(3) TERM during the preflight: the program ran"
else
  pass "(3) TERM during the preflight (rrhost2 not answering): exit 143 after $took s, no ssh left, nothing started"
fi
kill -CONT "${sshd_pids[1]}"
expect_refusal "a key rrhost1/rrhost2 do not authorize" \
  'rrhost1: authentication failed' 'rrhost2: authentication failed' -- \
  "${two[@]}" -p "$PORT" -i "$tmp/stranger_key" \
  --ssh-option "UserKnownHostsFile=$tmp/known_hosts"
expect_refusal "unknown host keys" \
  'rrhost1: host key verification failed' 'rrhost2: host key verification failed' -- \
  "${two[@]}" -p "$PORT" -i "$tmp/client_key" \
  --ssh-option "UserKnownHostsFile=$tmp/empty_known_hosts"
PROGRAM_OVERRIDE=$tmp/local-only/mark expect_refusal "program present here, missing on rrhost2" \
  "rrhost2: program missing: no executable $tmp/local-only/mark there" -- \
  "${two[@]}" "${ssh_flags[@]}"
expect_refusal "one machine under two names" \
  'rrhost1 and rralias1 are the same machine \(both resolve to 10\.78\.0\.1\)' -- \
  -np 4 -H rrhost1:2,rralias1:2 "${ssh_flags[@]}"

# ---- (5) to (8): elastic runs (--max-restarts) across the hosts ----
# The job: --reproducible, so any rank count gives the same bits as this one-rank run; rank 1
# sleeps 20 ms a step so that the failure lands mid-run; the watchdog's timeout is 10 s.
ejob=(--hidden 64 --global-batch-size 96 --reproducible --micro-batch 8 --steps 300 --seed 3
      --optimizer sgd --momentum 0.9 --lr 0.05 --log-every 50 --checkpoint-every 20
      --eval-batch 10000 --collective-timeout 10)
eslow=(--test-slow-rank 1 --test-slow-ms 20)
watchdog_s=10
timeout -k 5 120 "$trainer" "${ejob[@]}" --checkpoint-dir "$tmp/eref" \
  --save-params "$tmp/eref.bin" </dev/null >"$tmp/eref.log" 2>&1 ||
  fail "(5) the uninterrupted one-rank run failed: $(tail -n 5 "$tmp/eref.log")"
# shellcheck source=tests/support/wait_lib.sh
source "$repo/tests/support/wait_lib.sh"
elastic_flags=("${ssh_flags[@]}" --start-timeout 5 --max-restarts 2)

# (5) rrhost2 dies mid-run (its ranks, its orted and its sshd, all SIGKILLed): ringrun drops
# it at the next preflight and the job finishes on rrhost1's 2 ranks, byte-identical.
timeout -k 5 200 python3 "$ringrun" -np 4 -H rrhost1:2,rrhost2:2 "${elastic_flags[@]}" -- \
  "$trainer" "${ejob[@]}" "${eslow[@]}" --checkpoint-dir "$tmp/e5" --save-params "$tmp/e5.bin" \
  </dev/null >"$tmp/e5.log" 2>&1 &
rr_pid=$!
killed_at=""
if wait_for "$tmp/e5.log" "checkpoint: step (4|5|6|7|8)0 written" 90; then
  # shellcheck disable=SC2046  # one PID per word
  kill -KILL $(ip netns pids rrhost2) 2>/dev/null
  killed_at=$(date +%s.%N)
  resumed_after=""
  if wait_for "$tmp/e5.log" "ringrun: training resumed" 60; then
    resumed_after=$(seconds_since "$killed_at")
  fi
else
  fail "(5) no checkpoint of step 40 within 90 s: $(tail -n 5 "$tmp/e5.log")"
fi
wait "$rr_pid"
status=$?
if [ -z "$killed_at" ]; then
  :
elif [ "$status" -ne 0 ]; then
  fail "(5) exit $status after rrhost2 died: $(grep -E 'ringrun:|error' "$tmp/e5.log" | tail -n 12)"
elif ! grep -q "ringrun: dropping rrhost2: connection refused" "$tmp/e5.log" ||
     ! grep -q "ringrun: restart 1 of 2: np 2 on rrhost1:2 (per-rank batch 48)" "$tmp/e5.log"; then
  fail "(5) rrhost2 was not dropped or the relaunch is not np 2 on rrhost1: $(grep ringrun: "$tmp/e5.log")"
elif ! cmp -s "$tmp/e5.bin" "$tmp/eref.bin"; then
  fail "(5) the parameters differ from the uninterrupted one-rank run's"
elif [ -z "$resumed_after" ] ||
     ! awk -v t="$resumed_after" -v w="$watchdog_s" 'BEGIN { exit !(t <= w + 10) }'; then
  fail "(5) training resumed '${resumed_after:-never}' s after the kill (target: the watchdog's $watchdog_s s + 10)"
else
  pass "(5) rrhost2 killed mid-run: $(grep -m 1 'the job failed' "$tmp/e5.log" | sed 's/^ringrun: //' | cut -c1-160);" \
       "dropped, relaunched on rrhost1:2, $(grep -m 1 -o 'resuming from [^:]*: step [0-9]*' "$tmp/e5.log" | sed 's|.*/||');" \
       "training resumed $resumed_after s after the kill (target <= $((watchdog_s + 10)) s); completed," \
       "byte-identical to the one-rank run"
fi
grep 'ringrun:' "$tmp/e5.log" | sed 's/^/    /'

# (6) rrhost2 comes back: a hostfile that lists only rrhost1 at the start gets rrhost2 added;
# when a rank on rrhost1 is then killed, the relaunch reads the file again and runs on both.
start_sshd rrhost2 || fail "(6) sshd on rrhost2 did not start again"
for ((tries = 0; tries < 50; tries++)); do
  timeout 1 bash -c "exec 3<>/dev/tcp/$BASE.2/$PORT" 2>/dev/null && break
  sleep 0.1
done
echo "rrhost1 slots=2" >"$tmp/elastic_hosts"
timeout -k 5 200 python3 "$ringrun" -np 4 --hostfile "$tmp/elastic_hosts" "${elastic_flags[@]}" -- \
  "$trainer" "${ejob[@]}" "${eslow[@]}" --checkpoint-dir "$tmp/e6" --save-params "$tmp/e6.bin" \
  </dev/null >"$tmp/e6.log" 2>&1 &
rr_pid=$!
killed=""
if wait_for "$tmp/e6.log" "checkpoint: step (4|5|6|7|8)0 written" 90; then
  echo "rrhost2 slots=2" >>"$tmp/elastic_hosts"
  for pid in $(ip netns pids rrhost1); do
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = mnist_train ]; then
      kill -KILL "$pid" && killed=1
      break
    fi
  done
  [ -n "$killed" ] || fail "(6) no mnist_train rank found in rrhost1"
else
  fail "(6) no checkpoint of step 40 within 90 s: $(tail -n 5 "$tmp/e6.log")"
fi
wait "$rr_pid"
status=$?
if [ -z "$killed" ]; then
  :
elif [ "$status" -ne 0 ]; then
  fail "(6) exit $status: $(grep -E 'ringrun:|error' "$tmp/e6.log" | tail -n 12)"
elif ! grep -q "ringrun: launch: np 2 on rrhost1:2" "$tmp/e6.log" ||
     ! grep -q "ringrun: restart 1 of 2: np 4 on rrhost1:2,rrhost2:2 (per-rank batch 24)" "$tmp/e6.log"; then
  fail "(6) rrhost2 did not rejoin at the restart: $(grep ringrun: "$tmp/e6.log")"
elif ! cmp -s "$tmp/e6.bin" "$tmp/eref.bin"; then
  fail "(6) the parameters differ from the uninterrupted one-rank run's"
else
  pass "(6) a host that returns: launched on rrhost1:2 alone, rrhost2 added to the hostfile," \
       "relaunched on rrhost1:2,rrhost2:2 after a killed rank; completed, byte-identical"
fi
grep 'ringrun:' "$tmp/e6.log" | sed 's/^/    /'

# (7) SIGTERM to ringrun with ranks on both hosts: through mpirun's SIGUSR1 over ssh every rank
# stops after the same step, the chief checkpoints, exit 75; the same command resumes.
e7=(python3 "$ringrun" -np 4 -H rrhost1:2,rrhost2:2 "${elastic_flags[@]}" -- "$trainer"
    "${ejob[@]}" "${eslow[@]}" --checkpoint-dir "$tmp/e7" --save-params "$tmp/e7.bin")
timeout -k 5 200 "${e7[@]}" </dev/null >"$tmp/e7.log" 2>&1 &
rr_pid=$!
term_at=""
if wait_for "$tmp/e7.log" "checkpoint: step (4|5|6|7|8)0 written" 90; then
  # ringrun itself (timeout's child), not timeout: a TERM to timeout -k also arms its KILL.
  kill -TERM "$(pgrep -P "$rr_pid")"
  term_at=$(date +%s.%N)
else
  fail "(7) no checkpoint of step 40 within 90 s: $(tail -n 5 "$tmp/e7.log")"
fi
wait "$rr_pid"
status=$?
if [ -n "$term_at" ]; then
  took=$(seconds_since "$term_at")
  stopped_at=$(grep -o 'every rank stopped after step [0-9]*' "$tmp/e7.log" | grep -o '[0-9]*$')
  if [ "$status" -ne 75 ] || [ -z "$stopped_at" ]; then
    fail "(7) SIGTERM: exit $status (expected 75), stopped at '$stopped_at': $(grep -E 'ringrun:|preempt' "$tmp/e7.log")"
  elif ! awk -v t="$took" 'BEGIN { exit !(t <= 10) }'; then
    fail "(7) SIGTERM: the job took $took s to stop (at most 10)"
  else
    timeout -k 5 200 "${e7[@]}" </dev/null >"$tmp/e7b.log" 2>&1
    status=$?
    if [ "$status" -ne 0 ]; then
      fail "(7) the same command again exited $status: $(grep -E 'ringrun:|error' "$tmp/e7b.log" | tail -n 8)"
    elif ! grep -q "resuming from $tmp/e7/ckpt-$(printf '%010d' "$stopped_at")" "$tmp/e7b.log"; then
      fail "(7) the second run did not resume from step $stopped_at"
    elif ! cmp -s "$tmp/e7.bin" "$tmp/eref.bin"; then
      fail "(7) the resumed parameters differ from the uninterrupted run's"
    else
      pass "(7) SIGTERM to ringrun across both hosts: stopped after step $stopped_at in $took s," \
           "exit 75; the same command resumed and ended byte-identical"
    fi
  fi
fi

# (8) a failure on rrhost2 that every launch meets: a clear final error after --max-restarts.
timeout -k 5 120 python3 "$ringrun" -np 4 -H rrhost1:2,rrhost2:2 "${ssh_flags[@]}" \
  --start-timeout 5 --max-restarts 1 -- "$trainer" --hidden 32 --global-batch-size 32 \
  --steps 50 --checkpoint-dir "$tmp/e8" --log-every 0 --test-fail-rank 3 --test-fail-at-step 5 \
  </dev/null >"$tmp/e8.log" 2>&1
status=$?
if [ "$status" -eq 0 ] || ! grep -q "ringrun: restart 1 of 1: np 4 on rrhost1:2,rrhost2:2" "$tmp/e8.log" ||
   ! grep -qE "ringrun: giving up after 1 restart\(s\) \(--max-restarts 1\); the last failure: .*rank 3 fails on purpose" "$tmp/e8.log"; then
  fail "(8) restarts exhausted: exit $status: $(grep ringrun: "$tmp/e8.log")"
else
  pass "(8) restarts exhausted: exit $status; $(grep 'giving up' "$tmp/e8.log" | sed 's/^ringrun: //')"
fi

# ---- (4) teardown leaves nothing ----
cleanup
trap - EXIT
[ -z "$(our_namespaces)" ] || fail "(4) namespaces left: $(our_namespaces)"
! ip link show "$BRIDGE" >/dev/null 2>&1 || fail "(4) bridge $BRIDGE left"
! grep -qF "$MARK" /etc/hosts || fail "(4) '$MARK' lines left in /etc/hosts"
if pgrep -f "sshd -D -e -f /tmp/ringrun-test" >/dev/null; then
  fail "(4) an sshd of the test is still running: $(pgrep -af "sshd -D -e -f /tmp/ringrun-test")"
elif pgrep -r Z sshd >/dev/null; then
  fail "(4) sshd zombies left: $(pgrep -a -r Z sshd)"
fi
[ "$failures" -ne 0 ] || pass "(4) no rrhost namespace, bridge $BRIDGE, test sshd or /etc/hosts line left"

echo "ringrun_test: $(seconds_since "$test_start") s in all"
if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "ringrun_test: all checks passed"
