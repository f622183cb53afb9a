#!/usr/bin/env bash
# One device call: Nsight Compute on one launch of a fused kernel, with the
# sections that say whether the tensor pipe is busy and where warps stall
# (the build has -lineinfo, so SourceCounters names source lines). Clocks
# are left alone (--clock-control none: the device README asks for it).
#
#   scripts/device_ncu.sh CLI [KERNEL_REGEX] [-- CLI ARGS...]
#     CLI            a mok_cli (built here and carried, or build/tools/mok_cli)
#     KERNEL_REGEX   matched against mangled kernel names (default: the FP8
#                    forward's, ForwardFp8Pass)
#     CLI ARGS       default: --fp8 --rounds 1 --iterations 1
#   e.g. scripts/device_ncu.sh .exp2/main/mok_cli
#        scripts/device_ncu.sh build/tools/mok_cli 'fused_forward_kernel.*ForwardPass' -- --rounds 1 --iterations 1
#
# Writes $OUT/ncu.txt (the whole report), $OUT/ncu_report.ncu-rep and
# $OUT/ncu_source.csv (per SASS instruction), and prints the lines that
# matter: duration and clock, the tensor pipe's share, issue slots, the top
# stall reason, and the instructions with the most stall samples.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
cli=${1:?usage: scripts/device_ncu.sh CLI [KERNEL_REGEX] [-- CLI ARGS...]}
shift
regex=ForwardFp8Pass
if [ $# -gt 0 ] && [ "$1" != "--" ]; then regex=$1; shift; fi
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--fp8 --rounds 1 --iterations 1)

timeout 400 ncu --clock-control none --kernel-name-base mangled -k "regex:$regex" --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SourceCounters --import-source yes \
  -o "$OUT/ncu_report" -f "$cli" "${args[@]}" >"$OUT/ncu_run.txt" 2>&1
echo "ncu rc=$? (report: ncu.txt, ncu_report.ncu-rep; per-instruction samples: ncu_source.csv)"
ncu -i "$OUT/ncu_report.ncu-rep" --page details >"$OUT/ncu.txt" 2>&1
# Per SASS instruction: where the warps were sampled stalled (the loop's
# barrier waits vs its wgmma waits vs its promotions), the top lines.
ncu -i "$OUT/ncu_report.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_source.csv" 2>&1 &&
  python3 scripts/ncu_top_stalls.py "$OUT/ncu_source.csv" 30
grep -E "^\s+(Duration|SM Frequency|Issue Slots Busy|L2 Cache Throughput)\b" "$OUT/ncu.txt"
grep -E "highest-utilized pipeline|stalled waiting|spends .* cycles being stalled" "$OUT/ncu.txt" | head -4
# SourceCounters' tables of the lines with the most warp stall samples.
grep -n -A12 -E "Warp Stall Sampling|most stall" "$OUT/ncu.txt" | head -40
