#!/usr/bin/env bash
# One device call for the fused backward: build (the torch front included),
# its GPU tests and pytest, then its speed -- mok_cli --backward (where the
# time goes) and bench_backward.py against the torch-native autograd, with
# the fused backward and with the staged one (MOK_BACKWARD=staged) in the same
# call. Each step has its own time limit; logs go to $OUT (or ./out).
#
#   scripts/device_backward.sh            (carry .deps for googletest)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export MOK_LIB_DIR=$PWD/build/python PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
gtest=(); [ -d .deps/googletest ] && gtest=(-DMOK_GTEST_SOURCE=$PWD/.deps/googletest)
t0=$(date +%s)
cmake --preset default "${gtest[@]}" -DMOK_TORCH=ON >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
step() {  # step NAME SECONDS COMMAND...: runs it, keeps its log, prints its tail
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "==== $name (rc=$?)"; grep -v -i "warn" "$OUT/$name.log" | tail -"${TAIL:-12}"
}
TAIL=4 step gtest 120 build/tests/mok_gpu_tests --gtest_filter='FusedBackward*:FusedForward*:BackwardComposition*'
TAIL=6 step pytest 200 python3 -m pytest -q -p no:cacheprovider python/tests/test_fused_backward.py \
  python/tests/test_backward_gpu.py
TAIL=16 step cli 90 build/tools/mok_cli --backward --iterations 10
TAIL=6 step bench_fused 150 python3 bench/bench_backward.py --quick --save --no-profile --backward fused
TAIL=6 step bench_staged 150 python3 bench/bench_backward.py --quick --save --no-profile --backward staged
