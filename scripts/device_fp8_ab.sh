#!/usr/bin/env bash
# One device call comparing builds of the fused FP8 forward: for each
# directory holding a mok_cli (and, optionally, a mok_gpu_tests) built
# elsewhere from some commit or branch, run its FusedForwardFp8.* tests,
# then `mok_cli --fp8` (rounds alternating with the bf16 forward of the same
# build, so each build's FP8 / bf16 ratio is its own) with one traced pass;
# print each build's result and, from its trace, where a GEMM CTA's time
# went and each kind's mainloop rate. Builds run one after the other: compare
# ratios more than times (the clock drifts between them).
#
#   scripts/device_fp8_ab.sh DIR [DIR ...]     e.g. build/tools .exp/xq .exp/off
#   MOK_FP8_ARGS='--preset ...'               extra mok_cli arguments for every build
#
# Build a branch's binaries here and carry them (carry [".exp"]):
#   git worktree add /work/wt-X BRANCH && cd /work/wt-X && cmake --preset default -DMOK_TORCH=OFF \
#     && cmake --build build -j16 && mkdir -p /work/main/.exp/X \
#     && cp build/tools/mok_cli build/tests/mok_gpu_tests /work/main/.exp/X/
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for dir in "$@"; do
  name=$(echo "$dir" | tr '/.' '__')
  echo "==== $dir"
  if [ -x "$dir/mok_gpu_tests" ]; then
    timeout 120 "$dir/mok_gpu_tests" --gtest_filter='FusedForwardFp8.*' >"$OUT/$name.tests.log" 2>&1
    echo "tests rc=$?: $(tail -1 "$OUT/$name.tests.log")"
  fi
  # shellcheck disable=SC2086
  timeout 150 "$dir/mok_cli" --fp8 --rounds 3 --iterations 10 ${MOK_FP8_ARGS:-} --trace "$OUT/$name.csv" \
    >"$OUT/$name.cli.log" 2>&1
  echo "mok_cli rc=$?"
  grep -E "comm_ctas|\[2/3\]|speedup|output bits" "$OUT/$name.cli.log"
  [ -f "$OUT/$name.csv" ] && python3 scripts/trace_summary.py "$OUT/$name.csv"
done
