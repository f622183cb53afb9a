#!/usr/bin/env bash
# The main job: builds, then runs the fused forward of the layer on the
# default preset (DeepSeek-V3's per-GPU share at EP 8: 4096 tokens, H 7168,
# I 2048, 32 experts, top-8, one shared expert) and reports its time. Where
# torch and a GPU exist it then runs the side-by-side benchmark against the
# torch-native pipeline. Without a Hopper GPU, mok_cli says so and runs the
# CPU reference on a small preset instead. Extra arguments go to mok_cli.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
source scripts/env.sh 2>/dev/null
"$MOK_BUILD_DIR/tools/mok_cli" "$@"
if [ $# -eq 0 ] && python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
   && [ -f "$MOK_BUILD_DIR/python/libmok_torch.so" ]; then
  echo "== side by side with the torch-native pipeline (bench/bench_fused_forward.py --quick)"
  MOK_LIB_DIR="$MOK_BUILD_DIR/python" python3 bench/bench_fused_forward.py --quick
fi
