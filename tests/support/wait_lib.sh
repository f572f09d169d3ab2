# wait_for FILE REGEX SECONDS: returns 0 as soon as a line of FILE matches REGEX (grep -E), 1
# when SECONDS have passed without one. For tests that act on a background job's log.
wait_for() {
  local tries
  for ((tries = 0; tries < $3 * 10; tries++)); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
