#!/usr/bin/env bash
# Configures and builds everything this machine can build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
source scripts/env.sh
cmake --preset "$MOK_PRESET" "${MOK_CMAKE_ARGS[@]}" "$@" >/dev/null
cmake --build --preset "$MOK_PRESET" -j "$MOK_JOBS"
