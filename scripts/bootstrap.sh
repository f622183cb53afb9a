#!/usr/bin/env bash
# Installs what building and testing mok needs on a fresh Debian/Ubuntu
# machine, by package name, and only what is missing. Safe to run repeatedly.
set -euo pipefail

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v g++ >/dev/null || missing+=(g++)
command -v python3 >/dev/null || missing+=(python3)
if [ ! -f /usr/include/gtest/gtest.h ] && [ ! -d "$(dirname "$0")/../.deps/googletest" ]; then
  missing+=(libgtest-dev)
fi

if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "bootstrap: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "bootstrap: missing ${missing[*]}; install them (as root: apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

# nvcc lives outside PATH on many machines; the build finds it through PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "bootstrap: nvcc found at /usr/local/cuda/bin (add it to PATH to skip this note)"
fi
