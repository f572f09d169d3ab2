#!/usr/bin/env bash
# The benchmarks' check of their PyTorch peer's BLAS (scripts/peer_blas.py, scripts/peer_blas.sh),
# without torch and without touching the machine's BLAS: the classification of library paths
# (netlib's reference BLAS, OpenBLAS, MKL, BLIS, ATLAS, unknown), the reading of
# /proc/self/maps in a process that loaded libblas.so.3, and scripts/bench_speed.sh and
# scripts/bench_scaling.sh refusing a verdict (exit 3, before any build or timing) when
# RINGTRAIN_PEER_BLAS says the peer maps the reference BLAS. Nothing is installed
# (RINGTRAIN_PEER_BLAS and PEER_BLAS_INSTALL=0 both forbid it). A few seconds.
# Usage: tests/peer_blas_test.sh      exit 0 pass, 1 fail, 77 skipped (no /usr/bin/python3)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=/usr/bin/python3
export PYTHONDONTWRITEBYTECODE=1   # leave no __pycache__ in scripts/
[[ -x "$PY" ]] || { echo "SKIP: no $PY (the benchmarks' peer interpreter)"; exit 77; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect_kind KIND PATH: scripts/peer_blas.py classify PATH says KIND
expect_kind() {
  local got
  got="$("$PY" "$ROOT/scripts/peer_blas.py" classify "$2" | cut -f1)"
  if [[ "$got" == "$1" ]]; then pass "classify $2: $got"; else fail "classify $2: got '$got', want '$1'"; fi
}

# ---- classification, on files laid out as Debian lays them out (fake files, no real libraries) ----
L="$TMP/usr/lib/x86_64-linux-gnu"
mkdir -p "$L/blas" "$L/openblas-openmp" "$L/openblas-pthread" "$L/blis-openmp" "$L/atlas" "$TMP/etc"
: >"$L/blas/libblas.so.3.11.0"
ln -s libblas.so.3.11.0 "$L/blas/libblas.so.3"
: >"$L/openblas-openmp/libblas.so.3"
: >"$L/openblas-openmp/libopenblaso-r0.3.21.so"
: >"$L/openblas-pthread/libopenblasp-r0.3.21.so"
: >"$L/libmkl_rt.so.2"
: >"$L/blis-openmp/libblas.so.3"
: >"$L/atlas/libblas.so.3.10.3"
: >"$L/libfooblas.so.1"
# libblas.so.3 -> /etc/alternatives/libblas.so.3-x86_64-linux-gnu -> the implementation
ln -s "$L/blas/libblas.so.3" "$TMP/etc/libblas.so.3-x86_64-linux-gnu"
ln -s "$TMP/etc/libblas.so.3-x86_64-linux-gnu" "$L/libblas.so.3"

expect_kind reference /usr/lib/x86_64-linux-gnu/blas/libblas.so.3   # the real path, as named
expect_kind reference "$L/blas/libblas.so.3"
expect_kind reference "$L/libblas.so.3"                   # through the alternatives links
expect_kind openblas /usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
expect_kind openblas "$L/openblas-openmp/libopenblaso-r0.3.21.so"
expect_kind openblas "$L/openblas-pthread/libopenblasp-r0.3.21.so"
expect_kind mkl "$L/libmkl_rt.so.2"
expect_kind blis "$L/blis-openmp/libblas.so.3"
expect_kind atlas "$L/atlas/libblas.so.3.10.3"
expect_kind unknown "$L/libfooblas.so.1"
ln -sfn "$L/openblas-openmp/libblas.so.3" "$TMP/etc/libblas.so.3-x86_64-linux-gnu"
expect_kind openblas "$L/libblas.so.3"                    # the alternative switched to OpenBLAS

# ---- probe with the override: its exit status and kind ----
# expect_probe STATUS KIND PATHS
expect_probe() {
  local out rc=0
  out="$(RINGTRAIN_PEER_BLAS="$3" "$PY" "$ROOT/scripts/peer_blas.py" probe 2>&1)" || rc=$?
  if [[ "$rc" == "$1" && "$out" == *"kind=$2"* && "$out" == *"override"* ]]; then
    pass "probe, RINGTRAIN_PEER_BLAS=$3: exit $rc, kind=$2"
  else
    fail "probe, RINGTRAIN_PEER_BLAS=$3: exit $rc (want $1), output: $out"
  fi
}
expect_probe 3 reference "$L/blas/libblas.so.3"
expect_probe 0 openblas "$L/openblas-openmp/libblas.so.3:$L/openblas-openmp/libopenblaso-r0.3.21.so"
expect_probe 0 mkl "$L/libmkl_rt.so.2"
expect_probe 4 atlas "$L/atlas/libblas.so.3.10.3"
expect_probe 4 unknown "$L/libfooblas.so.1"

# ---- /proc/self/maps of a real process: dlopen libblas.so.3 (whatever the machine's
# alternative is) and the mapped file must be its real path, classified as the link is ----
if [[ -e /usr/lib/x86_64-linux-gnu/libblas.so.3 ]]; then
  want="$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)"
  got="$("$PY" - "$ROOT/scripts" <<'EOF' 2>&1
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import peer_blas
ctypes.CDLL("libblas.so.3")
rep = peer_blas.report(peer_blas.mapped_blas_libs())
print(rep["kind"], *rep["libs"])
EOF
)"
  want_kind="$("$PY" "$ROOT/scripts/peer_blas.py" classify "$want" | cut -f1)"
  if [[ " $got " == *" $want "* && "$got" == "$want_kind "* ]]; then
    pass "maps of a process that loaded libblas.so.3: $got"
  else
    fail "maps of a process that loaded libblas.so.3: got '$got', want $want_kind with $want"
  fi
else
  echo "skip maps check: no /usr/lib/x86_64-linux-gnu/libblas.so.3 on this machine"
fi

# ---- the benchmarks refuse a verdict on the reference BLAS, before building or timing ----
# expect_refusal NAME COMMAND...: exit 3, REFUSED and the finding on stderr, no report written
expect_refusal() {
  local name="$1" rc=0
  shift
  rm -f "$TMP/out.md"
  RINGTRAIN_PEER_BLAS="$L/blas/libblas.so.3" PEER_BLAS_INSTALL=0 BENCH_OUT="$TMP/out.md" \
    BUILD_DIR="$TMP/no-build" timeout 60 "$@" >"$TMP/stdout" 2>"$TMP/stderr" || rc=$?
  if [[ "$rc" == 3 ]] && grep -q 'REFUSED' "$TMP/stderr" && grep -q 'no verdict' "$TMP/stderr" &&
    grep -q 'peer BLAS check: reference' "$TMP/stderr" && ! grep -qE '\| (yes|no) \||: (not )?met' \
      "$TMP/stdout" "$TMP/stderr" && [[ ! -e "$TMP/out.md" && ! -e "$TMP/no-build" ]]; then
    pass "$name refuses a verdict on the reference BLAS (exit 3, nothing built or written)"
  else
    fail "$name on the reference BLAS: exit $rc (want 3); stderr:"
    sed 's/^/     /' "$TMP/stderr" | tail -n 20
  fi
}
expect_refusal "bench_speed.sh BENCH_CHECK_ONLY=1" env BENCH_CHECK_ONLY=1 bash "$ROOT/scripts/bench_speed.sh"
expect_refusal "bench_speed.sh (full run)" bash "$ROOT/scripts/bench_speed.sh"
expect_refusal "bench_scaling.sh" env SKIP_NET=1 bash "$ROOT/scripts/bench_scaling.sh"

# ---- and accept OpenBLAS in check-only mode, printing the finding ----
rc=0
RINGTRAIN_PEER_BLAS="$L/openblas-openmp/libblas.so.3" PEER_BLAS_INSTALL=0 BENCH_CHECK_ONLY=1 \
  BENCH_OUT="$TMP/out.md" timeout 60 bash "$ROOT/scripts/bench_speed.sh" >"$TMP/stdout" 2>"$TMP/stderr" || rc=$?
if [[ "$rc" == 0 ]] && grep -q 'peer BLAS check: openblas' "$TMP/stderr" &&
  grep -q 'peer BLAS accepted (openblas); no timing' "$TMP/stderr" && [[ ! -e "$TMP/out.md" ]]; then
  pass "bench_speed.sh BENCH_CHECK_ONLY=1 accepts OpenBLAS and times nothing"
else
  fail "bench_speed.sh BENCH_CHECK_ONLY=1 on OpenBLAS: exit $rc (want 0); stderr:"
  sed 's/^/     /' "$TMP/stderr" | tail -n 20
fi

# ---- the set-up path, with a stand-in torch and apt-get: no override, so the probe imports
# "torch" (a module that maps the file named in $TMP/state, as a real one maps libblas.so.3),
# finds the reference BLAS, installs libopenblas0-openmp (the fake apt-get switches the state
# file when FAKE_APT_FIXES=1) and probes again ----
mkdir -p "$TMP/fakepy/torch" "$TMP/fakebin"
printf 'fake BLAS library' >"$L/blas/libblas.so.3.11.0"
printf 'fake BLAS library' >"$L/openblas-openmp/libblas.so.3"
cat >"$TMP/fakepy/torch/__init__.py" <<'PYEOF'
"""A stand-in for torch (tests/peer_blas_test.sh): maps the file named in $FAKE_TORCH_STATE."""
import mmap
import os

with open(open(os.environ["FAKE_TORCH_STATE"]).read().strip(), "rb") as _f:
    _mapped = mmap.mmap(_f.fileno(), 0, prot=mmap.PROT_READ)
__version__ = "0.0-fake"


class _Tensor:
    def __matmul__(self, other):
        return self

    def sum(self):
        return self

    def item(self):
        return 0.0


def ones(*shape):
    return _Tensor()


def get_num_threads():
    return 1


class __config__:  # noqa: N801 (torch's name)
    @staticmethod
    def show():
        return "  - BLAS_INFO=generic, LAPACK_INFO=generic\n"
PYEOF
cat >"$TMP/fakebin/apt-get" <<'SHEOF'
#!/usr/bin/env bash
echo "apt-get $*" >>"$FAKE_APT_LOG"
[[ "${FAKE_APT_FIXES:-0}" != 1 || "$1" != install ]] || echo "$FAKE_APT_FIXED" >"$FAKE_TORCH_STATE"
SHEOF
printf '#!/bin/sh\nexec "$@"\n' >"$TMP/fakebin/sudo"
chmod +x "$TMP/fakebin/apt-get" "$TMP/fakebin/sudo"

# setup_run FIXES INSTALL: bench_speed.sh BENCH_CHECK_ONLY=1 with the stand-ins; sets rc
setup_run() {
  echo "$L/blas/libblas.so.3" >"$TMP/state"
  : >"$TMP/apt.log"
  rc=0
  env -u RINGTRAIN_PEER_BLAS PATH="$TMP/fakebin:$PATH" PYTHONPATH="$TMP/fakepy" \
    FAKE_TORCH_STATE="$TMP/state" FAKE_APT_LOG="$TMP/apt.log" FAKE_APT_FIXES="$1" \
    FAKE_APT_FIXED="$L/openblas-openmp/libblas.so.3" PEER_BLAS_INSTALL="$2" BENCH_CHECK_ONLY=1 \
    BENCH_OUT="$TMP/out.md" timeout 60 bash "$ROOT/scripts/bench_speed.sh" >"$TMP/stdout" 2>"$TMP/stderr" || rc=$?
}
setup_run 1 1
if [[ "$rc" == 0 ]] && grep -q 'install.*libopenblas0-openmp' "$TMP/apt.log" &&
  grep -q 'peer BLAS check: reference: .*/blas/libblas.so.3.11.0; threads: torch 1' "$TMP/stderr" &&
  grep -q 'peer BLAS check, after the install: openblas: ' "$TMP/stderr"; then
  pass "on the reference BLAS bench_speed.sh installs libopenblas0-openmp, checks again, accepts"
else
  fail "set-up of the peer's BLAS: exit $rc (want 0); apt-get: $(cat "$TMP/apt.log"); stderr:"
  sed 's/^/     /' "$TMP/stderr" | tail -n 20
fi
setup_run 0 1
if [[ "$rc" == 3 ]] && grep -q 'install.*libopenblas0-openmp' "$TMP/apt.log" &&
  grep -q 'after the install: reference' "$TMP/stderr" && grep -q 'REFUSED' "$TMP/stderr"; then
  pass "an install that leaves the reference BLAS in place: refused (exit 3)"
else
  fail "an install that does not help: exit $rc (want 3); stderr:"
  sed 's/^/     /' "$TMP/stderr" | tail -n 20
fi
setup_run 1 0
if [[ "$rc" == 3 && ! -s "$TMP/apt.log" ]] && grep -q 'PEER_BLAS_INSTALL=0' "$TMP/stderr"; then
  pass "PEER_BLAS_INSTALL=0: nothing installed, refused (exit 3)"
else
  fail "PEER_BLAS_INSTALL=0: exit $rc (want 3), apt-get: $(cat "$TMP/apt.log")"
fi

if [[ "$failures" -ne 0 ]]; then
  echo "peer_blas_test: $failures FAILED"
  exit 1
fi
echo "peer_blas_test: all passed"
