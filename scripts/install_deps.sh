#!/usr/bin/env bash
# Installs ringtrain's build and test dependencies from Debian packages. Idempotent: when every
# package is already installed it only checks and exits (well under a second).
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libopenmpi-dev openmpi-bin      # MPI for the ring (mpirun, mpicxx)
  libeigen3-dev                   # CPU GEMM
  catch2                          # tests (v2: catch2/catch.hpp)
  libspdlog-dev libfmt-dev        # logging
  libcli11-dev                    # flags
  zlib1g-dev                      # .gz data files
  dataset-fashion-mnist           # the default data: /usr/share/datasets/fashion-mnist
  iproute2                        # ip, tc: the emulated cluster (scripts/netns_cluster.sh)
  openssh-server openssh-client   # sshd in namespaces: the multi-host ringrun test
  python3                         # scripts/ringrun
  clang libclang-rt-14-dev        # libFuzzer targets for the file parsers (fuzz/)
  libonnx-dev libprotobuf-dev     # --export-onnx: ONNX's protobuf classes and checker
  python3-opencv python3-torch    # the export test: OpenCV's DNN runs the ONNX file, PyTorch
                                  # loads the safetensors (about 170 MB download, 770 MB installed)
  python3-matplotlib              # scripts/plot_metrics and its test (about 50 MB download)
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists when they are missing or more than a day old.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n 1)" ]; then
  "${sudo[@]}" apt-get update -q
fi
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
