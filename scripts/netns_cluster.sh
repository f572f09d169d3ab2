#!/usr/bin/env bash
# An emulated cluster network on one machine: K network namespaces ("nodes") rtnode1..rtnodeK,
# each with one veth link to a bridge in the root namespace, each link rate-limited, so that MPI
# traffic between ranks crosses a real TCP/IP stack and a wire of known speed instead of shared
# memory. mpirun starts its daemons inside the namespaces through an rsh agent (no sshd).
#
#                 root namespace: bridge rtbr0  10.77.0.254/24  (mpirun runs here)
#                 |                     |                     |
#        veth rtnode1h         veth rtnode2h   ...    veth rtnodeKh
#                 |                     |                     |
#     [rtnode1] eth0 .1       [rtnode2] eth0 .2       [rtnodeK] eth0 .K
#       tbf RATE egress         tbf RATE egress         tbf RATE egress
#
# The rate limit is a tbf qdisc on each node's own eth0, so it limits each node's OUTGOING link:
# a node sends at most RATE and (since every byte it receives was sent by another limited node)
# receives at most RATE from any one peer, like a full-duplex NIC of that speed. Incoming
# traffic is not limited itself, so several nodes sending to one at once (incast) can exceed
# RATE at the receiver; a ring never does that.
#
# Usage (as root):
#   scripts/netns_cluster.sh up K [--rate 10gbit] [--delay 0] [--subnet 10.77.0.0/24] [--prefix rtnode]
#       --delay D (e.g. 100us, 1ms): one-way delay added to each node's outgoing packets (a
#       netem qdisc above the tbf; needs a kernel with sch_netem, refused with a message if not)
#   scripts/netns_cluster.sh down          remove everything `up` made (idempotent)
#   scripts/netns_cluster.sh mpirun-args   mpirun flags for the cluster that is up, e.g.
#       mpirun $(scripts/netns_cluster.sh mpirun-args) -np 2 build/allreduce_bench ...
#   scripts/netns_cluster.sh check         exit 0 if namespaces work here, else say why, exit 1
#   scripts/netns_cluster.sh run K [--rate R] [--delay D] [--subnet S] [--prefix P] -- COMMAND...
#       up, run COMMAND with RINGTRAIN_NETNS_MPIRUN_ARGS set to the mpirun flags, down; exits
#       with COMMAND's status.
# Files: /tmp/ringtrain-netns/{hostfile,rsh-agent,state}; /etc/hosts lines marked
# "# ringtrain-netns". Only one cluster can be up at a time.
set -euo pipefail

readonly STATE_DIR=/tmp/ringtrain-netns
readonly STATE_FILE=$STATE_DIR/state
readonly HOSTFILE=$STATE_DIR/hostfile
readonly AGENT=$STATE_DIR/rsh-agent
readonly HOSTS_MARK="# ringtrain-netns"
readonly BRIDGE=rtbr0
readonly DEFAULT_RATE=10gbit
readonly DEFAULT_SUBNET=10.77.0.0/24
readonly DEFAULT_PREFIX=rtnode

me=$(basename "$0")
SELF=("$BASH" "$(realpath "$0")")  # run works whether or not the script is executable
die() { echo "$me: $*" >&2; exit 1; }
say() { echo "$me: $*" >&2; }

usage() {
  sed -n '/^# Usage/,/^# Files/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---- argument parsing shared by up and run ----
K="" RATE=$DEFAULT_RATE DELAY=0 SUBNET=$DEFAULT_SUBNET PREFIX=$DEFAULT_PREFIX
parse_up_args() {  # sets K RATE SUBNET PREFIX; leaves the rest (after --) in REST
  REST=()
  [ $# -ge 1 ] || die "up/run need K, the number of nodes (e.g. '$me up 2')"
  K=$1
  shift
  if ! [[ $K =~ ^[0-9]+$ ]] || [ "$K" -lt 1 ] || [ "$K" -gt 253 ]; then
    die "K must be a number of nodes from 1 to 253, got '$K'"
  fi
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) [ $# -ge 2 ] || die "--rate needs a value (e.g. 10gbit)"; RATE=$2; shift 2 ;;
      --delay) [ $# -ge 2 ] || die "--delay needs a value (e.g. 1ms)"; DELAY=$2; shift 2 ;;
      --subnet) [ $# -ge 2 ] || die "--subnet needs a value (e.g. 10.77.0.0/24)"; SUBNET=$2; shift 2 ;;
      --prefix) [ $# -ge 2 ] || die "--prefix needs a value (e.g. rtnode)"; PREFIX=$2; shift 2 ;;
      --) shift; REST=("$@"); return ;;
      *) die "unknown argument '$1' (expected --rate, --delay, --subnet, --prefix or --)" ;;
    esac
  done
}

# rate_bits RATE: RATE in bit/s. Only tc's bit units are accepted (tc reads "bps" as BYTES/s,
# a classic trap, so it is refused here).
rate_bits() {
  local n unit
  [[ $1 =~ ^([0-9]+)(bit|kbit|mbit|gbit|tbit)$ ]] ||
    die "--rate must be a number with a unit of bit, kbit, mbit, gbit or tbit (e.g. 10gbit), got '$1'"
  n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case $unit in
    bit) echo $((n)) ;;
    kbit) echo $((n * 1000)) ;;
    mbit) echo $((n * 1000000)) ;;
    gbit) echo $((n * 1000000000)) ;;
    tbit) echo $((n * 1000000000000)) ;;
  esac
}

# check_delay DELAY: 0, or a number with tc's time units us or ms (netem's delay).
check_delay() {
  [[ $1 =~ ^(0|[0-9]+(\.[0-9]+)?(us|ms))$ ]] ||
    die "--delay must be 0 or a number with a unit of us or ms (e.g. 100us, 1ms), got '$1'"
}

# netem_missing: true (exit 0) when this kernel's configuration is readable and has no netem
# qdisc, the one kernel qdisc that delays packets (tbf only shapes); false when it has one or
# the configuration cannot be read (then `up` tries, and a failing tc undoes what was made).
netem_missing() {
  local config
  config=$(zcat /proc/config.gz 2>/dev/null) || return 1
  # (a here-string, not a pipe: grep -q leaving early would fail the pipe under pipefail)
  ! grep -qE '^CONFIG_NET_SCH_NETEM=[ym]' <<<"$config" && ! grep -qw sch_netem /proc/modules 2>/dev/null
}

# subnet_base SUBNET: the first three octets ("10.77.0") of an A.B.C.0/24 subnet.
subnet_base() {
  [[ $1 =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.0/24$ ]] ||
    die "--subnet must be an IPv4 /24 written A.B.C.0/24 (e.g. 10.77.0.0/24), got '$1'"
  local o
  for o in "${BASH_REMATCH[@]:1:3}"; do
    [ "$o" -le 255 ] || die "--subnet: octet $o is larger than 255 in '$1'"
  done
  echo "${BASH_REMATCH[1]}.${BASH_REMATCH[2]}.${BASH_REMATCH[3]}"
}

need_root_tools() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  command -v ip >/dev/null || die "the 'ip' command is missing (install iproute2)"
  command -v tc >/dev/null || die "the 'tc' command is missing (install iproute2)"
}

# ---- up ----
cmd_up() {
  parse_up_args "$@"
  [ ${#REST[@]} -eq 0 ] || die "up takes no command; did you mean '$me run'?"
  need_root_tools
  [[ $PREFIX =~ ^[a-z][a-z0-9]{0,10}$ ]] ||
    die "--prefix must be 1-11 lower-case letters/digits starting with a letter, got '$PREFIX'"
  local base bits burst
  base=$(subnet_base "$SUBNET")
  bits=$(rate_bits "$RATE")
  check_delay "$DELAY"
  if [ "$DELAY" != 0 ] && netem_missing; then
    die "--delay $DELAY needs the kernel's netem qdisc, and this kernel is built without it (CONFIG_NET_SCH_NETEM is not set in /proc/config.gz); run on a kernel with sch_netem, or without --delay"
  fi
  if [ -e "$STATE_FILE" ] || ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "a cluster is already up (state in $STATE_DIR or bridge $BRIDGE exists); run '$me down' first"
  fi
  if ip netns list | awk '{print $1}' | grep -qE "^${PREFIX}[0-9]+$"; then
    die "namespaces named ${PREFIX}N already exist (ip netns list); run '$me down' first or choose another --prefix"
  fi
  # An address already in use elsewhere on this machine would make routing ambiguous.
  if ip -o -4 addr show | grep -q " inet $base\."; then
    die "subnet $SUBNET is already used by an interface here; choose another with --subnet"
  fi

  # tbf: burst = 1 ms worth of RATE, at least 64 KiB (veth hands tbf GSO packets of up to
  # 64 KiB; a smaller bucket makes tbf split them in software), so the token refill granularity
  # does not throttle below RATE. latency 10 ms: the queue holds 10 ms of traffic before
  # dropping, enough for TCP to keep the link full without losses.
  burst=$((bits / 8 / 1000))
  [ "$burst" -ge 65536 ] || burst=65536

  mkdir -p "$STATE_DIR"
  # From here on, any exit before the end (a failed command under set -e, die, ^C) removes
  # whatever was made.
  trap 'say "up failed; removing what was made"; cmd_down >/dev/null 2>&1 || true' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  printf 'K=%s\nRATE=%s\nDELAY=%s\nSUBNET=%s\nPREFIX=%s\n' "$K" "$RATE" "$DELAY" "$SUBNET" "$PREFIX" >"$STATE_FILE"

  ip link add "$BRIDGE" type bridge
  ip addr add "$base.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up

  local i node hostsblock=""
  : >"$HOSTFILE"
  for ((i = 1; i <= K; i++)); do
    node=$PREFIX$i
    ip netns add "$node"
    ip -n "$node" link set lo up
    ip link add "${node}h" type veth peer name "${node}n"
    ip link set "${node}n" netns "$node"
    ip -n "$node" link set "${node}n" name eth0
    ip -n "$node" addr add "$base.$i/24" dev eth0
    ip -n "$node" link set eth0 up
    ip link set "${node}h" master "$BRIDGE"
    ip link set "${node}h" up
    # Egress of the node's eth0 = the node's outgoing link.
    # With --delay, netem holds each packet DELAY and hands it to the tbf below it, so a packet
    # waits the delay plus its turn on the wire. netem's limit (packets) is set far above what
    # DELAY x RATE holds, so that it never drops.
    if [ "$DELAY" = 0 ]; then
      tc -n "$node" qdisc add dev eth0 root tbf rate "$RATE" burst "$burst" latency 10ms
    else
      tc -n "$node" qdisc add dev eth0 root handle 1: netem delay "$DELAY" limit 1000000
      tc -n "$node" qdisc add dev eth0 parent 1:1 handle 10: tbf rate "$RATE" burst "$burst" latency 10ms
    fi
    echo "$node slots=1" >>"$HOSTFILE"
    hostsblock+="$base.$i $node $HOSTS_MARK"$'\n'
  done
  # /etc/hosts may be a bind mount (containers): rewrite it in place, never replace the file.
  printf '%s' "$hostsblock" >>/etc/hosts

  write_agent
  trap - EXIT INT TERM
  say "up: $K nodes ${PREFIX}1..$PREFIX$K on $SUBNET (bridge $BRIDGE $base.254), each node's outgoing link limited to $RATE, delay $DELAY (tbf burst $burst B, latency 10ms)"
  echo "$HOSTFILE"
}

# The rsh agent Open MPI calls as `AGENT [options] HOST COMMAND...`, the way it would call ssh.
# Like ssh, it joins COMMAND's words with spaces and hands the line to a shell (Open MPI quotes
# for that shell: the HNP URI arrives as "...;tcp://..." with its quotes in the word), here a
# shell inside namespace HOST. The environment is inherited unchanged (unlike ssh's login
# environment), so orted finds the same PATH and LD_LIBRARY_PATH as mpirun. `unshare --uts`
# gives each node its own hostname (HOST), so MPI_Get_processor_name and Open MPI's per-host
# session directories tell the nodes apart.
write_agent() {
  cat >"$AGENT" <<'EOF'
#!/bin/sh
# rsh agent for Open MPI (written by scripts/netns_cluster.sh): called as
# `rsh-agent [ssh-style options] HOST COMMAND...`; runs COMMAND in network namespace HOST with
# hostname HOST, through sh -c, with the caller's environment.
while [ $# -gt 0 ]; do
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # ssh options that take a value
    -*) shift ;;                        # flags such as -x (no X11 forwarding)
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "rsh-agent: usage: rsh-agent [options] HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
if ! ip netns list | grep -q "^$host\( \|$\)"; then
  echo "rsh-agent: no network namespace named '$host' (is the netns cluster up?)" >&2
  exit 255
fi
# shellcheck disable=SC2016  # $1 and $2 belong to the inner shell
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$1" && exec sh -c "$2"' rsh-agent "$host" "$*"
EOF
  chmod 755 "$AGENT"
}

# tidy_netns_dir (undoing /run/netns once it is empty) is in netns_lib.sh.
# shellcheck source=scripts/netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"

# ---- down ----
cmd_down() {
  need_root_tools
  local prefix=$DEFAULT_PREFIX ns
  if [ -r "$STATE_FILE" ]; then
    prefix=$(sed -n 's/^PREFIX=//p' "$STATE_FILE")
    [ -n "$prefix" ] || prefix=$DEFAULT_PREFIX
  fi
  # Every namespace PREFIX<number>, not only 1..K, so a half-made cluster goes too. Deleting a
  # namespace deletes its veth end, which deletes the peer on the bridge.
  # A process still inside would keep its namespace (and veth) alive after the delete: stop
  # those first (an orted or rank left by a killed mpirun), TERM, then KILL after 2 s.
  local nslist pids=() pid tries alive
  nslist=$(ip netns list | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" || true)
  for ns in $nslist; do
    mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2>/dev/null)
  done
  if [ ${#pids[@]} -gt 0 ]; then
    say "down: stopping processes left in the namespaces: ${pids[*]}"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((tries = 0; tries < 20; tries++)); do
      alive=""
      for pid in "${pids[@]}"; do
        ! kill -0 "$pid" 2>/dev/null || alive=1
      done
      [ -n "$alive" ] || break
      sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  for ns in $nslist; do
    ip netns delete "$ns"
  done
  # Host ends whose namespace end never moved (failure between the two steps).
  for ns in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${prefix}[0-9]+[hn]$" || true); do
    ip link delete "$ns" 2>/dev/null || true
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link delete "$BRIDGE"
  fi
  if grep -qF "$HOSTS_MARK" /etc/hosts; then
    local kept
    kept=$(grep -vF "$HOSTS_MARK" /etc/hosts || true)
    printf '%s\n' "$kept" >/etc/hosts
  fi
  rm -rf "$STATE_DIR"
  tidy_netns_dir
  say "down: no ${prefix}N namespaces, no bridge $BRIDGE, no marked /etc/hosts lines"
}

# ---- mpirun-args ----
cmd_mpirun_args() {
  [ -r "$STATE_FILE" ] || die "no cluster is up (no $STATE_FILE); run '$me up K' first"
  local subnet
  subnet=$(sed -n 's/^SUBNET=//p' "$STATE_FILE")
  echo "--hostfile $HOSTFILE"
  echo "--mca plm_rsh_agent $AGENT"
  # mpirun launches every daemon itself (no daemon launching daemons through the agent).
  echo "--mca plm_rsh_no_tree_spawn 1"
  echo "--mca oob_tcp_if_include $subnet"
  echo "--mca btl_tcp_if_include $subnet"
  # TCP only: no shared memory between ranks, every byte crosses the emulated wire.
  echo "--mca btl self,tcp"
  echo "--mca pml ob1"
  # Every node sees all of this machine's cores and would bind its first rank to core 0, so
  # the ranks of all nodes would share one core. Leave placement to the kernel.
  echo "--bind-to none"
  [ "$(id -u)" -ne 0 ] || echo "--allow-run-as-root"
}

# ---- check ----
cmd_check() {
  local why="" ns="rtcheck$$"
  if [ "$(id -u)" -ne 0 ]; then
    why="not root (network namespaces need root)"
  elif ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    why="the 'ip' and 'tc' commands are missing (install iproute2)"
  elif ! command -v unshare >/dev/null; then
    why="the 'unshare' command is missing (install util-linux)"
  elif [ ! -w /etc/hosts ]; then
    why="/etc/hosts is not writable"
  elif ! err=$(ip netns add "$ns" 2>&1); then
    why="cannot create a network namespace: $err"
  else
    # Everything `up` uses, tried inside the throwaway namespace so nothing touches the host.
    if ! err=$( { ip netns exec "$ns" unshare --uts sh -c 'hostname rtcheck' &&
                  ip -n "$ns" link add rtcheckbr type bridge &&
                  ip -n "$ns" link add rtchecka type veth peer name rtcheckb &&
                  ip -n "$ns" link set rtchecka up &&
                  tc -n "$ns" qdisc add dev rtchecka root tbf rate 1gbit burst 131072 latency 10ms; } 2>&1); then
      why="namespace made, but a bridge, veth pair, tbf qdisc or 'ip netns exec' failed: $err"
    fi
    ip netns delete "$ns" 2>/dev/null || true
    tidy_netns_dir
  fi
  if [ -n "$why" ]; then
    echo "$me: cannot emulate a cluster here: $why"
    exit 1
  fi
  echo "$me: network namespaces, veth, bridge and tbf work here"
}

# ---- run ----
run_cleanup() {
  "${SELF[@]}" down >/dev/null 2>&1 || say "down failed; run '$me down' by hand"
}
cmd_run() {
  parse_up_args "$@"
  [ ${#REST[@]} -ge 1 ] || die "run needs a command after '--' (e.g. '$me run 2 -- mpirun ...')"
  local up_args=("$K" --rate "$RATE" --subnet "$SUBNET" --prefix "$PREFIX")
  local cmd=("${REST[@]}")
  "${SELF[@]}" up "${up_args[@]}" >/dev/null || die "could not bring the cluster up"
  trap run_cleanup EXIT
  RINGTRAIN_NETNS_MPIRUN_ARGS=$("${SELF[@]}" mpirun-args | tr '\n' ' ')
  export RINGTRAIN_NETNS_MPIRUN_ARGS
  # The command runs in the background so that a TERM or ^C reaches this script at once (bash
  # runs traps only between commands): it is passed on as TERM (a background command ignores
  # INT), the command is waited for, then the EXIT trap takes the cluster down. `<&0` keeps
  # stdin, which bash would otherwise point at /dev/null for a background command.
  local child status signalled=""
  trap 'signalled=130; kill -TERM "$child" 2>/dev/null' INT
  trap 'signalled=143; kill -TERM "$child" 2>/dev/null' TERM
  "${cmd[@]}" <&0 &
  child=$!
  while :; do
    status=0
    wait "$child" || status=$?
    kill -0 "$child" 2>/dev/null || break  # wait returned because of a signal: wait again
  done
  exit "${signalled:-$status}"
}

[ $# -ge 1 ] || usage
sub=$1
shift
case $sub in
  up) cmd_up "$@" ;;
  down) [ $# -eq 0 ] || die "down takes no arguments"; cmd_down ;;
  mpirun-args) [ $# -eq 0 ] || die "mpirun-args takes no arguments"; cmd_mpirun_args ;;
  check) [ $# -eq 0 ] || die "check takes no arguments"; cmd_check ;;
  run) cmd_run "$@" ;;
  -h | --help | help) usage ;;
  *) die "unknown subcommand '$sub' (expected up, down, mpirun-args, check or run)" ;;
esac
