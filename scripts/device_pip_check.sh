#!/usr/bin/env bash
# One device call: README's install path on a copy of the tree without build
# directories (what a fresh clone has): `python3 -m pip install
# --no-build-isolation .`, then `import mok` from another directory with no
# environment variable, then the Python tests against the installed package
# (python/tests/conftest.py picks it when no in-tree build exists).
#
#   scripts/device_pip_check.sh        logs in $OUT (or ./out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
copy=$(mktemp -d)/mok
mkdir -p "$copy"
tar --exclude=./build --exclude='./build-*' --exclude='./.exp*' --exclude=./out --exclude=./.deps -cf - . |
  (cd "$copy" && tar xf -)
unset MOK_LIB_DIR PYTHONPATH

t0=$(date +%s)
(cd "$copy" && python3 -m pip install --no-build-isolation . >"$OUT/pip_install.log" 2>&1)
echo "pip install rc=$? in $(( $(date +%s) - t0 )) s"
tail -2 "$OUT/pip_install.log"

(cd / && python3 -c "import mok, sys; print('import mok from /:', mok.__file__)")
echo "import rc=$?"

(cd /tmp && timeout 400 python3 -m pytest -q -p no:cacheprovider "$copy/python/tests" >"$OUT/pip_pytest.log" 2>&1)
echo "pytest against the installed package rc=$?: $(tail -1 "$OUT/pip_pytest.log")"
grep -E "FAILED|Error" "$OUT/pip_pytest.log" | head -20
