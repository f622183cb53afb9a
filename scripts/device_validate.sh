#!/usr/bin/env bash
# One device call that validates what was written without a GPU and measures
# it: build, every GPU test and pytest (scripts/device_check.sh tests),
# compute-sanitizer memcheck on the newest GPU tests, then the measurements
# that wait for them: the fused backward alone (mok_cli --backward: time and
# where it goes) and through the autograd against the torch-native backward,
# fused and staged in the same call (bench_backward --backward). Each step
# has its own time limit, so one that hangs cannot take the others' time;
# logs go to $OUT (or ./out), a summary is printed last.
#
#   scripts/device_validate.sh            (carry .deps for googletest)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export MOK_LIB_DIR=$PWD/build/python PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
MOK_SANITIZE=${MOK_SANITIZE:-'FusedBackward.EdgeRoutings:FusedBackward.AWait*:FusedBackward.Tracing*'} \
  scripts/device_check.sh tests memcheck 2>&1 | tail -10
step() {  # step NAME SECONDS COMMAND...: runs it, keeps its log, prints its tail
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "==== $name (rc=$?)"; grep -v -i "warn" "$OUT/$name.log" | tail -"${TAIL:-12}"
}
# The whole call must fit the device tool's 600 s: about 200 s above, then these.
TAIL=16 step backward_cli 90 build/tools/mok_cli --backward --iterations 10
TAIL=6 step backward_fused 130 python3 bench/bench_backward.py --quick --save --no-profile --backward fused
TAIL=6 step backward_staged 130 python3 bench/bench_backward.py --quick --save --no-profile --backward staged
