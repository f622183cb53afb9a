#!/usr/bin/env bash
# One device call that validates what was written without a GPU and measures
# it: build, every GPU test and pytest (scripts/device_check.sh tests),
# compute-sanitizer memcheck on the newest GPU tests, then the measurements
# that wait for them -- the training-mode forward against the inference one
# (mok_cli --train), the staged backward in save mode (bench_backward --save
# --quick), and the FP8 grouped GEMM (bench_grouped_gemm_fp8). Each step has
# its own time limit, so one that hangs cannot take the others' time; logs go
# to $OUT (or ./out), a summary is printed last.
#
#   scripts/device_validate.sh            (carry .deps for googletest)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export MOK_LIB_DIR=$PWD/build/python PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
MOK_SANITIZE=${MOK_SANITIZE:-'FusedForwardTraining.*:GroupedGemmFp8.*'} \
  scripts/device_check.sh tests memcheck 2>&1 | tail -8
step() {  # step NAME SECONDS COMMAND...: runs it, keeps its log, prints its tail
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "==== $name (rc=$?)"; grep -v -i "warn" "$OUT/$name.log" | tail -"${TAIL:-12}"
}
# The whole call must fit the device tool's 600 s: about 150 s above, then these.
step train_forward 90 build/tools/mok_cli --preset deepseek-v3-ep8-slice --train --iterations 20
TAIL=24 step backward_save 150 python3 bench/bench_backward.py --quick --save --no-profile
TAIL=10 step fp8_gemm 150 python3 bench/bench_grouped_gemm_fp8.py
