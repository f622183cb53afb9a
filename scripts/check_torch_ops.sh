#!/usr/bin/env bash
# Compile-checks the PyTorch front (python/csrc/*.cpp) where torch is not
# installed: fetches the torch wheel the device machine runs (2.11.0; about
# 530 MB, once), keeps its headers only (in .torch-headers/, ignored by git;
# not under .deps/, which travels to the device machine) and runs the
# compiler with -fsyntax-only. It builds nothing and links nothing: on a machine with
# torch, scripts/build.sh builds the real extension. Exit status: nonzero on
# the first file that does not compile.
#
# usage: scripts/check_torch_ops.sh [torch version]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-2.11.0}"
dest=".torch-headers/$version"
if [ ! -d "$dest/torch/include" ]; then
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  mkdir -p "$dest"
  python3 -m pip download --quiet --no-deps --dest "$download" "torch==$version"
  wheel=$(ls "$download"/torch-"$version"-*.whl | head -1)
  python3 - "$wheel" "$dest" <<'EOF'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("torch/include/")])
EOF
fi
cuda_include=""
for c in /usr/local/cuda/include /usr/include; do
  if [ -f "$c/cuda_runtime_api.h" ]; then cuda_include="-I$c"; break; fi
done
for f in python/csrc/*.cpp; do
  echo "== $f"
  ${CXX:-g++} -std=c++20 -fsyntax-only -Wall -Wextra \
    -isystem "$dest/torch/include" -isystem "$dest/torch/include/torch/csrc/api/include" \
    $cuda_include -Iinclude -Isrc "$f"
done
echo "torch ops: every file compiles against torch $version's headers"
