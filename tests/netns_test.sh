#!/usr/bin/env bash
# The emulated cluster network (scripts/netns_cluster.sh) carries real MPI traffic: 2 ranks in
# 2 network namespaces linked at 1 Gbit/s run allreduce_bench at 16 MiB with both backends;
# the run must be correct (#wrong 0), each rank must sit on its own node, and the algbw must be
# below 0.2 GB/s (the link carries at most 0.125 GB/s each way; over shared memory the same run
# shows 1-3 GB/s), which proves the bytes crossed the rate-limited veth links. Afterwards
# nothing of the cluster may be left: no namespaces, no bridge, no /etc/hosts lines.
# Needs root and iproute2; without them it prints "SKIPPED: why" and exits 77 (ctest: skipped).
# Also, without root: --delay's netem probe on made-up kernel configurations.
# Usage: netns_test.sh MPIEXEC PATH/TO/allreduce_bench
set -uo pipefail
mpiexec=$1
bench=$2
cluster="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/netns_cluster.sh"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# --delay's netem probe under pipefail, on made-up kernel configurations (no root needed): a
# config that has netem (its line deep in a long file, where a pipe into grep -q would fail),
# one without, and one that cannot be read (then up tries tc itself).
probe() {  # probe CONFIG_TEXT_COMMAND: "missing" or "present"
  bash -c 'set -o pipefail; source <(sed -n "/^netem_missing()/,/^}/p" "$1")
    made_up=$2; zcat() { eval "$made_up"; }; netem_missing && echo missing || echo present' probe "$cluster" "$1"
}
[ "$(probe 'seq 1 100000; echo CONFIG_NET_SCH_NETEM=y; seq 1 100000')" = present ] ||
  fail "netem_missing: a config with CONFIG_NET_SCH_NETEM=y read as missing"
[ "$(probe 'seq 1 1000; echo "# CONFIG_NET_SCH_NETEM is not set"')" = missing ] ||
  fail "netem_missing: a config without netem read as present"
[ "$(probe 'return 1')" = present ] || fail "netem_missing: an unreadable config read as missing"
out=$(bash "$cluster" up 2 --delay 1x 2>&1) && fail "up --delay 1x exited 0"
grep -qF -- "--delay must be 0 or a number" <<<"$out" || fail "up --delay 1x: $out"

if ! why=$(bash "$cluster" check 2>&1); then
  [ "$failures" -eq 0 ] || { echo "$failures failure(s) before the cluster part"; exit 1; }
  echo "SKIPPED: ${why#netns_cluster.sh: }"
  exit 77
fi
if [ -e /tmp/ringtrain-netns ]; then
  echo "FAIL: a netns cluster is already up (/tmp/ringtrain-netns exists); run '$cluster down' if it is stale"
  exit 1
fi
# If this script is killed (ctest timeout), still take the cluster down.
trap 'bash "$cluster" down >/dev/null 2>&1' EXIT

# ---- across 2 nodes at 1 Gbit/s ----
out=$(bash "$cluster" run 2 --rate 1gbit -- bash -c \
        'timeout 240 "$0" $RINGTRAIN_NETNS_MPIRUN_ARGS -np 2 "$1" -b 16M -e 16M -n 3 -w 1 -c 1 --backend both' \
        "$mpiexec" "$bench" 2>&1)
status=$?
echo "$out"
[ "$status" -eq 0 ] || fail "the run across the namespaces exited $status"

grep -qE '^# +rank +0 .* on rtnode1$' <<<"$out" || fail "rank 0 did not run on rtnode1"
grep -qE '^# +rank +1 .* on rtnode2$' <<<"$out" || fail "rank 1 did not run on rtnode2"

# Rows: size count type redop backend time algbw busbw #wrong
for backend in ring mpi; do
  row=$(awk -v b="$backend" '$1 == 16777216 && $5 == b' <<<"$out")
  if [ -z "$row" ]; then
    fail "no 16 MiB row for backend $backend"
    continue
  fi
  read -r _ _ _ _ _ _ algbw _ wrong <<<"$row"
  [ "$wrong" = "0" ] || fail "$backend: #wrong is '$wrong', expected 0"
  if ! awk -v a="$algbw" 'BEGIN { exit !(a > 0 && a < 0.2) }'; then
    fail "$backend: algbw $algbw GB/s is not in (0, 0.2): the traffic did not cross the 1 Gbit/s links"
  else
    echo "ok: $backend algbw $algbw GB/s at 16 MiB over 1 Gbit/s links (line rate 0.125 GB/s)"
  fi
done

# ---- nothing left behind; down again is harmless; no cluster means no mpirun-args ----
leftover=$(ip netns list | awk '{print $1}' | grep -E '^rtnode[0-9]+$')
[ -z "$leftover" ] || fail "namespaces left after down: $leftover"
! ip link show rtbr0 >/dev/null 2>&1 || fail "bridge rtbr0 left after down"
! grep -qF '# ringtrain-netns' /etc/hosts || fail "/etc/hosts still has ringtrain-netns lines"
[ ! -e /tmp/ringtrain-netns ] || fail "/tmp/ringtrain-netns left after down"
bash "$cluster" down >/dev/null 2>&1 || fail "a second down did not exit 0"
if bash "$cluster" mpirun-args >/dev/null 2>&1; then
  fail "mpirun-args exited 0 with no cluster up"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "netns_test: all checks passed"
