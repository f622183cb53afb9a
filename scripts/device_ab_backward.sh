#!/usr/bin/env bash
# One device call that checks and measures a change to the backward against
# a baseline build: scripts/device_check.sh tests (build, GPU tests, pytest)
# and memcheck on $MOK_SANITIZE; then rounds alternating the baseline's
# binaries and this build's -- mok_cli --backward (the fused backward, fp32
# and bf16 weight gradients, and the traced pass) and mok_gemm_bench
# --weight-grad on the DeepSeek-V3 slice's dW13 and dW2 shapes (the
# standalone kernel the staged backward runs); then bench_backward through
# the autograd, fused and staged. Logs in $OUT; a summary last.
#
#   scripts/device_ab_backward.sh      carry [".baseline", ".deps"]
#   .baseline/mok_cli, .baseline/mok_gemm_bench: built from the baseline commit
#   MOK_ROUNDS=2                       alternations
#   MOK_WG=0                           skip the standalone weight-gradient rounds
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export MOK_LIB_DIR=$PWD/build/python PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
scripts/device_check.sh tests memcheck 2>&1 | tail -10
step() {  # step NAME SECONDS COMMAND...: runs it, keeps its log
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "==== $name (rc=$?)"
}
for round in $(seq 1 "${MOK_ROUNDS:-2}"); do
  for who in base new; do
    bin=build/tools; [ $who = base ] && bin=.baseline
    [ -x $bin/mok_cli ] || continue
    step cli_${who}_$round 90 $bin/mok_cli --backward --iterations 10
    grep -E "fused backward, " "$OUT/cli_${who}_$round.log"
    [ "${MOK_WG:-1}" = 0 ] && continue
    for shape in "--k 4096 --n 7168" "--k 7168 --n 2048"; do
      tag=$(echo $shape | tr -d ' -')
      step wg_${who}_${tag}_$round 60 $bin/mok_gemm_bench --weight-grad bf16 $shape --iterations 20
      grep "weight grad" "$OUT/wg_${who}_${tag}_$round.log"
    done
  done
done
echo "==== trace (this build)"; grep -v -i warn "$OUT/cli_new_1.log" | sed -n '/where the time goes/,/gradient bits/p'
for mode in fused staged; do
  step backward_$mode 130 python3 bench/bench_backward.py --quick --save --no-profile --backward $mode
  grep -v -i warn "$OUT/backward_$mode.log" | tail -4
done
