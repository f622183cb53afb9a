#!/usr/bin/env bash
# One device-machine session for the GEMM engine: configure, build the GPU
# tests and the torch extension, run them, then the benchmark. Logs go to
# $OUT (or ./out). Usage: bench/run_on_device.sh [tests|bench|all] [bench args]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}; shift || true
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
gtest=(); [ -d .deps/googletest ] && gtest=(-DMOK_GTEST_SOURCE=$PWD/.deps/googletest)
t0=$(date +%s)
if ! cmake --preset default "${gtest[@]}" -DMOK_TORCH=ON -DMOK_PTXAS_VERBOSE=ON >"$OUT/configure.log" 2>&1; then
  echo "configure with torch failed; retrying without:"; tail -20 "$OUT/configure.log"
  cmake --preset default "${gtest[@]}" -DMOK_TORCH=OFF >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
fi
targets=(mok_gpu_tests); grep -q mok_torch build/build.ninja && targets+=(mok_torch)
cmake --build build -j16 --target "${targets[@]}" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
grep -E "registers|spill|C75" "$OUT/build.log" | sort | uniq -c
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
if [ "$what" != bench ]; then
  timeout 240 build/tests/mok_gpu_tests --gtest_color=no --gtest_filter='GroupedGemm.*' >"$OUT/gtest.log" 2>&1; rc=$?
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|error" "$OUT/gtest.log" | head -40
  echo "gtest rc=$rc"
  if [ -n "${MOK_SANITIZE:-}" ] && command -v compute-sanitizer >/dev/null; then
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/mok_gpu_tests --gtest_color=no \
      --gtest_filter="$MOK_SANITIZE" >"$OUT/memcheck.log" 2>&1
    echo "memcheck rc=$? ($MOK_SANITIZE)"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head -5
  fi
  if [ -f build/python/libmok_torch.so ]; then
    python3 -c "import torch; print('torch cxx11 abi:', torch._C._GLIBCXX_USE_CXX11_ABI)"
    grep -o "_GLIBCXX_USE_CXX11_ABI=[01]" build/build.ninja | sort | uniq -c
    timeout 120 python3 -X faulthandler -m pytest -v -p no:cacheprovider python/tests >"$OUT/pytest.log" 2>&1
    echo "pytest rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed|Fatal|File \"/work" "$OUT/pytest.log" | head -30
  fi
fi
if [ "$what" != tests ] && [ -f build/python/libmok_torch.so ]; then
  timeout 400 python3 bench/bench_grouped_gemm.py "$@" 2>&1 | tee "$OUT/bench.log"
  if [ -n "${MOK_EXTRA_BANDS:-}" ]; then  # tile-order experiment on the skewed shape
    for band in $MOK_EXTRA_BANDS; do
      echo "== MOK_GEMM_BAND=$band"
      MOK_GEMM_BAND=$band timeout 100 python3 bench/bench_grouped_gemm.py --shapes dsv3-skewed 2>&1 | tail -4
    done
  fi
fi
exit $rc
