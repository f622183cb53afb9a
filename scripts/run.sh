#!/usr/bin/env bash
# The main job: builds, then runs the layer on the default preset and reports
# what it did and how long it took. Extra arguments go to mok_cli.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
source scripts/env.sh 2>/dev/null
"$MOK_BUILD_DIR/tools/mok_cli" "$@"
