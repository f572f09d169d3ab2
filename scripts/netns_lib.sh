# shellcheck shell=bash
# Shared by the scripts that make network namespaces (scripts/netns_cluster.sh,
# tests/ringrun_test.sh); sourced.
#
# tidy_netns_dir: `ip netns add` makes /run/netns (a bind mount onto itself) on first use; once
# no namespace is left in it, undo that too, so that the machine is as before.
tidy_netns_dir() {
  local dir=/run/netns
  [ -d "$dir" ] && [ -z "$(ls -A "$dir")" ] || return 0
  if grep -q " $dir " /proc/self/mountinfo; then
    umount "$dir" 2>/dev/null || return 0
  fi
  rmdir "$dir" 2>/dev/null || true
}
