#!/usr/bin/env bash
# One call on the device machine (a Hopper GPU with torch): build everything
# (the torch front included), run the GPU tests and pytest, optionally
# compute-sanitizer on some GPU tests, and -- given a baseline mok_cli built
# from another commit -- compare the fused forward's output bits and speed
# against it: bits on a list of layers, worlds and option sets; speed in
# alternating rounds (baseline, this build, baseline, ...) on the presets.
# Logs go to $OUT (or ./out); the summary is printed last.
#
#   scripts/device_check.sh [tests] [memcheck] [racecheck] [bits] [speed]
#   MOK_BASELINE_CLI=path/to/mok_cli   the baseline for 'bits' and 'speed'
#   MOK_SANITIZE='Filter*'             GPU tests for memcheck / racecheck (gtest filter)
#   MOK_BASELINE_GPU_TESTS=path        a baseline's mok_gpu_tests: racecheck runs on it too, so a
#                                      report can be told apart from one the baseline already has
#   MOK_ROUNDS=3                       alternations per preset for 'speed'
#   MOK_NEW_CLI=path/to/mok_cli        'bits' and 'speed' against this prebuilt mok_cli instead of
#                                      the tree's own build; without 'tests' or a sanitizer step
#                                      nothing is built (an A/B of two carried builds)
#
# A baseline is a mok_cli built here from another commit and carried along:
#   git worktree add /tmp/base COMMIT && (cd /tmp/base && scripts/build.sh)
#   mkdir -p .baseline && cp /tmp/base/build/tools/mok_cli .baseline/ && echo /.baseline/ >> .git/info/exclude
# then run with carry [".baseline", ".deps"] (.deps/googletest: a copy of
# /usr/src/googletest, which the device machine lacks).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=" $* "; [ $# -eq 0 ] && steps=" tests "
summary=()
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"

needs_build=1
if [ -n "${MOK_NEW_CLI:-}" ] && [[ $steps != *" tests "* && $steps != *" memcheck "* && $steps != *" racecheck "* ]]; then
  needs_build=0
fi
t0=$(date +%s)
if [ $needs_build = 1 ]; then
  gtest=(); [ -d .deps/googletest ] && gtest=(-DMOK_GTEST_SOURCE=$PWD/.deps/googletest)
  if ! cmake --preset default "${gtest[@]}" -DMOK_TORCH=ON >"$OUT/configure.log" 2>&1; then
    echo "configure with torch failed; without:"; tail -5 "$OUT/configure.log"
    cmake --preset default "${gtest[@]}" -DMOK_TORCH=OFF >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  fi
  cmake --build build -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
  summary+=("build: $(( $(date +%s) - t0 )) s; $(grep -c 'spill' "$OUT/build.log") spill warnings")
fi

if [[ $steps == *" tests "* ]]; then
  timeout 420 ctest --test-dir build -L gpu --output-on-failure >"$OUT/gpu_tests.log" 2>&1
  summary+=("gpu tests rc=$?: $(grep -E 'tests passed|tests failed' "$OUT/gpu_tests.log" | tail -1)")
  grep -E "\*\*\*Failed|Failed  |Exception|Timeout" "$OUT/gpu_tests.log" | head -20
  if [ -f build/python/libmok_torch.so ]; then
    MOK_LIB_DIR=$PWD/build/python PYTHONPATH=$PWD/python timeout 300 python3 -X faulthandler -m pytest -q \
      -p no:cacheprovider python/tests >"$OUT/pytest.log" 2>&1
    summary+=("pytest rc=$?: $(tail -1 "$OUT/pytest.log")")
    grep -E "FAILED|Error" "$OUT/pytest.log" | head -20
  fi
fi

for tool in memcheck racecheck; do
  if [[ $steps == *" $tool "* ]] && [ -n "${MOK_SANITIZE:-}" ]; then
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/mok_gpu_tests --gtest_color=no \
      --gtest_filter="$MOK_SANITIZE" >"$OUT/$tool.log" 2>&1
    summary+=("$tool rc=$? on '$MOK_SANITIZE': $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)")
    if [ "$tool" = racecheck ] && [ -x "${MOK_BASELINE_GPU_TESTS:-}" ]; then
      timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$MOK_BASELINE_GPU_TESTS" --gtest_color=no \
        --gtest_filter="$MOK_SANITIZE" >"$OUT/racecheck_baseline.log" 2>&1
      summary+=("racecheck (baseline) rc=$?: $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck_baseline.log" | tail -1)")
    fi
  fi
done

new=${MOK_NEW_CLI:-build/tools/mok_cli}
if [[ $steps == *" bits "* ]] && [ -x "${MOK_BASELINE_CLI:-}" ]; then
  bits() { "$1" --iterations 2 "${@:2}" 2>&1 | grep -o "fnv1a64 [0-9a-f]*" | head -1; }
  mismatches=0
  while read -r args; do
    [ -z "$args" ] && continue
    a=$(bits "$MOK_BASELINE_CLI" $args); b=$(bits "$new" $args)
    same=$([ -n "$a" ] && [ "$a" = "$b" ] && echo same || echo DIFFERENT)
    [ "$same" = same ] || mismatches=$((mismatches + 1))
    echo "bits $same: $args ($a / $b)" | tee -a "$OUT/bits.log"
  done <<'LIST'
--preset small --world 1 --tokens 300
--preset small --world 2 --tokens-per-rank 300,0
--preset small --world 4 --tokens 200 --routing skewed
--preset medium --world 1 --tokens 2000 --minibatch-rows 256 --ring-slots 1
--preset medium --world 2 --tokens 1500 --routing same --lookahead 1
--preset no-shared --world 2 --tokens 999 --comm-ctas 3
--preset medium --world 8 --tokens 512 --ring-slots 2
--preset deepseek-v3-ep8-slice
--preset qwen3-235b-ep8-slice --routing skewed
--preset mixtral-8x7b
--preset llama4-scout-ep2-slice --world 2
LIST
  summary+=("bits: $mismatches mismatches against the baseline (bits.log)")
fi
if [[ $steps == *" speed "* ]] && [ -x "${MOK_BASELINE_CLI:-}" ]; then
  # Each run prints the median of passes timed alone and the mean of passes
  # enqueued back to back; both are compared, baseline and this build in
  # alternating runs on the same synthetic data.
  times() { "$1" --iterations 40 "${@:2}" 2>&1 | sed -n 's/.*fused forward: \([0-9.]*\) ms.*back to back \([0-9.]*\) ms.*/\1 \2/p' | head -1; }
  for preset in ${MOK_PRESETS:-deepseek-v3-ep8-slice glm-4.5-ep8-slice qwen3-235b-ep8-slice}; do
    base=(); mine=()
    for ((i = 0; i < ${MOK_ROUNDS:-3}; i++)); do
      base+=("$(times "$MOK_BASELINE_CLI" --preset $preset)"); mine+=("$(times "$new" --preset $preset)")
    done
    line=$(python3 - "$(printf '%s;' "${base[@]}")" "$(printf '%s;' "${mine[@]}")" <<'PY'
import statistics, sys
def runs(arg): return [tuple(map(float, r.split())) for r in arg.split(';') if r.strip()]
b, m = runs(sys.argv[1]), runs(sys.argv[2])
out = []
for i, name in enumerate(("alone", "back to back")):
    bm, mm = statistics.median(r[i] for r in b), statistics.median(r[i] for r in m)
    out.append(f"{name}: baseline {bm:.3f} ms, this build {mm:.3f} ms, speed ratio {bm / mm:.4f}")
print("; ".join(out) + f" (runs {b} / {m})")
PY
)
    echo "speed $preset: $line" | tee -a "$OUT/speed.log"
    summary+=("speed $preset: ${line%% (runs*}")
  done
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
