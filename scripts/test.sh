#!/usr/bin/env bash
# The test command: builds, then runs every GPU test (each reports "skipped"
# where no Hopper GPU exists), the Python tests where torch imports, and every
# CPU test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
source scripts/env.sh 2>/dev/null

if [ "$MOK_PRESET" = default ]; then
  echo "== C++ tests: gpu label (serial; skipped without a Hopper GPU)"
  ctest --test-dir "$MOK_BUILD_DIR" -L gpu --output-on-failure
fi

if python3 -c "import torch" 2>/dev/null && [ -d python/tests ]; then
  echo "== Python tests"
  python3 -m pytest -q python/tests
else
  echo "== Python tests: skipped (torch is not installed here)"
fi

# Last, so that the closing summary is the CPU suite every machine runs.
echo "== C++ tests: cpu label"
ctest --test-dir "$MOK_BUILD_DIR" -L cpu -j "$MOK_JOBS" --output-on-failure
