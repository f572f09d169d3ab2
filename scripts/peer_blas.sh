# shellcheck shell=bash
# Sourced by the benchmarks that time a PyTorch peer on the CPU (scripts/bench_speed.sh,
# scripts/bench_scaling.sh): the peer's BLAS is checked before any timing.
#
#   peer_blas_check TAG
#     Runs scripts/peer_blas.py probe under /usr/bin/python3 (the peer's interpreter) with the
#     caller's environment (its thread settings), and logs what the torch process mapped.
#     An optimized BLAS (OpenBLAS, MKL, BLIS): sets PEER_BLAS (one line: kind, real library
#     paths, threads) and PEER_BLAS_KIND, returns 0.
#     The reference BLAS (netlib) or anything else: sets the peer up as its users would
#     (apt-get install libopenblas0-openmp, which outranks libblas3 in update-alternatives),
#     probes again, and if the peer is still not on an optimized BLAS prints why and what to
#     do, and exits 3: no verdict.  No torch at all: exits 3 as well.
#   Environment:
#     PEER_BLAS_INSTALL=0          never install; refuse at once
#     PEER_BLAS_PACKAGE=libopenblas0-openmp   what to install (libopenblas0-pthread also works)
#     RINGTRAIN_PEER_BLAS=PATH[:PATH...]      pretend the peer maps these files (torch is not
#                                  imported, nothing is installed): tests/peer_blas_test.sh.
#                                  The timed PyTorch runs still report what they really
#                                  mapped, and the benchmark checks that too (peer_blas_recheck).
#
#   peer_blas_recheck TAG KIND DESC
#     For a timed run's own report (its summary's blas_kind and blas): exits 3 unless KIND is
#     an optimized BLAS.

PEER_BLAS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEER_BLAS_OPTIMIZED=" openblas mkl blis "

_peer_blas_log() { echo "[$1] $2" >&2; }

# _peer_blas_probe: sets _pb_rc, _pb_kind, _pb_desc
_peer_blas_probe() {
  local out
  _pb_rc=0
  out="$(/usr/bin/python3 "$PEER_BLAS_DIR/peer_blas.py" probe 2>&1)" || _pb_rc=$?
  _pb_kind="$(sed -n 's/^kind=//p' <<<"$out" | head -n1)"
  _pb_desc="$(sed -n 's/^desc=//p' <<<"$out" | head -n1)"
  if [[ -z "$_pb_kind" ]]; then
    _pb_kind=error
    _pb_desc="scripts/peer_blas.py probe failed (exit $_pb_rc): $(tail -n 3 <<<"$out" | tr '\n' ' ')"
  fi
}

# _peer_blas_install TAG: installs $PEER_BLAS_PACKAGE; 1 if it could not
_peer_blas_install() {
  local tag="$1" pkg="${PEER_BLAS_PACKAGE:-libopenblas0-openmp}" sudo=()
  if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null || { _peer_blas_log "$tag" "peer BLAS: need root or sudo to install $pkg"; return 1; }
    sudo=(sudo)
  fi
  _peer_blas_log "$tag" "peer BLAS: installing $pkg"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >&2 ||
    { "${sudo[@]}" apt-get update -q >&2 &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >&2; }
}

_peer_blas_refuse() {
  local tag="$1" kind="$2" desc="$3" alt
  alt="$( (cd /etc/alternatives 2>/dev/null && compgen -G 'libblas.so.3-*' | head -n1) || true)"
  {
    echo "[$tag] REFUSED: the PyTorch peer is not on an optimized BLAS (OpenBLAS, MKL or BLIS); no verdict."
    echo "[$tag]   found: $desc"
    if [[ "$kind" == no-torch || "$kind" == error ]]; then
      echo "[$tag]   /usr/bin/python3 cannot run torch. Fix: apt-get install python3-torch libopenblas0-openmp"
    else
      [[ "$kind" != reference ]] ||
        echo "[$tag]   That is netlib's reference BLAS (libblas3): PyTorch's matmuls run several times slower" \
          "than on OpenBLAS, and a ratio against it says nothing about ringtrain."
      echo "[$tag]   Fix: apt-get install libopenblas0-openmp (or libopenblas0-pthread); if libblas.so.3 still"
      echo "[$tag]   resolves to another BLAS, its alternative is set by hand:"
      echo "[$tag]   update-alternatives --display ${alt:-libblas.so.3-<triplet>} shows it, and"
      echo "[$tag]   update-alternatives --auto ${alt:-libblas.so.3-<triplet>} (as root) picks the best one."
    fi
  } >&2
  exit 3
}

peer_blas_check() {
  local tag="$1"
  _peer_blas_probe
  _peer_blas_log "$tag" "peer BLAS check: $_pb_desc"
  if [[ "$PEER_BLAS_OPTIMIZED" != *" $_pb_kind "* && "$_pb_kind" != no-torch ]]; then
    if [[ -n "${RINGTRAIN_PEER_BLAS:-}" ]]; then
      _peer_blas_log "$tag" "peer BLAS: RINGTRAIN_PEER_BLAS is set: not installing anything"
    elif [[ "${PEER_BLAS_INSTALL:-1}" == "0" ]]; then
      _peer_blas_log "$tag" "peer BLAS: PEER_BLAS_INSTALL=0: not installing anything"
    elif _peer_blas_install "$tag"; then
      _peer_blas_probe
      _peer_blas_log "$tag" "peer BLAS check, after the install: $_pb_desc"
    fi
  fi
  [[ "$PEER_BLAS_OPTIMIZED" == *" $_pb_kind "* ]] || _peer_blas_refuse "$tag" "$_pb_kind" "$_pb_desc"
  # shellcheck disable=SC2034  # the caller's
  PEER_BLAS_KIND="$_pb_kind" PEER_BLAS="$_pb_desc"
}

peer_blas_recheck() {
  local tag="$1" kind="$2" desc="$3"
  [[ "$PEER_BLAS_OPTIMIZED" == *" $kind "* ]] || _peer_blas_refuse "$tag" "${kind:-unknown}" "a timed PyTorch run reported: ${desc:-nothing}"
}
