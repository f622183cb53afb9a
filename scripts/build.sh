#!/usr/bin/env bash
# Configures and builds everything this machine can build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
source scripts/env.sh
cmake --preset "$MOK_PRESET" "${MOK_CMAKE_ARGS[@]}" "$@" >/dev/null
mkdir -p "$MOK_BUILD_DIR"
cmake --build --preset "$MOK_PRESET" -j "$MOK_JOBS" 2>&1 | tee "$MOK_BUILD_DIR/last_build.log"
# ptxas serialising a kernel's wgmma (C7510..C7519: each wgmma then waits for
# the previous one) is an info line, not an error, and it once cost the FP8
# forward a third of its speed unnoticed (docs/perf-notes.md q7, q9). Any of
# them fails the build. (Only what this build recompiled is seen: a clean
# build, as in CI, sees every kernel.)
if grep -q "C751[0-9]" "$MOK_BUILD_DIR/last_build.log"; then
  echo "error: ptxas serialised wgmma in these kernels (see docs/gemm.md):" >&2
  grep "C751[0-9]" "$MOK_BUILD_DIR/last_build.log" | cut -c1-300 >&2
  exit 1
fi
