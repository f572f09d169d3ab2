# shellcheck shell=bash
# Shared by the tests of the plotting scripts (plot_metrics_test.sh, plot_scaling_test.sh);
# sourced after the caller has set python (the interpreter), plot (the script), and pass/fail.
#  - plot_run NAME args...: the plot script under a timeout; exit status in $status, output in
#    NAME.out;
#  - refused WHAT TEXT: passes when the last plot_run (named by $last) exited non-zero, its
#    output names TEXT and no PNG (nor a temporary of one) is left in the current directory.
plot_run() {
  local name=$1
  shift
  timeout -k 5 120 "$python" "$plot" "$@" </dev/null >"$name.out" 2>&1
  status=$?
}
refused() {
  if [ "$status" -ne 0 ] && grep -qF -- "$2" "$last.out" && ! ls ./*.png ./.*.png* >/dev/null 2>&1
  then
    pass "$1: $(grep -F -- "$2" "$last.out" | head -n 1)"
  else
    fail "$1 (exit $status, want non-zero naming '$2', no PNG): $(cat "$last.out")"
  fi
  rm -f ./*.png ./.*.png*
}
