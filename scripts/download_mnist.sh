#!/usr/bin/env bash
# Downloads the four original MNIST files (.gz) and checks each against its published
# sha256; a file that does not match is deleted, so a data directory holds either verified
# files or none. Files that are already there and match are not downloaded again.
#
#   scripts/download_mnist.sh [DIR]        download into DIR (default: data/mnist in the
#                                          repository); mnist_train finds data/mnist by itself
#                                          when run from the repository root, else pass
#                                          --data-dir DIR or set RINGTRAIN_DATA=DIR
#   scripts/download_mnist.sh --verify DIR only check DIR (never writes to it)
#
# Mirrors are tried in order; RINGTRAIN_MNIST_MIRRORS (space-separated base URLs) replaces
# the list, e.g. for a local copy: RINGTRAIN_MNIST_MIRRORS=file:///srv/mnist/ (curl only).
set -euo pipefail

files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
       t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
declare -A sha256=(
  [train-images-idx3-ubyte.gz]=440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609
  [train-labels-idx1-ubyte.gz]=3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c
  [t10k-images-idx3-ubyte.gz]=8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6
  [t10k-labels-idx1-ubyte.gz]=f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6
)
default_mirrors="https://ossci-datasets.s3.amazonaws.com/mnist/ https://storage.googleapis.com/cvdf-datasets/mnist/"
read -r -a mirrors <<<"${RINGTRAIN_MNIST_MIRRORS:-$default_mirrors}"

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "download_mnist.sh: error: $*" >&2; exit 1; }

hash_of() {
  if command -v sha256sum >/dev/null; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    die "neither sha256sum nor shasum is installed: cannot verify the files"
  fi
}

# ok <file> <name>: whether <file> exists and has <name>'s published checksum.
ok() { [[ -f "$1" ]] && [[ "$(hash_of "$1")" == "${sha256[$2]}" ]]; }

# fetch <url> <out>: one attempt, quiet on success, the tool's own message on failure.
fetch() {
  if command -v curl >/dev/null; then
    curl --fail --location --silent --show-error --connect-timeout 20 --retry 2 -o "$2" "$1"
  elif command -v wget >/dev/null; then
    wget --no-verbose --timeout=20 --tries=3 -O "$2" "$1"
  else
    die "neither curl nor wget is installed: install one (apt-get install curl)"
  fi
}

verify_dir() {
  local dir=$1 bad=0 name
  [[ -d "$dir" ]] || die "$dir is not a directory"
  for name in "${files[@]}"; do
    if [[ ! -f "$dir/$name" ]]; then
      echo "MISSING  $dir/$name"
      bad=1
    elif ok "$dir/$name" "$name"; then
      echo "OK       $dir/$name"
    else
      echo "BAD      $dir/$name: sha256 $(hash_of "$dir/$name"), expected ${sha256[$name]}"
      bad=1
    fi
  done
  if ((bad)); then
    die "$dir does not hold the four verified MNIST files; run scripts/download_mnist.sh $dir"
  fi
  echo "all four MNIST files in $dir match their published sha256"
}

download_dir() {
  local dir=$1 name mirror part failures
  mkdir -p "$dir" || die "cannot create $dir"
  for name in "${files[@]}"; do
    if ok "$dir/$name" "$name"; then
      echo "have     $dir/$name (checksum OK)"
      continue
    fi
    if [[ -e "$dir/$name" ]]; then
      echo "deleting $dir/$name: its sha256 does not match, downloading it again"
      rm -f "$dir/$name"
    fi
    # Download beside the target and rename only once verified, so that an interrupted or
    # wrong download never sits under the real name.
    part="$dir/.$name.part"
    failures=""
    for mirror in "${mirrors[@]}"; do
      echo "fetching ${mirror}${name}"
      if ! fetch "${mirror}${name}" "$part"; then
        failures+=$'\n'"  ${mirror}${name}: download failed"
      elif ! ok "$part" "$name"; then
        failures+=$'\n'"  ${mirror}${name}: sha256 $(hash_of "$part") does not match ${sha256[$name]}"
      else
        mv -f "$part" "$dir/$name"
        break
      fi
      rm -f "$part"
    done
    if [[ ! -f "$dir/$name" ]]; then
      rm -f "$part"
      die "could not get a verified $name from any mirror:${failures}
Check the network (or a proxy: curl and wget honour https_proxy), or copy the four files
from a machine that has them into $dir and run: scripts/download_mnist.sh --verify $dir"
    fi
  done
  verify_dir "$dir"
}

case "${1:-}" in
  -h | --help) usage ;;
  --verify)
    [[ $# -eq 2 ]] || die "usage: scripts/download_mnist.sh --verify DIR"
    verify_dir "$2"
    ;;
  -*) die "unknown option $1 (see scripts/download_mnist.sh --help)" ;;
  *)
    [[ $# -le 1 ]] || die "usage: scripts/download_mnist.sh [DIR]"
    download_dir "${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/data/mnist}"
    ;;
esac
