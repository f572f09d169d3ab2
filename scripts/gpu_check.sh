#!/usr/bin/env bash
# gpu_check.sh: everything a GPU machine should check, in one script that ends within about
# 7 minutes: takes the programs built on the build machine (<carry>/bin) or builds ringtrain
# with CUDA (build-gpu-check/), runs the GPU tests, checks that 50 steps on the GPU equal the
# CPU's within 1e-3 and one epoch reaches the CPU's test accuracy within 0.3 points, trains
# 2 ranks on the one GPU with identical replicas, measures allreduce_bench --device cuda from
# 1 MiB to 1 GiB, times single-GPU training of mlp, cnn and the wide MLP (--hidden 4096,4096)
# at batch 128 and 512 with `mnist_train --device cuda` and its variants, times the same
# models in PyTorch eager on the same GPU (scripts/bench_gpu_torch.py), and writes a table
# (targets: 3x PyTorch for mlp and cnn at batch 128 with graphs and data on the GPU, 1x for
# the wide MLP). Meant for an NVIDIA Hopper (H100/H200) machine with CUDA 13 and PyTorch, with
# or without MPI, without internet. docs/gpu.md describes it; scripts/gpu_carry.sh prepares
# what such a machine may lack.
#
# Usage: scripts/gpu_check.sh [--out DIR] [--quick] [--budget SECONDS] [--data-dir DIR]
#                             [--allow-no-gpu] [--keep-build | --skip-build]
#   --out DIR        results (default: $OUT if set, else ./gpu-check-out): gpu_check.md (table
#                    and phase results), gpu_check.csv (every timed run), gpu_check.log (this
#                    script's log), gpu_check_logs.tar.gz (every command's full output). Four
#                    files, no subfolders (for runners that return only a few files).
#   --quick          smoke test: one round, 0.5 s per timed run (figures not meaningful)
#   --budget S       wall-clock budget for the whole script (default 420 with prebuilt programs,
#                    570 when it builds here); phases get what is left, and timing rounds stop
#                    early when the next would not fit
#   --data-dir DIR   MNIST IDX .gz files (default: $RINGTRAIN_DATA, <carry>/data/mnist,
#                    data/mnist, ../shared/data/mnist, /usr/share/datasets/fashion-mnist;
#                    else synthetic IDX files of MNIST's shape, used by both sides)
#   --allow-no-gpu   without a GPU, still configure, build and run the GPU tests (which then
#                    skip); no timings. Without this flag, no GPU means exit 77 at once.
#   --keep-build     reuse build-gpu-check/ if it exists (default: configure it afresh)
#   --skip-build     no configure or build: test and time the programs already in the build
#                    directory (after an earlier run on the same machine)
# Environment:
#   RINGTRAIN_CARRY_DIR  a directory made by scripts/gpu_carry.sh (default ./.gpu-carry when
#                        present): debs/ (unpacked with dpkg -x into a temporary root and used
#                        for MPI, Eigen, spdlog, fmt, CLI11, Catch2, zlib), include/ (NCCL and
#                        cuDNN headers when the libraries come without them), lib/ (libraries),
#                        data/mnist
#   RINGTRAIN_MPI_ROOT   an unpacked Open MPI (the 'usr' directory of a dpkg -x, or a prefix
#                        with bin/mpicxx): used when no working mpicxx is on PATH
#   RINGTRAIN_NCCL_LIBRARY, RINGTRAIN_NCCL_INCLUDE, RINGTRAIN_CUDNN_LIBRARY,
#   RINGTRAIN_CUDNN_INCLUDE  override the search below (a library file, a header directory)
#   GPU_CHECK_SECONDS (1.5), GPU_CHECK_REPS (2), GPU_CHECK_MOMENTUM (0.9), JOBS (nproc),
#   GPU_CHECK_BUILD_HERE (1: build here even when <carry>/bin holds usable programs),
#   GPU_CHECK_CONFIGS (model[+variant...]:batch words; default: mlp, cnn, mlp-wide at 128 and
#   512, and variants +graphs (--cuda-graphs), +gpudata (--data-on-gpu), +cudnn (--conv-impl
#   cudnn); see DEFAULT_CONFIGS),
#   GPU_CHECK_PYTHON (python3: the Python with PyTorch), GPU_CHECK_BUILD_DIR (build-gpu-check),
#   GPU_CHECK_DEVICE (cuda; 'cpu' is for testing this script's own logic, never for figures)
# How NCCL and cuDNN are found, first hit wins: the variables above; the CUDA toolkit's own
#   lib/include (/usr/local/cuda), /usr/lib/x86_64-linux-gnu, /usr/include; PyTorch's wheels
#   (python3 -c 'import nvidia.nccl' / 'nvidia.cudnn', their lib/ and include/); for headers
#   last, <carry>/include. A wheel's libnccl.so.2 without libnccl.so gets symlinks in a
#   temporary directory; CMake is given the files (-DRINGTRAIN_NCCL_LIBRARY=... etc.) and the
#   programs LD_LIBRARY_PATH.
# Exit status: 0 all phases ran (targets met or not: see the table); 1 the build failed;
#   2 a GPU test failed (ringtrain_gpu_tests skipping while nvidia-smi lists a GPU counts as
#   failed), or the GPU-equals-CPU, one-epoch or two-rank checks did; 3 a timing run failed or
#   no timing ran; 77 no GPU (nothing built).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
START_TS=$SECONDS
OUTDIR="${OUT:-$PWD/gpu-check-out}"
QUICK=0
BUDGET=""
DATA_DIR_ARG=""
ALLOW_NO_GPU=0
KEEP_BUILD=0
SKIP_BUILD=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUTDIR="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --data-dir) DATA_DIR_ARG="$2"; shift 2 ;;
    --allow-no-gpu) ALLOW_NO_GPU=1; shift ;;
    --keep-build) KEEP_BUILD=1; shift ;;
    --skip-build) SKIP_BUILD=1; KEEP_BUILD=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -z "$BUDGET" || "$BUDGET" =~ ^[0-9]+$ ]] || { echo "gpu_check: --budget needs whole seconds" >&2; exit 2; }
BUDGET_GIVEN=1
[[ -n "$BUDGET" ]] || { BUDGET=420; BUDGET_GIVEN=0; }

if [[ "$QUICK" == 1 ]]; then
  SECONDS_PER_RUN="${GPU_CHECK_SECONDS:-0.5}"; REPS="${GPU_CHECK_REPS:-1}"
else
  SECONDS_PER_RUN="${GPU_CHECK_SECONDS:-1.5}"; REPS="${GPU_CHECK_REPS:-2}"
fi
MOMENTUM="${GPU_CHECK_MOMENTUM:-0.9}"
JOBS="${JOBS:-$(nproc)}"
BUILD="${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu-check}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
PY="${GPU_CHECK_PYTHON:-python3}"   # the Python with PyTorch
# "name|mnist_train flags|batch" for each configuration timed. A name is a model (mlp, cnn,
# mlp-wide) with optional ringtrain variants: +graphs (--cuda-graphs), +gpudata
# (--data-on-gpu), +cudnn (--conv-impl cudnn, cnn only). PyTorch times each model once per batch; every variant is compared with it.
CONFIGS=()
# In order of importance (a round cut short by the budget loses the last): the target's batch
# 128 plain and fastest, then the single variants, then batch 512.
DEFAULT_CONFIGS="mlp:128 cnn:128 mlp-wide:128"
DEFAULT_CONFIGS+=" mlp+gpudata+graphs:128 cnn+gpudata+graphs:128 mlp-wide+gpudata+graphs:128"
DEFAULT_CONFIGS+=" mlp+graphs:128 cnn+graphs:128 cnn+cudnn:128 cnn+cudnn+gpudata+graphs:128"
DEFAULT_CONFIGS+=" mlp:512 cnn:512 mlp-wide:512 mlp+gpudata+graphs:512 cnn+gpudata+graphs:512"
for c in ${GPU_CHECK_CONFIGS:-$DEFAULT_CONFIGS}; do
  name="${c%%:*}" batch="${c#*:}"
  IFS=+ read -ra parts <<<"$name"
  case "${parts[0]}" in
    mlp) flags="--model mlp" ;;
    cnn) flags="--model cnn" ;;
    mlp-wide) flags="--model mlp --hidden 4096,4096" ;;
    *) echo "gpu_check: GPU_CHECK_CONFIGS: unknown model in '$c'" >&2; exit 2 ;;
  esac
  for variant in "${parts[@]:1}"; do
    case "$variant" in
      graphs) flags+=" --cuda-graphs" ;;
      gpudata) flags+=" --data-on-gpu" ;;
      cudnn) flags+=" --conv-impl cudnn" ;;
      *) echo "gpu_check: GPU_CHECK_CONFIGS: unknown variant '$variant' in '$c'" >&2; exit 2 ;;
    esac
  done
  CONFIGS+=("$name|$flags|$batch")
done
SHORT_STEPS=100   # ringtrain's short run per configuration: its time less the long run's is warm-up free

mkdir -p "$OUTDIR" || { echo "gpu_check: cannot create $OUTDIR" >&2; exit 2; }
OUTDIR="$(cd "$OUTDIR" && pwd)"
WORK="$(mktemp -d /tmp/gpu_check.XXXXXX)"
LOGS="$WORK/logs"
mkdir -p "$LOGS"
MAINLOG="$OUTDIR/gpu_check.log"
: >"$MAINLOG"
RESULTS="$WORK/results.csv"   # side,model,batch,round,steps,images_per_sec,step_ms,status,gpu_mem_mib
echo "side,model,batch,round,steps,images_per_sec,step_ms,status,gpu_mem_mib" >"$RESULTS"
declare -A PHASE   # phase -> result line for the report

elapsed() { echo $((SECONDS - START_TS)); }
left() { echo $((BUDGET - (SECONDS - START_TS))); }
log() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$MAINLOG" >&2; }
# limit CAP: seconds a phase may take: CAP, or what is left of the budget less 25 s for the report
limit() { local l=$(($(left) - 25)); ((l < $1)) || l=$1; ((l > 5)) || l=5; echo "$l"; }
# The GPU's memory in use (nvidia-smi memory.used, MiB, the whole device: context included),
# sampled every 100 ms while a timed run trains; mem_stop prints the peak less the idle figure
# read at the start (GPU_MEM_IDLE).
MEM_SAMPLER_PID=""
mem_start() {
  : >"$1"
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$1" 2>/dev/null &
  MEM_SAMPLER_PID=$!
}
mem_stop() {
  if [[ -n "$MEM_SAMPLER_PID" ]]; then
    kill "$MEM_SAMPLER_PID" 2>/dev/null
    wait "$MEM_SAMPLER_PID" 2>/dev/null
  fi
  MEM_SAMPLER_PID=""
  awk -v idle="${GPU_MEM_IDLE:-0}" '$1 ~ /^[0-9]+$/ { if ($1 > m) m = $1 } END { if (m != "") print m - idle }' "$1"
}

# shellcheck disable=SC2317 # called by the EXIT trap
finish() {
  local rc=$?
  (cd "$WORK" && tar czf "$OUTDIR/gpu_check_logs.tar.gz" logs results.csv 2>/dev/null)
  rm -rf "$WORK"
  return "$rc"
}
trap finish EXIT

log "gpu_check in $ROOT, results in $OUTDIR, budget ${BUDGET}s, quick=$QUICK"

# ------------------------------------------------------------------ GPU present?
GPU_NAME=""
if ! command -v nvidia-smi >/dev/null 2>&1 && [[ -x /usr/local/nvidia/bin/nvidia-smi ]]; then
  PATH="$PATH:/usr/local/nvidia/bin"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$LOGS/nvidia-smi-L.txt" 2>&1 &&
  grep -q '^GPU ' "$LOGS/nvidia-smi-L.txt"; then
  GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
  GPU_MEM_IDLE="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n1 | tr -dc 0-9)"
fi
if [[ -z "$GPU_NAME" ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
  # no nvidia-smi: ask PyTorch
  GPU_NAME="$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)"
fi
if [[ -z "$GPU_NAME" ]]; then
  why="no nvidia-smi on PATH, and $PY's torch sees no GPU"
  command -v nvidia-smi >/dev/null 2>&1 && why="nvidia-smi lists no GPU: $(head -c 300 "$LOGS/nvidia-smi-L.txt" | tr '\n' ' ')"
  if [[ "$ALLOW_NO_GPU" == 0 ]]; then
    log "SKIPPED: no GPU visible ($why); gpu_check needs an NVIDIA GPU (--allow-no-gpu builds anyway)"
    {
      echo "# gpu_check: skipped"
      echo
      echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); host $(hostname 2>/dev/null || cat /proc/sys/kernel/hostname)"
      echo "- No GPU visible ($why). Nothing was built or timed."
    } >"$OUTDIR/gpu_check.md"
    exit 77
  fi
  log "no GPU visible ($why); --allow-no-gpu: building and running the GPU tests anyway, no timings"
fi

# ------------------------------------------------------------------ versions
{
  echo "== date"; date -u
  echo "== uname"; uname -a
  echo "== os-release"; cat /etc/os-release 2>/dev/null
  echo "== nproc"; nproc
  echo "== nvidia-smi"; nvidia-smi 2>&1 || true
  echo "== nvidia-smi query"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>&1 || true
  echo "== nvcc"; { command -v nvcc || ls /usr/local/cuda/bin/nvcc; } 2>&1
  "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version 2>&1 || true
  echo "== cmake"; cmake --version 2>&1 | head -n1
  echo "== ninja"; ninja --version 2>&1 || true
  echo "== c++"; c++ --version 2>&1 | head -n1; g++ --version 2>&1 | head -n1
  echo "== mpicxx"; command -v mpicxx 2>&1 && mpicxx --version 2>&1 | head -n1
  echo "== python3"; command -v python3; python3 --version 2>&1
  echo "== torch"
  "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "cudnn", torch.backends.cudnn.version()); print("nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-"); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no device")' 2>&1
  echo "== git"; git -C "$ROOT" describe --always --dirty 2>&1; git -C "$ROOT" status --short 2>&1 | head -40
} >"$LOGS/versions.txt" 2>&1
cat "$LOGS/versions.txt" >>"$MAINLOG"
grep -E '^(NVIDIA|name,)|release [0-9]|^cmake version|^g\+\+|^[0-9]+\.[0-9]+.*cuda|^nccl' "$LOGS/versions.txt" |
  grep -v '^name,' | sed 's/^/  /' >&2

# ------------------------------------------------------------------ locate the dependencies
CARRY="${RINGTRAIN_CARRY_DIR:-}"
[[ -z "$CARRY" && -d "$ROOT/.gpu-carry" ]] && CARRY="$ROOT/.gpu-carry"
[[ -z "$CARRY" || -d "$CARRY" ]] || { log "RINGTRAIN_CARRY_DIR=$CARRY is not a directory; ignoring it"; CARRY=""; }
[[ -n "$CARRY" ]] && CARRY="$(cd "$CARRY" && pwd)"
# What the build's cache points at (symlinks, the carried root, MPI wrappers) lives in the build
# directory, so that --keep-build finds it again at the same paths.
# (only a directory CMake made is removed)
[[ "$KEEP_BUILD" == 0 && -f "$BUILD/CMakeCache.txt" ]] && rm -rf "$BUILD"
STATE="$BUILD/gpu_check_env"
mkdir -p "$STATE"
LINKS="$STATE/links"
mkdir -p "$LINKS"
RT_LIBPATH=()        # prepended to LD_LIBRARY_PATH for ringtrain's programs only
CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DRINGTRAIN_CUDA=ON)
PREFIXES=()

# CUDA compiler and toolkit
NVCC="$(command -v nvcc || true)"
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
if [[ -n "$NVCC" ]]; then
  NVCC="$(readlink -f "$NVCC")"
  CUDA_ROOT="$(dirname "$(dirname "$NVCC")")"
  CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$CUDA_ROOT")
  # libcudart.so.13 and libcublas.so.13 (loaded at run time) for programs built elsewhere
  for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/targets/x86_64-linux/lib" "$CUDA_ROOT/lib"; do
    [[ -d "$d" ]] && RT_LIBPATH+=("$d")
  done
  log "CUDA: $NVCC"
else
  CUDA_ROOT=/usr/local/cuda
  log "CUDA: no nvcc found (PATH, /usr/local/cuda/bin): the configure step will fail"
fi

# Python wheels' directories for a module (nvidia.nccl, nvidia.cudnn, ...)
wheel_dirs() {
  "$PY" - "$1" 2>/dev/null <<'PY'
import importlib, sys
try:
    m = importlib.import_module(sys.argv[1])
except Exception:
    sys.exit(0)
for p in list(getattr(m, "__path__", [])):
    print(p)
PY
}
# find_lib NAME SONAME: a library file (unversioned or SONAME) in the usual places, then in wheels
find_lib() {
  local name="$1" soname="$2" d f
  for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/lib" "$CUDA_ROOT/targets/x86_64-linux/lib" \
    /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib ${CARRY:+"$CARRY/lib"}; do
    for f in "$d/lib$name.so" "$d/$soname"; do
      [[ -f "$f" ]] && { echo "$f"; return 0; }
    done
  done
  find_wheel_lib "$name" "$soname"
}
# find_wheel_lib NAME SONAME: the library in PyTorch's nvidia-* wheels
find_wheel_lib() {
  local name="$1" soname="$2" d f mod
  for mod in "nvidia.$name" nvidia.cu13 nvidia; do
    while IFS= read -r d; do
      f="$(find "$d" -maxdepth 3 \( -name "lib$name.so" -o -name "$soname" \) 2>/dev/null | sort | head -n1)"
      [[ -n "$f" ]] && { echo "$f"; return 0; }
    done < <(wheel_dirs "$mod")
  done
  return 1
}
# find_header FILE [LIBFILE [NO_CARRY]]: a directory holding FILE: beside LIBFILE's wheel, usual
# places, then (unless NO_CARRY is given) the carried headers
find_header() {
  local file="$1" lib="${2:-}" no_carry="${3:-}" d
  if [[ -n "$lib" && -f "$(dirname "$(dirname "$lib")")/include/$file" ]]; then
    dirname "$(dirname "$lib")" | sed 's|$|/include|'; return 0
  fi
  for d in "$CUDA_ROOT/include" "$CUDA_ROOT/targets/x86_64-linux/include" /usr/include \
    /usr/local/include; do
    [[ -f "$d/$file" ]] && { echo "$d"; return 0; }
  done
  [[ -z "$no_carry" ]] || return 1
  # CMake refuses include directories inside the source tree (the carry is there): a copy in
  # the build directory's state
  for d in ${CARRY:+"$CARRY/include"}; do
    if [[ -f "$d/$file" ]]; then
      mkdir -p "$STATE/include"
      cp -a "$d"/. "$STATE/include/"
      echo "$STATE/include"; return 0
    fi
  done
  return 1
}
# link_lib FILE NAME SONAME: a directory with libNAME.so and SONAME pointing at FILE (wheels ship
# only the SONAME file; CMake's find_library and the linker's -lNAME want the unversioned name)
link_lib() {
  local real; real="$(readlink -f "$1")"
  mkdir -p "$LINKS/$2"
  ln -sf "$real" "$LINKS/$2/lib$2.so"
  ln -sf "$real" "$LINKS/$2/$3"
  echo "$LINKS/$2/lib$2.so"
}
header_version() {  # FILE MACRO...: "a.b.c" from #define lines
  local file="$1"; shift
  local v="" m
  for m in "$@"; do v+="${v:+.}$(awk -v m="$m" '$1 == "#define" && $2 == m { print $3; exit }' "$file")"; done
  echo "$v"
}

DEPS_MISSING=""
for dep in nccl cudnn; do
  upper="${dep^^}"
  soname="libnccl.so.2"; header="nccl.h"
  [[ "$dep" == cudnn ]] && { soname="libcudnn.so.9"; header="cudnn.h"; }
  lib_var="RINGTRAIN_${upper}_LIBRARY"; inc_var="RINGTRAIN_${upper}_INCLUDE"
  lib="${!lib_var:-}"; inc="${!inc_var:-}"
  [[ -n "$lib" ]] || lib="$(find_lib "$dep" "$soname" || true)"
  [[ -n "$inc" ]] || inc="$(find_header "$header" "$lib" no-carry || true)"
  # A library without its header here (a system cuDNN without cudnn.h, say): a wheel's library
  # that ships its own header wins over pairing it with the carried header of another version.
  if [[ -z "${!lib_var:-}" && -z "$inc" ]]; then
    wlib="$(find_wheel_lib "$dep" "$soname" || true)"
    winc="$([[ -n "$wlib" ]] && find_header "$header" "$wlib" no-carry || true)"
    if [[ -n "$wlib" && -n "$winc" && "$winc" == "$(dirname "$(dirname "$wlib")")/include" ]]; then
      log "$upper: ${lib:-no library} without a header here; the wheel's $wlib with its headers instead"
      lib="$wlib"; inc="$winc"
    fi
  fi
  [[ -n "$inc" ]] || inc="$(find_header "$header" "$lib" || true)"
  if [[ -z "$lib" || -z "$inc" ]]; then
    log "$upper: library '${lib:-not found}', header directory '${inc:-not found}': the configure step will fail"
    DEPS_MISSING+="$upper "
    continue
  fi
  real_dir="$(dirname "$(readlink -f "$lib")")"
  [[ "$(basename "$lib")" == "lib$dep.so" ]] || lib="$(link_lib "$lib" "$dep" "$soname")"
  RT_LIBPATH+=("$real_dir" "$(dirname "$lib")")
  CMAKE_ARGS+=(-D"$lib_var=$lib" -D"$inc_var=$inc")
  if [[ "$dep" == nccl ]]; then
    hv="$(header_version "$inc/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)"
  else
    hv="$(header_version "$inc/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL 2>/dev/null)"
  fi
  log "$upper: $lib -> $(readlink -f "$lib"); headers $inc (version $hv)"
done

# cuBLAS normally comes with the toolkit; an image whose toolkit lacks it may have the wheel's
# (nvidia/cu13/lib/libcublas.so.13): FindCUDAToolkit then gets it through its cache variables.
if ! compgen -G "$CUDA_ROOT/lib*/libcublas.so*" >/dev/null &&
  ! compgen -G "$CUDA_ROOT/targets/x86_64-linux/lib/libcublas.so*" >/dev/null; then
  for blas in cublas cublasLt; do
    f="$(find_lib "$blas" "lib$blas.so.13" || true)"
    if [[ -n "$f" ]]; then
      RT_LIBPATH+=("$(dirname "$(readlink -f "$f")")")
      [[ "$(basename "$f")" == "lib$blas.so" ]] || f="$(link_lib "$f" "$blas" "lib$blas.so.13")"
      CMAKE_ARGS+=(-D"CUDA_${blas}_LIBRARY=$f")
      log "cuBLAS: not in $CUDA_ROOT; using $f"
    fi
  done
fi

# A carried root: Debian packages unpacked with dpkg -x (scripts/gpu_carry.sh). Where the system
# has a working MPI, the carried Open MPI stays packed: its libraries would shadow the system's
# (which the system's mpirun matches) in the build and at run time.
SYSTEM_MPI=0
command -v mpicxx >/dev/null 2>&1 && { mpicxx --showme:version || mpicxx -show; } >/dev/null 2>&1 && SYSTEM_MPI=1
SYSROOT=""
if [[ -n "$CARRY" ]] && compgen -G "$CARRY/debs/*.deb" >/dev/null; then
  SYSROOT="$STATE/sysroot"
  rm -rf "$SYSROOT"
  mkdir -p "$SYSROOT"
  for deb in "$CARRY"/debs/*.deb; do
    if [[ "$SYSTEM_MPI" == 1 ]] && [[ "$(basename "$deb")" =~ ^(libopenmpi|openmpi|libpmix|libhwloc|libevent|libudev) ]]; then
      continue
    fi
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$SYSROOT" || log "warning: dpkg-deb -x $deb failed"
    else  # no dpkg: a .deb is an ar archive holding data.tar.*
      (cd "$STATE" && ar x "$deb" && tar xf data.tar.* -C "$SYSROOT" && rm -f data.tar.* control.tar.* debian-binary) ||
        log "warning: unpacking $deb failed"
    fi
  done
  ARCHLIB="$SYSROOT/usr/lib/x86_64-linux-gnu"
  # Base libraries the system has (zlib, udev) stay the system's: no older copy shadows them.
  for so in libz.so.1 libudev.so.1 libgomp.so.1; do
    sys="$(ldconfig -p 2>/dev/null | awk -v n="$so" '$1 == n && /x86-64/ { print $NF; exit }')"
    if [[ -n "$sys" ]]; then
      rm -f "$ARCHLIB/$so" "$ARCHLIB/$so".*
      [[ "$so" == libz.so.1 ]] && ln -sf "$sys" "$ARCHLIB/libz.so"
    fi
  done
  PREFIXES+=("$SYSROOT/usr")
  RT_LIBPATH+=("$ARCHLIB")
  log "carried root: $(find "$CARRY/debs" -name '*.deb' | wc -l) packages from $CARRY/debs unpacked into $SYSROOT$([[ "$SYSTEM_MPI" == 1 ]] && echo ", less Open MPI's (the system has an MPI)")"
fi

# MPI: a working mpicxx on PATH, else $RINGTRAIN_MPI_ROOT, else the carried root
MPI_ENV=()
mpi_root=""
if [[ "$SYSTEM_MPI" == 1 ]]; then
  CMAKE_ARGS+=(-DMPI_CXX_COMPILER="$(command -v mpicxx)")
  log "MPI: $(command -v mpicxx) ($(mpicxx --showme:version 2>&1 | head -n1))"
else
  if [[ -n "${RINGTRAIN_MPI_ROOT:-}" ]]; then
    mpi_root="$RINGTRAIN_MPI_ROOT"
    [[ -d "$mpi_root/usr/bin" ]] && mpi_root="$mpi_root/usr"
  elif [[ -n "$SYSROOT" && -e "$SYSROOT/usr/bin/opal_wrapper" ]]; then
    mpi_root="$SYSROOT/usr"
  fi
  if [[ -n "$mpi_root" ]]; then
    mpi_root="$(cd "$mpi_root" && pwd)"
    mpi_lib="$mpi_root/lib/x86_64-linux-gnu"
    [[ -d "$mpi_lib" ]] || mpi_lib="$mpi_root/lib"
    # A relocated Open MPI: OPAL_PREFIX and PMIX_PREFIX say where it now lives; its MCA defaults
    # (Debian: no UCX/verbs/OFI) come from the carried file, since /etc/openmpi is absent.
    MPI_ENV=(OPAL_PREFIX="$mpi_root" OMPI_MCA_mca_base_component_show_load_errors=0
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    [[ -d "$mpi_lib/pmix2" ]] && MPI_ENV+=(PMIX_PREFIX="$mpi_lib/pmix2")
    for conf in "$mpi_root/../etc/openmpi/openmpi-mca-params.conf" "$mpi_root/etc/openmpi-mca-params.conf"; do
      [[ -f "$conf" ]] && { MPI_ENV+=(OMPI_MCA_mca_base_param_files="$(readlink -f "$conf")"); break; }
    done
    mkdir -p "$STATE/bin"
    for tool in mpicxx mpirun mpiexec ompi_info; do
      real="$mpi_root/bin/$tool"
      [[ -e "$real" ]] || real="$mpi_root/bin/$tool.openmpi"
      [[ -e "$real" ]] || continue
      # shellcheck disable=SC2016 # $LD_LIBRARY_PATH and $@ expand when the wrapper runs
      printf '#!/bin/sh\nexport %s\nexport LD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\nexec "%s" "$@"\n' \
        "$(printf '%q ' "${MPI_ENV[@]}")" "$mpi_lib" "$real" >"$STATE/bin/$tool"
      chmod +x "$STATE/bin/$tool"
    done
    CMAKE_ARGS+=(-DMPI_CXX_COMPILER="$STATE/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$STATE/bin/mpirun")
    RT_LIBPATH+=("$mpi_lib")
    log "MPI: relocated Open MPI at $mpi_root ($("$STATE/bin/mpicxx" --showme:version 2>&1 | head -n1))"
  else
    log "MPI: none found (no mpicxx on PATH, no RINGTRAIN_MPI_ROOT, no carried packages): the configure step will fail"
    DEPS_MISSING+="MPI "
  fi
fi
if ((${#PREFIXES[@]})); then
  CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="$(IFS=';'; echo "${PREFIXES[*]}")")
fi
command -v ninja >/dev/null 2>&1 && CMAKE_ARGS+=(-G Ninja)
# CMake 4 refuses packages' config files that ask for policies older than 3.5 (none of the
# carried ones should: they say 2.8.3...3.22; this is insurance for other systems' files)
[[ "$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\).*/\1/p')" -ge 4 ]] 2>/dev/null &&
  CMAKE_ARGS+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
RT_LD="$(IFS=:; echo "${RT_LIBPATH[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# rt CMD...: runs a ringtrain program with the libraries found above and MPI's settings
rt() { env LD_LIBRARY_PATH="$RT_LD" OMPI_MCA_ess_singleton_isolated=1 "${MPI_ENV[@]}" "$@"; }

# ------------------------------------------------------------------ configure + build
BUILD_RC=1
PHASE[build]="not run"
t0=$SECONDS
# Programs built on the build machine (scripts/gpu_carry.sh --bin DIR puts them in <carry>/bin):
# used when every one loads its libraries here and starts, which saves the build's minutes of
# GPU-machine time; any failure falls back to building here.
PREBUILT=0
PREBUILT_PROGRAMS=(mnist_train allreduce_bench ringtrain_gpu_tests nccl_ring_test)
# They go into a directory of their own (never over programs built here), which then stands
# for the build directory below.
PREBUILT_DIR="$STATE/prebuilt"
if [[ "$SKIP_BUILD" == 0 && "${GPU_CHECK_BUILD_HERE:-0}" != 1 && -n "$CARRY" && -x "$CARRY/bin/mnist_train" ]]; then
  why=""
  rm -rf "$PREBUILT_DIR"
  mkdir -p "$PREBUILT_DIR/tests/gpu"
  for prog in "${PREBUILT_PROGRAMS[@]}"; do
    [[ -x "$CARRY/bin/$prog" ]] || { why+="$prog missing; "; continue; }
    dest="$PREBUILT_DIR/$prog"
    [[ "$prog" == ringtrain_gpu_tests ]] && dest="$PREBUILT_DIR/tests/gpu/$prog"
    cp -f "$CARRY/bin/$prog" "$dest"
    missing_libs="$(rt ldd "$dest" 2>&1 | grep 'not found' | awk '{print $1}' | paste -sd, -)"
    [[ -z "$missing_libs" ]] || why+="$prog lacks $missing_libs; "
  done
  if [[ -z "$why" ]]; then
    rt timeout 30 "$PREBUILT_DIR/mnist_train" --help >"$LOGS/prebuilt_help.log" 2>&1 || why+="mnist_train --help failed: $(tail -n 2 "$LOGS/prebuilt_help.log" | tr '\n' ' '); "
    rt timeout 30 "$PREBUILT_DIR/tests/gpu/ringtrain_gpu_tests" --list-test-names-only >"$LOGS/prebuilt_list.log" 2>&1
    rc=$?  # Catch2 v2 exits with the number of tests listed
    if ((rc >= 124)) || grep -qE 'error while loading shared libraries|symbol lookup error' "$LOGS/prebuilt_list.log"; then
      why+="ringtrain_gpu_tests --list-test-names-only failed (exit $rc): $(tail -n 2 "$LOGS/prebuilt_list.log" | tr '\n' ' '); "
    fi
  fi
  if [[ -z "$why" ]]; then
    PREBUILT=1; BUILD_RC=0; BUILD="$PREBUILT_DIR"
    PHASE[build]="prebuilt on the build machine ($(cat "$CARRY/bin/BUILT" 2>/dev/null | head -n1)): ${PREBUILT_PROGRAMS[*]} load and start here"
  else
    log "prebuilt programs in $CARRY/bin not usable ($why); building here"
    rm -rf "$PREBUILT_DIR"
  fi
fi
# A build here takes minutes the default budget does not hold.
if [[ "$PREBUILT" == 0 && "$SKIP_BUILD" == 0 && "$BUDGET_GIVEN" == 0 ]]; then
  BUDGET=570
  log "budget: ${BUDGET}s (building here)"
fi
if [[ "$PREBUILT" == 1 ]]; then
  :
elif [[ "$SKIP_BUILD" == 1 ]]; then
  if [[ -x "$BUILD/mnist_train" ]]; then BUILD_RC=0; PHASE[build]="skipped (--skip-build): programs already in $BUILD"
  else PHASE[build]="FAILED: --skip-build, but $BUILD/mnist_train does not exist"; fi
else
  log "configure: cmake -S . -B build-gpu-check ${CMAKE_ARGS[*]}"
  if timeout "$(limit 120)" env PATH="$STATE/bin:$PATH" cmake -S "$ROOT" -B "$BUILD" "${CMAKE_ARGS[@]}" \
    >"$LOGS/configure.log" 2>&1; then
    grep "ringtrain:" "$LOGS/configure.log" | sed 's/^/  /' | tee -a "$MAINLOG" >&2
    targets=(mnist_train allreduce_bench ringtrain_gpu_tests)  # allreduce_bench: a GPU ctest runs it
    # other GPU test programs tests/gpu/ may define (NCCL under mpirun, ...)
    while IFS= read -r t; do
      [[ " ${targets[*]} " == *" $t "* ]] || targets+=("$t")
    done < <(cmake --build "$BUILD" --target help 2>/dev/null |
      sed -n 's/^\.\.\. \([A-Za-z0-9_]*\).*/\1/p; s/^\([A-Za-z0-9_]*\): phony$/\1/p' | grep -E 'gpu|nccl|cuda' | grep -vE '^(ringtrain_gpu_tests)$')
    log "build: cmake --build build-gpu-check -j $JOBS --target ${targets[*]}"
    if timeout "$(limit 330)" env PATH="$STATE/bin:$PATH" cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" \
      >"$LOGS/build.log" 2>&1; then
      BUILD_RC=0
      PHASE[build]="ok ($((SECONDS - t0)) s, targets ${targets[*]})"
    else
      rc=$?
      PHASE[build]="FAILED (exit $rc$([[ $rc == 124 ]] && echo ', timed out'), $((SECONDS - t0)) s): see build.log"
      tail -n 40 "$LOGS/build.log" | tee -a "$MAINLOG" >&2
    fi
  else
    rc=$?
    PHASE[build]="FAILED at configure (exit $rc$([[ $rc == 124 ]] && echo ', timed out')): see configure.log"
    tail -n 40 "$LOGS/configure.log" | tee -a "$MAINLOG" >&2
  fi
fi
log "build: ${PHASE[build]}"

# ------------------------------------------------------------------ GPU tests
TESTS_RC=0
PHASE[gpu_tests]="not run (no build)"
PHASE[gpu_ctest]="not run (no build)"
if [[ "$BUILD_RC" == 0 ]]; then
  bin="$(find "$BUILD" -name ringtrain_gpu_tests -type f -perm -u+x | head -n1)"
  if [[ -z "$bin" ]]; then
    PHASE[gpu_tests]="FAILED: ringtrain_gpu_tests was not built"
    TESTS_RC=2
  else
    log "GPU tests: $bin"
    (cd "$(dirname "$bin")" && rt timeout "$(limit 150)" "$bin" --durations yes) >"$LOGS/gpu_tests.log" 2>&1
    rc=$?
    summary="$(grep -E '^(All tests passed|test cases:)|SKIPPED' "$LOGS/gpu_tests.log" | tail -n 2 | tr '\n' ' ')"
    case $rc in
      0) PHASE[gpu_tests]="passed: $summary" ;;
      77)
        if [[ -n "$GPU_NAME" && "$DEVICE" == cuda ]]; then  # a GPU is there, yet the tests see none
          PHASE[gpu_tests]="FAILED: skipped although nvidia-smi lists $GPU_NAME: $summary"; TESTS_RC=2
        else
          PHASE[gpu_tests]="skipped: $summary"
        fi ;;
      124) PHASE[gpu_tests]="FAILED: timed out"; TESTS_RC=2 ;;
      *) PHASE[gpu_tests]="FAILED (exit $rc): $summary"; TESTS_RC=2 ;;
    esac
    [[ $rc == 0 || $rc == 77 ]] || tail -n 60 "$LOGS/gpu_tests.log" | tee -a "$MAINLOG" >&2
  fi
  log "GPU tests: ${PHASE[gpu_tests]}"
  # Further GPU tests registered with ctest (e.g. NCCL under mpirun), whose programs were built.
  others="$(cd "$BUILD" && ctest -N -R 'gpu|nccl|cuda' 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p' | grep -vx 'gpu_tests' | paste -sd'|')"
  if [[ -n "$others" ]]; then
    log "ctest: $others"
    (cd "$BUILD" && rt timeout "$(limit 120)" ctest -R "^($others)\$" --output-on-failure --timeout 100) \
      >"$LOGS/gpu_ctest.log" 2>&1
    rc=$?
    line="$(grep -E 'tests passed|tests failed' "$LOGS/gpu_ctest.log" | tail -n1)"
    skipped="$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$LOGS/gpu_ctest.log" | paste -sd, -)"
    [[ -n "$skipped" ]] && line+="; skipped (exit 77): $skipped"
    if [[ $rc == 0 ]]; then PHASE[gpu_ctest]="no failure: $line"; else
      PHASE[gpu_ctest]="FAILED (exit $rc): $line $(grep -E '\*\*\*|Failed|Not Run' "$LOGS/gpu_ctest.log" | head -n 8 | tr '\n' ';')"
      TESTS_RC=2
      tail -n 60 "$LOGS/gpu_ctest.log" >>"$MAINLOG"
    fi
  else
    PHASE[gpu_ctest]="none registered besides gpu_tests"
    [[ "$PREBUILT" == 1 ]] && PHASE[gpu_ctest]="none (prebuilt programs, no ctest files): nccl_ring_test and allreduce_bench run under 'Two or more ranks'"
  fi
  log "ctest (other GPU tests): ${PHASE[gpu_ctest]}"
fi

# Without a GPU (--allow-no-gpu): does the program start at all (MPI, libraries, data)?
PHASE[cpu_smoke]=""
if [[ -z "$GPU_NAME" && "$BUILD_RC" == 0 && -x "$BUILD/mnist_train" ]]; then
  smoke_data=""
  for d in "$DATA_DIR_ARG" "${RINGTRAIN_DATA:-}" ${CARRY:+"$CARRY/data/mnist"} "$ROOT/data/mnist" \
    "$ROOT/../shared/data/mnist" /usr/share/datasets/fashion-mnist; do
    [[ -n "$d" && -f "$d/train-images-idx3-ubyte.gz" ]] && { smoke_data="$d"; break; }
  done
  if [[ -n "$smoke_data" ]]; then
    rt timeout "$(limit 60)" "$BUILD/mnist_train" --data-dir "$smoke_data" --steps 20 --batch-size 32 \
      --log-every 0 --eval-every 0 >"$LOGS/cpu_smoke.log" 2>&1
    rc=$?
    PHASE[cpu_smoke]="mnist_train on the CPU, 20 steps: $([[ $rc == 0 ]] && echo ok || echo "FAILED (exit $rc)")"
    [[ $rc == 0 ]] || tail -n 20 "$LOGS/cpu_smoke.log" | tee -a "$MAINLOG" >&2
    log "${PHASE[cpu_smoke]}"
  fi
fi

# ------------------------------------------------------------------ data
DATA_DIR=""
DATA_LABEL=""
for d in "$DATA_DIR_ARG" "${RINGTRAIN_DATA:-}" ${CARRY:+"$CARRY/data/mnist"} "$ROOT/data/mnist" \
  "$ROOT/../shared/data/mnist" /usr/share/datasets/fashion-mnist; do
  if [[ -n "$d" && -f "$d/train-images-idx3-ubyte.gz" && -f "$d/t10k-images-idx3-ubyte.gz" ]]; then
    DATA_DIR="$(cd "$d" && pwd)"; DATA_LABEL="IDX files in $DATA_DIR"; break
  fi
done
[[ -n "$DATA_DIR_ARG" && "$DATA_DIR" != "$(cd "$DATA_DIR_ARG" 2>/dev/null && pwd)" ]] &&
  log "warning: --data-dir $DATA_DIR_ARG holds no IDX .gz files"

# ------------------------------------------------------------------ GPU equals CPU
# The same program, seed and batches on each device (the GPU build's mnist_train runs either):
# 50 steps of the mlp and the cnn, SGD lr 0.01 momentum 0.9, parameters compared
# (scripts/compare_params.py). Tolerance 1e-3 on the largest |gpu - cpu|: twice a first-order
# worst case that leaves out how the training map itself amplifies a difference. The devices
# sum in other orders (cuBLAS's and the conv kernels' against Eigen's), so a gradient value may
# differ by 2 gamma_K sum|terms|, with K <= 784 summands and sum|terms| <= 1 taken for these
# models (mean-loss gradients of [0, 1] pixels through weights below 1): 9.3e-5 a step; the
# momentum buffer holds at most 10 times that, each update moves a weight by lr = 0.01 times
# the buffer, and 50 updates add up: 50 x 0.01 x 10 x 9.3e-5 = 4.7e-4. Then one epoch of each
# on each device: test accuracy within 0.3 points.
PHASE[parity]="not run"
PHASE[epoch]="not run"
PHASE[ranks]="not run"
PARITY_TOL=1e-3
HAVE_RT=0
[[ -n "$GPU_NAME" && "$BUILD_RC" == 0 && -x "$BUILD/mnist_train" ]] && HAVE_RT=1
if [[ "$HAVE_RT" == 1 && -n "$DATA_DIR" ]]; then
  PAR="$WORK/parity"
  mkdir -p "$PAR"
  POPT=(--data-dir "$DATA_DIR" --optimizer sgd --lr 0.01 --momentum 0.9 --seed 42 --batch-size 128
    --log-every 0 --eval-every 0 --eval-batch 10000)
  PHASE[parity]=""
  for model in mlp cnn; do
    for dev in cpu "$DEVICE"; do
      rt timeout "$(limit 60)" "$BUILD/mnist_train" --device "$dev" --model "$model" --steps 50 "${POPT[@]}" \
        --save-params "$PAR/$model-$dev.bin" --metrics-out "$PAR/$model-$dev.jsonl" \
        >"$LOGS/parity-$model-$dev.log" 2>&1 || log "parity: $model on $dev FAILED (exit $?): $(tail -n 2 "$LOGS/parity-$model-$dev.log" | tr '\n' ' ')"
    done
    line="$(python3 "$ROOT/scripts/compare_params.py" --max-abs "$PARITY_TOL" "$PAR/$model-cpu.bin" "$PAR/$model-$DEVICE.bin" 2>&1)"
    rc=$?
    [[ $rc == 0 ]] || TESTS_RC=2
    PHASE[parity]+="$model: $([[ $rc == 0 ]] && echo ok || echo FAILED): $line. "
    log "GPU equals CPU, $model 50 steps: $line"
  done
  PHASE[epoch]=""
  for model in mlp cnn; do
    acc=()
    for dev in cpu "$DEVICE"; do
      if rt timeout "$(limit 90)" "$BUILD/mnist_train" --device "$dev" --model "$model" --epochs 1 "${POPT[@]}" \
        --metrics-out "$PAR/epoch-$model-$dev.jsonl" >"$LOGS/epoch-$model-$dev.log" 2>&1; then
        acc+=("$(python3 "$ROOT/scripts/summary_field.py" "$PAR/epoch-$model-$dev.jsonl" test_accuracy 2>/dev/null)")
      else
        log "epoch: $model on $dev FAILED (exit $?)"; acc+=("")
      fi
    done
    line="$(python3 - "${acc[0]:-nan}" "${acc[1]:-nan}" <<'PY'
import math, sys
c, g = (float(v) if v else math.nan for v in sys.argv[1:3])
ok = abs(c - g) * 100 <= 0.3
print(f"test accuracy cpu {100 * c:.2f}%, gpu {100 * g:.2f}%, difference {100 * abs(c - g):.2f} points: "
      + ("within 0.3" if ok else "OVER 0.3 (or a run failed)"))
sys.exit(0 if ok else 1)
PY
)"
    rc=$?
    [[ $rc == 0 ]] || TESTS_RC=2
    PHASE[epoch]+="$model: $line. "
    log "one epoch, $model, batch 128: $line"
  done
fi

# ------------------------------------------------------------------ ranks on the GPUs
# Two ranks: on one GPU they share it (NCCL refuses two ranks on one device, so the ring runs
# host-staged); on two or more each has its own and the ring runs over NCCL. Training keeps the
# replicas bitwise identical (--check-replicas; exit 0 means every check passed). Then
# allreduce_bench's bus bandwidth from 1 MiB to 1 GiB: with one GPU the staged ring on 2 ranks
# and the NCCL ring against ncclAllReduce on 1 rank (which checks them, but moves nothing); with
# G >= 2 GPUs the NCCL ring against ncclAllReduce on G ranks, their busbw ratio at 64 MiB and
# above (the target: >= 0.8), and nccl_ring_test on G ranks and its timeout case on 2.
GPU_COUNT="$(grep -c '^GPU ' "$LOGS/nvidia-smi-L.txt" 2>/dev/null)"
[[ "$GPU_COUNT" =~ ^[0-9]+$ ]] || GPU_COUNT=0
MPIRUN="$(command -v mpirun || true)"
[[ -x "$STATE/bin/mpirun" ]] && MPIRUN="$STATE/bin/mpirun"
MPI_FLAGS=(--oversubscribe --bind-to none --mca btl "self,vader" --mca btl_vader_single_copy_mechanism none)
[[ "$(id -u)" == 0 ]] && MPI_FLAGS+=(--allow-run-as-root)
if [[ "$HAVE_RT" == 1 && -n "$MPIRUN" && -n "$DATA_DIR" ]]; then
  PHASE[ranks]=""
  for spec in "mlp|200" "cnn|100"; do
    IFS='|' read -r model steps <<<"$spec"
    rt timeout "$(limit 90)" "$MPIRUN" -np 2 "${MPI_FLAGS[@]}" "$BUILD/mnist_train" --device "$DEVICE" --model "$model" \
      --data-dir "$DATA_DIR" --steps "$steps" --batch-size 64 --check-replicas 20 --log-every 0 --eval-every 0 \
      --eval-batch 10000 --metrics-out "$LOGS/ranks-$model.jsonl" >"$LOGS/ranks-$model.log" 2>&1
    rc=$?
    ips="$(python3 "$ROOT/scripts/summary_field.py" "$LOGS/ranks-$model.jsonl" images_per_sec 2>/dev/null)"
    if [[ $rc == 0 ]]; then
      PHASE[ranks]+="mpirun -np 2 mnist_train --device cuda --model $model: $steps steps, replicas identical at every 20th step and the end, ${ips%.*} img/s. "
    else
      TESTS_RC=2
      PHASE[ranks]+="mpirun -np 2 --model $model: FAILED (exit $rc): $(grep -iE 'error|replica|differ' "$LOGS/ranks-$model.log" | head -n 2 | tr '\n' ' '). "
    fi
    log "2 ranks on $GPU_COUNT GPU(s), $model: exit $rc"
  done
  bench_specs=("2|staged" "1|both")
  ((GPU_COUNT >= 2)) && bench_specs=("$GPU_COUNT|both" "2|staged")
  [[ "$DEVICE" == cpu ]] && bench_specs=("2|ring" "1|both")  # testing this script without a GPU
  for spec in "${bench_specs[@]}"; do
    IFS='|' read -r np backend <<<"$spec"
    rt timeout "$(limit 120)" "$MPIRUN" -np "$np" "${MPI_FLAGS[@]}" "$BUILD/allreduce_bench" --device "$DEVICE" \
      --backend "$backend" -b 1M -e 1G -f 4 -n 5 -w 2 -c 1 --csv "$LOGS/allreduce_np${np}_$backend.csv" \
      >"$LOGS/allreduce-np$np-$backend.log" 2>&1
    rc=$?
    [[ $rc == 0 ]] || TESTS_RC=2
    PHASE[ranks]+="allreduce_bench -np $np --backend $backend 1M-1G: $([[ $rc == 0 ]] && echo "ok, checked" || echo "FAILED (exit $rc)"). "
    if [[ $rc == 0 && "$backend" == both && "$np" -ge 2 ]]; then
      ratio="$(python3 - "$LOGS/allreduce_np${np}_$backend.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["size_bytes"]) >= 64 << 20]
bus = {}
for r in rows:
    bus.setdefault(int(r["size_bytes"]), {})[r["backend"]] = float(r["busbw_gbps"])
parts = [f"{size >> 20} MiB {b['ring'] / b[other]:.2f}x" for size, b in sorted(bus.items())
         for other in [k for k in b if k != "ring"] if b.get(other)]
print(("ring / " + [k for k in next(iter(bus.values())) if k != "ring"][0] + " busbw: " + ", ".join(parts)) if parts else "no rows at 64 MiB and above")
PY
)"
      PHASE[ranks]+="$ratio (target >= 0.8x). "
      log "allreduce_bench np $np: $ratio"
    fi
    log "allreduce_bench np $np $backend: exit $rc"
  done
  if ((GPU_COUNT >= 2)) && [[ -x "$BUILD/nccl_ring_test" && "$DEVICE" == cuda ]]; then
    rt timeout "$(limit 120)" "$MPIRUN" -np "$GPU_COUNT" "${MPI_FLAGS[@]}" "$BUILD/nccl_ring_test" \
      >"$LOGS/nccl_ring_np$GPU_COUNT.log" 2>&1
    rc=$?
    [[ $rc == 0 ]] || TESTS_RC=2
    PHASE[ranks]+="nccl_ring_test, $GPU_COUNT ranks: $([[ $rc == 0 ]] && echo passed || echo "FAILED (exit $rc)"). "
    rt env RINGTRAIN_COMM_TIMEOUT_S=3 timeout "$(limit 60)" "$MPIRUN" -np 2 "${MPI_FLAGS[@]}" -x RINGTRAIN_COMM_TIMEOUT_S \
      "$BUILD/nccl_ring_test" --expect-timeout >"$LOGS/nccl_ring_timeout_np2.log" 2>&1
    rc=$?
    [[ $rc == 0 ]] || TESTS_RC=2
    PHASE[ranks]+="nccl_ring_test --expect-timeout, 2 ranks: $([[ $rc == 0 ]] && echo passed || echo "FAILED (exit $rc)"). "
  fi
  if [[ -x "$BUILD/nccl_ring_test" ]]; then
    rt timeout "$(limit 60)" "$BUILD/nccl_ring_test" >"$LOGS/nccl_ring_np1.log" 2>&1
    rc=$?
    [[ $rc == 0 || ($rc == 77 && "$DEVICE" == cpu) ]] || TESTS_RC=2
    PHASE[ranks]+="nccl_ring_test, 1 rank: $(case $rc in 0) echo passed ;; 77) echo "skipped: $(grep -m1 SKIPPED "$LOGS/nccl_ring_np1.log")" ;; *) echo "FAILED (exit $rc)" ;; esac)."
  fi
elif [[ "$HAVE_RT" == 1 ]]; then
  PHASE[ranks]="not run: no mpirun (none on PATH, none carried)"
fi

# ------------------------------------------------------------------ timings
BENCH_RC=0
PHASE[timings]="not run"
TORCH_INFO=""
if [[ -z "$GPU_NAME" ]]; then
  PHASE[timings]="not run (no GPU)"
elif [[ "$BUILD_RC" != 0 || ! -x "$BUILD/mnist_train" ]]; then
  PHASE[timings]="not run (no build: PyTorch alone would give no ratio)"
  BENCH_RC=3
fi
if [[ -n "$GPU_NAME" && "$BUILD_RC" == 0 && -x "$BUILD/mnist_train" ]]; then
  if [[ -z "$DATA_DIR" ]]; then
    DATA_DIR="$WORK/synthetic"
    DATA_LABEL="synthetic IDX files (random uint8 images and labels, MNIST's shape), written by gpu_check"
    mkdir -p "$DATA_DIR"
    "$PY" - "$DATA_DIR" <<'PY' || log "warning: writing synthetic IDX files failed"
import gzip, os, struct, sys
import numpy as np
rng = np.random.default_rng(42)
for prefix, n in (("train", 60000), ("t10k", 10000)):
    with gzip.open(os.path.join(sys.argv[1], f"{prefix}-images-idx3-ubyte.gz"), "wb", 1) as f:
        f.write(struct.pack(">HBBIII", 0, 8, 3, n, 28, 28) + rng.integers(0, 256, (n, 784), dtype=np.uint8).tobytes())
    with gzip.open(os.path.join(sys.argv[1], f"{prefix}-labels-idx1-ubyte.gz"), "wb", 1) as f:
        f.write(struct.pack(">HBBI", 0, 8, 1, n) + rng.integers(0, 10, n, dtype=np.uint8).tobytes())
PY
  fi
  log "data: $DATA_LABEL"
  HAVE_RT=0
  [[ "$BUILD_RC" == 0 && -x "$BUILD/mnist_train" ]] && HAVE_RT=1
  OPT=(--optimizer sgd --lr 0.01 --momentum "$MOMENTUM" --seed 42)
  declare -A LONG_STEPS
  # ringtrain_run NAME FLAGS BATCH STEPS ROUND TAG: one mnist_train run; prints "steps step_ms"
  ringtrain_run() {
    local name="$1" flags="$2" batch="$3" steps="$4" round="$5" tag="$6"
    local base="ringtrain-$name-b$batch-r$round-$tag" rc
    mem_start "$LOGS/$base.mem"
    # shellcheck disable=SC2086 # FLAGS is a word list on purpose
    rt timeout "$(limit 90)" "$BUILD/mnist_train" --device "$DEVICE" --data-dir "$DATA_DIR" $flags \
      --batch-size "$batch" --steps "$steps" "${OPT[@]}" --log-every 0 --eval-every 0 \
      --metrics-out "$LOGS/$base.jsonl" >"$LOGS/$base.log" 2>&1
    rc=$?
    mem_stop "$LOGS/$base.mem" >"$LOGS/$base.mempeak"
    if [[ $rc != 0 ]]; then
      log "ringtrain $name batch $batch ($tag, $steps steps): FAILED (exit $rc): $(grep -iE 'error|fail|what' "$LOGS/$base.log" | tail -n 2 | tr '\n' ' ')"
      return 1
    fi
    local run_steps start_step step_ms images_per_sec
    read -r run_steps start_step step_ms images_per_sec < <(python3 \
      "$ROOT/scripts/summary_field.py" "$LOGS/$base.jsonl" steps start_step step_ms \
      images_per_sec) || return 1
    echo "$((run_steps - start_step)) $step_ms $images_per_sec $(cat "$LOGS/$base.mempeak")"
  }
  # steps_for SECONDS SHORT_MS SHORT_STEPS LONG_MS LONG_STEPS: steps that train for about SECONDS.
  # Without a long run (LONG_STEPS 0): from the short run's mean step, warm-up included (too
  # few steps). With one: 0 when its steps, at the warm-up-free rate (long less short run),
  # took at least half of SECONDS; else the steps that this rate says fill SECONDS.
  steps_for() {
    python3 - "$@" "$SHORT_STEPS" <<'PY'
import sys
sec, sms, ss, lms, ls, short = map(float, sys.argv[1:7])
cap = 2_000_000
if ls == 0:
    print(int(min(max(sec * 1000 / max(sms, 1e-4), 4 * short), cap)))
else:
    dt = (ls * lms - ss * sms) / 1000 / max(ls - ss, 1)  # seconds per step, warm-up excluded
    if dt <= 0:  # noise larger than the difference: fall back to the long run's mean step
        dt = lms / 1000
    if ls * dt >= sec / 2:
        print(0)
    else:
        print(int(min(max(sec / max(dt, 1e-7), ls * 2), cap)))
PY
  }
  round_secs=0
  for ((round = 1; round <= REPS; round++)); do
    if ((round > 1 && $(left) - 30 < round_secs)); then
      log "timings: stopping after $((round - 1)) round(s): $(left) s left, a round took $round_secs s"
      break
    fi
    r0=$SECONDS
    # PyTorch first: its 6 configurations are the reference every ringtrain row needs, so a
    # round cut short by the budget still yields ratios.
    if (($(left) < 45)); then log "timings: budget spent, skipping PyTorch round $round"; BENCH_RC=3; break; fi
    # PyTorch: each model and batch once (variants are ringtrain's)
    cfgs="$(for cfg in "${CONFIGS[@]}"; do IFS='|' read -r name _ batch <<<"$cfg"; printf '%s:%s\n' "${name%%+*}" "$batch"; done | awk '!seen[$0]++' | paste -sd, -)"
    PYTHONUNBUFFERED=1 timeout "$(limit 150)" "$PY" "$ROOT/scripts/bench_gpu_torch.py" --device "$DEVICE" \
      --configs "$cfgs" --data-dir "$DATA_DIR" --seconds "$SECONDS_PER_RUN" --reps 1 --warmup 30 \
      --momentum "$MOMENTUM" --lr 0.01 --seed 42 --idle-mem-mib "${GPU_MEM_IDLE:-0}" \
      >"$LOGS/pytorch-r$round.csv" 2>"$LOGS/pytorch-r$round.log"
    rc=$?
    [[ -z "$TORCH_INFO" ]] && TORCH_INFO="$(grep -m1 '^# bench_gpu_torch:' "$LOGS/pytorch-r$round.log" | sed 's/^# bench_gpu_torch: //')"
    if [[ $rc != 0 ]]; then
      log "PyTorch round $round: FAILED (exit $rc): $(tail -n 3 "$LOGS/pytorch-r$round.log" | tr '\n' ' ')"
      BENCH_RC=3
    fi
    python3 - "$LOGS/pytorch-r$round.csv" "$round" >>"$RESULTS" <<'PY'
import csv, sys
try:
    rows = list(csv.DictReader(open(sys.argv[1])))
except OSError:
    rows = []
for r in rows:
    print(f"pytorch,{r['model']},{r['batch']},{sys.argv[2]},{r['steps']},{r['images_per_sec']},{r['step_ms']},ok,{r.get('gpu_mem_mib', '')}")
PY
    log "PyTorch round $round: $(grep -vc '^framework' "$LOGS/pytorch-r$round.csv" 2>/dev/null || true) configurations timed"
    if [[ "$HAVE_RT" == 1 ]]; then
      for cfg in "${CONFIGS[@]}"; do
        IFS='|' read -r name flags batch <<<"$cfg"
        key="$name-$batch"
        if (($(left) < 40)); then log "timings: budget spent, skipping ringtrain $key"; BENCH_RC=3; continue; fi
        # short run: warm-up reference (and, in round 1, the calibration of the long run's steps)
        if ! short="$(ringtrain_run "$name" "$flags" "$batch" "$SHORT_STEPS" "$round" short)"; then
          echo "ringtrain,$name,$batch,$round,$SHORT_STEPS,,,failed," >>"$RESULTS"; BENCH_RC=3; continue
        fi
        read -r s_steps s_ms _ <<<"$short"
        # the long run: sized in round 1 from the short run, then, while it trains for less than
        # half the target, resized from its own warm-up-free rate (at most twice)
        fresh=0
        if [[ -z "${LONG_STEPS[$key]:-}" ]]; then
          LONG_STEPS[$key]="$(steps_for "$SECONDS_PER_RUN" "$s_ms" 0 0 0)"
          fresh=1
        fi
        tries=0
        while :; do
          n="${LONG_STEPS[$key]}"
          if ! long="$(ringtrain_run "$name" "$flags" "$batch" "$n" "$round" long)"; then
            long=""; break
          fi
          read -r l_steps l_ms l_ips l_mem <<<"$long"
          more="$(steps_for "$SECONDS_PER_RUN" "$s_ms" "$s_steps" "$l_ms" "$l_steps")"
          if [[ "$fresh" == 1 && $tries -lt 2 && "$more" -gt "$n" ]] && (($(left) > 45)); then
            log "ringtrain $name batch $batch: $n steps, warm-up excluded, took under half of ${SECONDS_PER_RUN} s; again with $more"
            LONG_STEPS[$key]="$more"; tries=$((tries + 1)); continue
          fi
          break
        done
        if [[ -z "$long" ]]; then
          echo "ringtrain,$name,$batch,$round,$n,,,failed," >>"$RESULTS"; BENCH_RC=3; continue
        fi
        steady="$(python3 -c "
import sys
ls, lms, ss, sms, b = map(float, sys.argv[1:6])
dt = (ls * lms - ss * sms) / 1000.0
print(f'{(ls - ss) * b / dt:.1f}' if dt > 0 and ls > ss else '')" "$l_steps" "$l_ms" "$s_steps" "$s_ms" "$batch")"
        echo "ringtrain,$name,$batch,$round,$l_steps,$l_ips,$l_ms,ok,${l_mem:-}" >>"$RESULTS"
        echo "ringtrain-steady,$name,$batch,$round,$((l_steps - s_steps)),$steady,,ok," >>"$RESULTS"
        log "ringtrain $name batch $batch round $round: $(printf '%.0f' "$l_ips") img/s over $l_steps steps (all timed), ${steady%.*} img/s without warm-up"
      done
    fi
    round_secs=$((SECONDS - r0))
  done
  rounds_done=$(awk -F, 'NR > 1 && $8 == "ok" { if ($4 > m) m = $4 } END { print m + 0 }' "$RESULTS")
  [[ "${PHASE[timings]}" == "not run" ]] && PHASE[timings]="$rounds_done round(s) of $REPS"
  ((rounds_done > 0)) || BENCH_RC=3
fi

# ------------------------------------------------------------------ profiles for the scaling model
# One traced run per model at batch 128 (--timeline), for scripts/predict_scaling
# --profile MODEL=FILE (docs/scaling-model.md): compute times measured on this GPU instead of
# the arithmetic's. Last, since nothing above needs it; skipped when the budget is spent.
if [[ -n "$GPU_NAME" && "${HAVE_RT:-0}" == 1 ]]; then
  for spec in "mlp|--model mlp" "cnn|--model cnn" "wide|--model mlp --hidden 4096,4096"; do
    IFS='|' read -r name flags <<<"$spec"
    if (($(left) < 40)); then log "profiles: budget spent, skipping $name"; continue; fi
    # shellcheck disable=SC2086 # FLAGS is a word list on purpose
    rt timeout "$(limit 60)" "$BUILD/mnist_train" --device "$DEVICE" --data-dir "$DATA_DIR" $flags \
      --batch-size 128 --steps 30 "${OPT[@]}" --log-every 0 --eval-every 0 \
      --timeline "$LOGS/profile-$name.json" >"$LOGS/profile-$name.log" 2>&1 &&
      python3 "$ROOT/scripts/scaling_model.py" profile "$LOGS/profile-$name.json" \
        >"$LOGS/profile-$name.profile" 2>>"$LOGS/profile-$name.log"
    log "profile $name: $([[ -s "$LOGS/profile-$name.profile" ]] && echo "ok: $LOGS/profile-$name.profile" || echo "FAILED: see logs/profile-$name.log")"
  done
fi

# ------------------------------------------------------------------ report
cp "$RESULTS" "$OUTDIR/gpu_check.csv"
GC_DATE="$(date -u '+%Y-%m-%d %H:%M UTC')"
GC_ELAPSED="$(elapsed)"
GC_HOST="$(hostname 2>/dev/null || cat /proc/sys/kernel/hostname)"
GC_GIT="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
GC_DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)"
GC_NVCC="$("${NVCC:-nvcc}" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
GC_DEVICE="$DEVICE"
export GC_DATE GC_DEVICE GC_ELAPSED GC_HOST GC_GIT GC_DRIVER GC_NVCC GC_GPU="${GPU_NAME:-none}" GC_QUICK="$QUICK" \
  GC_DATA="${DATA_LABEL:-none}" GC_TORCH="${TORCH_INFO:-not run}" GC_SECONDS="$SECONDS_PER_RUN" \
  GC_REPS="$REPS" GC_MOMENTUM="$MOMENTUM" \
  GC_BUILD="${PHASE[build]}" GC_TESTS="${PHASE[gpu_tests]}" GC_CTEST="${PHASE[gpu_ctest]}" \
  GC_SMOKE="${PHASE[cpu_smoke]}" GC_DEPS="${DEPS_MISSING:-none}" GC_TIMINGS="${PHASE[timings]}" GC_SHORT="$SHORT_STEPS" \
  GC_PARITY="${PHASE[parity]}" GC_EPOCH="${PHASE[epoch]}" GC_RANKS="${PHASE[ranks]}" GC_MEM_IDLE="${GPU_MEM_IDLE:-?}"
python3 - "$RESULTS" >"$OUTDIR/gpu_check.md" <<'PY'
import csv, os, statistics, sys
e = os.environ
runs = {}
mems = {}
for r in csv.DictReader(open(sys.argv[1])):
    if r["status"] == "ok" and r["images_per_sec"]:
        runs.setdefault((r["model"], int(r["batch"])), {}).setdefault(r["side"], []).append(float(r["images_per_sec"]))
    if r["status"] == "ok" and r.get("gpu_mem_mib"):
        mems.setdefault((r["model"], int(r["batch"])), {}).setdefault(r["side"], []).append(float(r["gpu_mem_mib"]))
def mem(key, side):
    v = mems.get(key, {}).get(side, [])
    return f"{max(v):,.0f}" if v else "-"
def target_for(base, variants, batch):
    """The issue's targets: 3x PyTorch eager for the launch-bound mlp and cnn at batch 128 with
    graphs and data on the GPU; 1x for the GEMM-bound wide MLP."""
    if base == "mlp-wide":
        return 1.0
    if batch == 128 and "graphs" in variants and "gpudata" in variants:
        return 3.0
    return None
def cell(v):
    if not v:
        return "-"
    return f"{statistics.median(v):,.0f}" + (f" ({min(v):,.0f}-{max(v):,.0f})" if len(v) > 1 else "")
out = ["# gpu_check: ringtrain on one GPU against PyTorch eager", ""]
if e["GC_DEVICE"] != "cuda":
    out += [f"**Test mode (GPU_CHECK_DEVICE={e['GC_DEVICE']}): both sides ran on that device; "
            "these figures check the script, they are not GPU measurements.**", ""]
if e["GC_QUICK"] == "1":
    out += ["**Quick mode (--quick): smoke-test figures, not a measurement.**", ""]
out += [f"- Date: {e['GC_DATE']}; host {e['GC_HOST']}; ringtrain {e['GC_GIT']}",
        f"- GPU: {e['GC_GPU']} (driver {e['GC_DRIVER'] or '?'}); nvcc {e['GC_NVCC'] or '?'}",
        f"- PyTorch: {e['GC_TORCH']}",
        f"- Data: {e['GC_DATA']}; SGD lr 0.01 momentum {e['GC_MOMENTUM']}, seed 42",
        f"- Dependencies not found before configuring: {e['GC_DEPS']}",
        f"- Build (-DRINGTRAIN_CUDA=ON, build-gpu-check/): {e['GC_BUILD']}",
        f"- GPU tests (ringtrain_gpu_tests): {e['GC_TESTS']}",
        f"- Other GPU tests under ctest: {e['GC_CTEST']}",
        f"- GPU equals CPU (50 steps, max |gpu - cpu| <= 1e-3): {e['GC_PARITY'] or 'not run'}",
        f"- One epoch, test accuracy within 0.3 points: {e['GC_EPOCH'] or 'not run'}",
        f"- Two or more ranks: {e['GC_RANKS'] or 'not run'}",
        *([f"- No GPU: {e['GC_SMOKE']}"] if e.get("GC_SMOKE") else []),
        f"- Timings: {e['GC_TIMINGS']}; whole script {e['GC_ELAPSED']} s",
        ""]
if runs:
    out += ["| model | batch | ringtrain img/s | PyTorch eager img/s | ratio | target | met? "
            "| ringtrain img/s, warm-up excluded | its ratio | ringtrain ms/step "
            "| GPU MiB ringtrain / PyTorch |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {"mlp": 0, "cnn": 1, "mlp-wide": 2}
    variant_flags = {"graphs": "--cuda-graphs", "gpudata": "--data-on-gpu",
                     "cudnn": "--conv-impl cudnn"}
    ours_keys = [k for k in runs if "ringtrain" in runs[k] or "ringtrain-steady" in runs[k]]
    for (model, batch) in sorted(ours_keys, key=lambda k: (order.get(k[0].split("+")[0], 9), k[1], k[0])):
        s = runs[(model, batch)]
        base, *variants = model.split("+")
        ours, steady = s.get("ringtrain", []), s.get("ringtrain-steady", [])
        torch = runs.get((base, batch), {}).get("pytorch", [])
        ratio = statistics.median(ours) / statistics.median(torch) if ours and torch else None
        ratio2 = statistics.median(steady) / statistics.median(torch) if steady and torch else None
        goal = target_for(base, variants, batch)
        target = f"{goal:g}x" if goal else "-"
        met = "-" if ratio is None or goal is None else ("yes" if ratio >= goal else "no")
        ms = f"{batch * 1000.0 / statistics.median(ours):.3f}" if ours else "-"
        name = " ".join(["mlp --hidden 4096,4096" if base == "mlp-wide" else base]
                        + [variant_flags.get(v, "+" + v) for v in variants])
        out.append(f"| {name} | {batch} | {cell(ours)} | {cell(torch)} | "
                   f"{f'{ratio:.2f}x' if ratio else '-'} | {target} | {met} | {cell(steady)} | "
                   f"{f'{ratio2:.2f}x' if ratio2 else '-'} | {ms} | "
                   f"{mem((model, batch), 'ringtrain')} / {mem((base, batch), 'pytorch')} |")
    out += ["",
            f"Medians over rounds (min-max in brackets). Each round runs every configuration once on "
            f"each side, PyTorch first. ringtrain: `mnist_train --device cuda` with "
            f"--steps sized to about {e['GC_SECONDS']} s, images/s from its --metrics-out summary "
            f"(every step timed, the first ones included); the warm-up-excluded column is "
            f"(long - short run steps) x batch / (long - short run training time), the short run "
            f"having {e['GC_SHORT']} steps. PyTorch: scripts/bench_gpu_torch.py, eager mode, data "
            f"on the GPU before timing, 30 untimed warm-up steps, then about {e['GC_SECONDS']} s "
            f"between torch.cuda.synchronize() calls. The ratio and the target use ringtrain's "
            f"own figure (warm-up included), the stricter of the two. Targets: 3x for the mlp "
            f"and cnn at batch 128 with --cuda-graphs --data-on-gpu, 1x for the wide MLP. GPU "
            f"MiB: the device's memory in use less the idle {e['GC_MEM_IDLE']} MiB, the CUDA "
            f"context included: ringtrain's peak of nvidia-smi's memory.used sampled every "
            f"100 ms through its long runs; PyTorch's total - free after its timed windows."]
else:
    out.append("No timing completed: see gpu_check.log.")
print("\n".join(out))
PY
# allreduce_bench's tables, as it printed them
for f in "$LOGS"/allreduce-np*.log; do
  [[ -f "$f" ]] || continue
  { echo; echo "## $(basename "$f" .log)"; echo; echo '```'; cat "$f"; echo '```'; } >>"$OUTDIR/gpu_check.md"
done
tee -a "$MAINLOG" <"$OUTDIR/gpu_check.md" >&2
log "wrote $OUTDIR/gpu_check.md, gpu_check.csv, gpu_check.log, gpu_check_logs.tar.gz"

if [[ "$BUILD_RC" != 0 ]]; then exit 1; fi
if [[ "$TESTS_RC" != 0 ]]; then exit 2; fi
if [[ -z "$GPU_NAME" ]]; then exit 0; fi
exit "$BENCH_RC"
