#!/usr/bin/env bash
# One device call for branch gathered-rows: build (the torch front and the
# tests), the gathered-load tests first -- they settle whether one-row TMA
# boxes land where whole boxes would (gemm/gathered_rows.cuh) -- then the
# backward's other GPU tests, then bench_backward's save mode with the
# staged backward's gathered copies (MOK_GATHER_ON_LOAD=0, main's path) and
# with rows read through the index (=1), alternated, and one profiled step
# of each. Logs in $OUT; the summary lines are printed as they come.
#
#   scripts/device_gather_ab.sh        carry [".deps"]
#   MOK_ROUNDS=2                       alternations of the two paths
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export MOK_LIB_DIR=$PWD/build/python PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
gtest=(); [ -d .deps/googletest ] && gtest=(-DMOK_GTEST_SOURCE=$PWD/.deps/googletest)
t0=$(date +%s)
cmake --preset default "${gtest[@]}" -DMOK_TORCH=ON >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build -j"$(nproc)" --target mok_gpu_tests mok_torch >"$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

step() {  # step NAME SECONDS COMMAND...: runs it, keeps its log, prints its last lines
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "==== $name (rc=$?)"; tail -4 "$OUT/$name.log"
}
step gtests_gathered 120 build/tests/mok_gpu_tests --gtest_brief=1 --gtest_filter='GatheredRows.*'
step pytest_gathered 120 python3 -m pytest -q -p no:cacheprovider python/tests/test_gathered_rows_gpu.py
step gtests_backward 200 build/tests/mok_gpu_tests --gtest_brief=1 \
  --gtest_filter='WeightGrad.*:SwigluBackward.*:BackwardComposition.*:FusedBackward.*:GroupedGemm*'
step pytest_backward 200 python3 -m pytest -q -p no:cacheprovider python/tests/test_backward_gpu.py \
  python/tests/test_save_mode.py python/tests/test_backward_ops.py
for round in $(seq 1 "${MOK_ROUNDS:-2}"); do
  for gather in 0 1; do
    MOK_GATHER_ON_LOAD=$gather step bench_gather${gather}_$round 150 \
      python3 bench/bench_backward.py --quick --save --no-profile
  done
done
for gather in 0 1; do
  MOK_GATHER_ON_LOAD=$gather step breakdown_gather$gather 150 \
    python3 bench/bench_backward.py --quick --save --no-profile --breakdown
  grep -E "^ +[0-9.]+ +[0-9.]+ +[0-9.]+  |GPU busy" "$OUT/breakdown_gather$gather.log" | head -20
done
