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
# them in mok's kernels fails the build. (Only what this build recompiled is
# seen: a clean build, as in CI, sees every kernel.) tools/mok_wgmma_bench's
# own kernels are left out: they run the mainloops outside their kernels,
# where ptxas injects one wait (C7517) after the first stage's first wgmma,
# before the loop; each loop keeps exactly its source's waits (checked in
# its SASS, docs/perf-notes.md v9), and its output is its own check.
serialised=$(grep "C751[0-9]" "$MOK_BUILD_DIR/last_build.log" | grep -v "_mok_wgmma_bench_cu_" || true)
if [ -n "$serialised" ]; then
  echo "error: ptxas serialised wgmma in these kernels (see docs/gemm.md):" >&2
  echo "$serialised" | cut -c1-300 >&2
  exit 1
fi
