#!/usr/bin/env bash
# One device call comparing builds of the bf16 fused forward: for each
# directory holding a mok_cli built elsewhere (from some commit or branch),
# `mok_cli` on the same preset, the builds alternated for $MOK_ROUNDS rounds
# in separate processes, each printing its median pass time alone and back
# to back. A build's time moves with the clock from round to round, so read
# the rounds side by side, not one build's best against another's worst.
#
#   scripts/device_ab_forward.sh DIR [DIR ...]     e.g. build/tools .exp/f8
#   MOK_ROUNDS=3                                   alternations (default 3)
#   MOK_FWD_ARGS='--preset glm-4.5-ep8-slice'      extra mok_cli arguments for every build
#
# An old commit's mok_cli, built here and carried (carry [".exp"]):
#   git worktree add /tmp/wt-old COMMIT && cd /tmp/wt-old && cmake --preset default -DMOK_TORCH=OFF \
#     && cmake --build build -j"$(nproc)" --target mok_cli && mkdir -p /work/main/.exp/old \
#     && cp build/tools/mok_cli /work/main/.exp/old/
# (Only `--iterations` and the options given in MOK_FWD_ARGS are passed: an
# old mok_cli may not know newer ones.)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
[ $# -ge 1 ] || { echo "usage: scripts/device_ab_forward.sh DIR [DIR ...]" >&2; exit 2; }
for round in $(seq 1 "${MOK_ROUNDS:-3}"); do
  for dir in "$@"; do
    name=$(echo "$dir" | tr '/.' '__')
    log="$OUT/fwd_${name}_$round.log"
    # shellcheck disable=SC2086
    timeout 150 "$dir/mok_cli" --iterations 20 ${MOK_FWD_ARGS:-} >"$log" 2>&1
    rc=$?
    line=$(grep -m1 -E "fused forward: " "$log" | sed 's/^\[[0-9/]*\] //')
    echo "round $round, $dir (rc=$rc): ${line:-no fused-forward line, see $log}"
  done
done
