#!/usr/bin/env bash
# Prepares a carry directory for scripts/gpu_check.sh on a GPU machine that has CUDA, cuDNN and
# NCCL (possibly only inside PyTorch's wheels) but lacks this project's other build
# dependencies, cannot reach a package registry, and may have no MPI. Run it HERE, on a Debian 12
# (bookworm) amd64 machine with apt (the build machine); then send the directory to the GPU
# machine together with the working tree and run scripts/gpu_check.sh there, which finds it at
# ./.gpu-carry or $RINGTRAIN_CARRY_DIR.
#
# What goes in (about 23 MB in all; measured sizes in DIR/MANIFEST):
#   debs/      Debian 12 packages, unpacked there with dpkg -x into a temporary root:
#              Open MPI 4.1.4 (libopenmpi-dev openmpi-bin libopenmpi3 openmpi-common and the
#              libraries libmpi.so.40 needs: libpmix2 libhwloc15 libevent-core-2.1-7
#              libevent-pthreads-2.1-7 libudev1), Eigen 3.4 (libeigen3-dev), spdlog 1.10 with
#              fmt 9 (libspdlog-dev libspdlog1.10 libfmt-dev libfmt9), CLI11 (libcli11-dev),
#              Catch2 v2 (catch2), zlib (zlib1g-dev zlib1g).  About 8 MB.
#   include/   the NCCL and cuDNN headers of this machine (/usr/local/cuda/include: nccl.h,
#              cudnn*.h), for a machine whose wheels ship the libraries without headers. <1 MB.
#   data/mnist the MNIST IDX .gz files (11.6 MB), so both sides of the benchmark train on MNIST.
#   bin/       with --bin BUILD: the GPU build's mnist_train, allreduce_bench,
#              ringtrain_gpu_tests and nccl_ring_test from BUILD (configure it with
#              -DRINGTRAIN_CUDA=ON -DRINGTRAIN_NATIVE=OFF: the GPU machine's CPU is not this
#              one's), and BUILT saying what they are. gpu_check.sh uses them when they load
#              and start there, and builds there otherwise: minutes of GPU-machine time saved.
# Left out on purpose: Open MPI's network plugins' libraries (UCX, libfabric, PSM, verbs; the
#   carried openmpi-mca-params.conf disables those plugins), hwloc's plugins (X11/OpenCL),
#   NCCL's and cuDNN's libraries themselves (hundreds of MB; gpu_check.sh takes them from the
#   system or from PyTorch's nvidia-* wheels).
#
# Usage: scripts/gpu_carry.sh [--dir DIR] [--no-data] [--data-dir MNIST_DIR] [--bin BUILD]
#   --dir DIR        where to write (default: .gpu-carry in the repository; git must ignore it)
#   --no-data        leave out data/mnist (gpu_check.sh then writes synthetic IDX files)
#   --data-dir D     MNIST .gz files from D (default: $RINGTRAIN_DATA, ../shared/data/mnist beside
#                    the checkout, data/mnist)
#   --bin BUILD      also the GPU programs from the build directory BUILD (see bin/ above)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/.gpu-carry"
WITH_DATA=1
DATA_DIR=""
BIN_FROM=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --no-data) WITH_DATA=0; shift ;;
    --data-dir) DATA_DIR="$2"; shift 2 ;;
    --bin) BIN_FROM="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_carry: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "[gpu_carry] $*" >&2; }

# The packages, one list: gpu_check.sh unpacks whatever .deb files it finds in debs/.
PACKAGES=(
  # MPI: headers + wrapper data, mpicxx/mpirun/orted, the libraries, help files and MCA defaults
  libopenmpi-dev openmpi-bin libopenmpi3 openmpi-common
  # what libmpi.so.40, libopen-rte.so.40, libopen-pal.so.40 and orted link
  libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libudev1
  # OpenMP's runtime, which the programs link (Eigen's threads), for a system without it
  libgomp1
  # what the prebuilt programs (--bin) link for --export-onnx
  libonnx1 libprotobuf32
  # header-only or small build dependencies of ringtrain
  libeigen3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev catch2
  zlib1g-dev zlib1g
)

command -v apt-get >/dev/null || { log "needs apt-get (Debian 12 amd64)"; exit 1; }
[[ "$(dpkg --print-architecture)" == amd64 ]] || { log "needs an amd64 machine (the GPU machine is x86-64)"; exit 1; }

mkdir -p "$DIR/debs" "$DIR/include"
rm -f "$DIR"/debs/*.deb
log "downloading ${#PACKAGES[@]} Debian packages into $DIR/debs"
(cd "$DIR/debs" && apt-get download "${PACKAGES[@]}" >/dev/null 2>"$DIR/debs/.apt.log") || {
  cat "$DIR/debs/.apt.log" >&2
  log "apt-get download failed (try apt-get update first)"
  exit 1
}
rm -f "$DIR/debs/.apt.log"
# Plain file names ('1%3a1.10.0+ds' -> '1_1.10.0_ds'): safe for any transfer tool.
for f in "$DIR"/debs/*.deb; do
  plain="$(basename "$f" | sed 's/%3a/_/g; s/[^A-Za-z0-9._-]/_/g')"
  [[ "$plain" == "$(basename "$f")" ]] || mv -f "$f" "$DIR/debs/$plain"
done

# NCCL and cuDNN headers: wherever this machine's CMake would find them.
hdr_dir=""
for d in "${CUDAToolkit_ROOT:-/usr/local/cuda}/include" /usr/local/cuda/include /usr/include /usr/local/include; do
  if [[ -f "$d/nccl.h" && -f "$d/cudnn.h" ]]; then hdr_dir="$d"; break; fi
done
if [[ -n "$hdr_dir" ]]; then
  rm -rf "$DIR/include"; mkdir -p "$DIR/include"
  cp -a "$hdr_dir"/nccl.h "$hdr_dir"/cudnn*.h "$DIR/include/"
  for extra in nccl_net.h nccl_device.h nccl_device; do
    [[ -e "$hdr_dir/$extra" ]] && cp -a "$hdr_dir/$extra" "$DIR/include/"
  done
  log "headers from $hdr_dir: NCCL $(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", s, $3; s="."}' "$DIR/include/nccl.h"), cuDNN $(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{printf "%s%s", s, $3; s="."}' "$DIR/include/cudnn_version.h")"
else
  log "warning: no nccl.h + cudnn.h found here; include/ stays empty"
fi

if [[ "$WITH_DATA" == 1 ]]; then
  if [[ -z "$DATA_DIR" ]]; then
    for d in "${RINGTRAIN_DATA:-}" "$ROOT/../shared/data/mnist" "$ROOT/data/mnist"; do
      if [[ -n "$d" && -f "$d/train-images-idx3-ubyte.gz" ]]; then DATA_DIR="$d"; break; fi
    done
  fi
  if [[ -n "$DATA_DIR" && -f "$DATA_DIR/train-images-idx3-ubyte.gz" ]]; then
    mkdir -p "$DIR/data/mnist"
    cp -f "$DATA_DIR"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$DIR/data/mnist/"
    log "MNIST from $DATA_DIR"
  else
    log "warning: no MNIST .gz files found; gpu_check.sh will use synthetic IDX files"
  fi
else
  rm -rf "$DIR/data"
fi

if [[ -n "$BIN_FROM" ]]; then
  rm -rf "${DIR:?}/bin"; mkdir -p "$DIR/bin"
  for prog in mnist_train allreduce_bench ringtrain_gpu_tests nccl_ring_test; do
    f="$(find "$BIN_FROM" -name "$prog" -type f -perm -u+x | head -n1)"
    [[ -n "$f" ]] || { log "--bin $BIN_FROM: no $prog there (build the GPU configuration's targets)"; exit 1; }
    cp -f "$f" "$DIR/bin/"
    strip --strip-debug "$DIR/bin/$prog" 2>/dev/null || true
  done
  grep -q '^RINGTRAIN_CUDA:[A-Z]*=ON' "$BIN_FROM/CMakeCache.txt" 2>/dev/null ||
    log "warning: $BIN_FROM was not configured with -DRINGTRAIN_CUDA=ON"
  grep -q '^RINGTRAIN_NATIVE:BOOL=OFF' "$BIN_FROM/CMakeCache.txt" 2>/dev/null ||
    log "warning: $BIN_FROM was not configured with -DRINGTRAIN_NATIVE=OFF: its programs may use instructions the GPU machine's CPU lacks"
  # What the programs are: the version mnist_train carries (its build directory's git describe
  # when it was configured), when it was linked, and the checkout that packed it.
  built_from="$(find "$BIN_FROM" -name mnist_train -type f -perm -u+x | head -n1)"
  embedded="$(strings "$built_from" 2>/dev/null | grep -m1 -E '^[0-9]+\.[0-9]+\.[0-9]+\+'; true)"
  [[ -n "$embedded" ]] || embedded=unknown
  echo "ringtrain $embedded (git describe at configure time), linked $(date -u -r "$built_from" '+%Y-%m-%d %H:%M UTC') in $BIN_FROM, packed from a checkout at $(git -C "$ROOT" describe --always --dirty 2>/dev/null)" >"$DIR/bin/BUILT"
  log "programs from $BIN_FROM: $(du -sh "$DIR/bin" | cut -f1)"
fi

# MANIFEST: what is here, with sizes (a transfer may be limited: 64 MiB with the working tree).
# shellcheck disable=SC1091 # /etc/os-release is the running system's
{
  echo "# $DIR, made $(date -u '+%Y-%m-%d %H:%M UTC') by scripts/gpu_carry.sh on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# packages (dpkg -x into a temporary root on the GPU machine):"
  for f in "$DIR"/debs/*.deb; do
    printf '%10d  %s\n' "$(stat -c %s "$f")" "debs/$(basename "$f")"
  done
  printf '%10d  debs/ total\n' "$(du -sb "$DIR/debs" | cut -f1)"
  printf '%10d  include/ total\n' "$(du -sb "$DIR/include" | cut -f1)"
  [[ -d "$DIR/data" ]] && printf '%10d  data/ total\n' "$(du -sb "$DIR/data" | cut -f1)"
  [[ -d "$DIR/bin" ]] && printf '%10d  bin/ total\n' "$(du -sb "$DIR/bin" | cut -f1)"
  printf '%10d  all\n' "$(du -sb "$DIR" | cut -f1)"
} >"$DIR/MANIFEST"
total=$(du -sb "$DIR" | cut -f1)
log "wrote $DIR: $((total / 1024)) KiB in all (MANIFEST lists each file)"
if ((total > 56 * 1024 * 1024)); then
  log "warning: over 56 MiB; with the working tree it may not fit the 64 MiB carry limit"
fi
if [[ "$(cd "$DIR" && pwd)" == "$ROOT"/* ]] && ! git -C "$ROOT" check-ignore -q "$DIR/MANIFEST" 2>/dev/null; then
  log "warning: git does not ignore $DIR: add '/.gpu-carry/' to .gitignore (or .git/info/exclude)"
fi
