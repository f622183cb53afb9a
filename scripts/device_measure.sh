#!/usr/bin/env bash
# The second device call of a session, after device_validate.sh: the
# measurements that take longest. Issue 17's tuner gains -- mok_cli tune on
# each preset (and skewed routing), every candidate timed in paired rounds
# against the defaults -- then the FP8 benchmark against torch's rowwise FP8
# and the staged backward in recompute mode (device_validate.sh runs save
# mode). Each step has its own time limit;
# logs go to $OUT (or ./out). Expects the build of device_validate.sh in
# build/ (run that first in the same machine, or carry build/).
#
#   MOK_TUNE_BUDGET=40 scripts/device_measure.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export MOK_LIB_DIR=$PWD/build/python PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
[ -x build/tools/mok_cli ] || { echo "no build/tools/mok_cli: run scripts/device_validate.sh first"; exit 1; }
step() {  # step NAME SECONDS COMMAND...: runs it, keeps its log, prints its tail
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "==== $name (rc=$?)"; grep -v -i "warn" "$OUT/$name.log" | tail -"${TAIL:-6}"
}
budget=${MOK_TUNE_BUDGET:-40}
cache=$OUT/tuning.json
for preset in deepseek-v3-ep8-slice glm-4.5-ep8-slice qwen3-235b-ep8-slice; do
  TAIL=3 step "tune_$preset" $((budget + 40)) build/tools/mok_cli tune --preset $preset --budget "$budget" --cache "$cache"
done
TAIL=3 step tune_dsv3_skewed $((budget + 40)) build/tools/mok_cli tune --preset deepseek-v3-ep8-slice --routing skewed \
  --budget "$budget" --cache "$cache"
TAIL=12 step fp8_bench 150 python3 bench/bench_grouped_gemm_fp8.py
TAIL=8 step backward_recompute 150 python3 bench/bench_backward.py --quick --no-profile
