#!/usr/bin/env bash
# One device call that validates what was written without a GPU and measures
# it: build, every GPU test and pytest (scripts/device_check.sh tests),
# compute-sanitizer memcheck on the newest GPU tests, then the measurements
# that wait for them: the FP8 grouped GEMMs alone (mok_gemm_bench: plain,
# plain with A multicast, SwiGLU and SwiGLU with h quantized, against bf16), the staged backward in
# save mode (bench_backward --quick --save) and the tuner's C++ path on a
# small preset. Each step has its own time limit, so one that hangs cannot
# take the others' time; logs go to $OUT (or ./out), a summary is printed last.
#
#   scripts/device_validate.sh            (carry .deps for googletest)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export MOK_LIB_DIR=$PWD/build/python PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
MOK_SANITIZE=${MOK_SANITIZE:-'GroupedGemmFp8.*:ZeroPadding.*:QuantizeRows.*'} \
  scripts/device_check.sh tests memcheck 2>&1 | tail -10
step() {  # step NAME SECONDS COMMAND...: runs it, keeps its log, prints its tail
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "==== $name (rc=$?)"; grep -v -i "warn" "$OUT/$name.log" | tail -"${TAIL:-12}"
}
# The whole call must fit the device tool's 600 s: about 200 s above, then these.
gemm() {
  local b=build/tools/mok_gemm_bench
  $b --element bf16 && $b --element fp8 && $b --element fp8 --multicast && $b --element bf16 --epilogue swiglu --n 2048 &&
    $b --element fp8 --epilogue swiglu --n 2048 && $b --element fp8 --epilogue swiglu-quantize --n 2048
}
export -f gemm
TAIL=6 step fp8_gemms 90 bash -c gemm
TAIL=24 step backward_save 150 python3 bench/bench_backward.py --quick --save --no-profile
rm -f /tmp/mok_tune_check.json*
step tune 60 build/tools/mok_cli tune --preset medium --tokens 1024 --budget 15 --cache /tmp/mok_tune_check.json
