"""The SASS instructions with the most warp-stall samples, from
`ncu -i REPORT --page source --csv --print-source sass` (scripts/device_ncu.sh):
each with its share of all samples and its stall reasons' columns where the
CSV has them, so that a loop's barrier waits, wgmma waits and promotions can
be told apart.

  python3 scripts/ncu_top_stalls.py ncu_source.csv [N]
"""
from __future__ import annotations

import csv
import sys


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    lines = open(path, newline="").read().splitlines()
    # ncu may print notes before the table: the header is the first line with
    # a stall-sampling column.
    start = next((i for i, line in enumerate(lines) if "Stall Sampling" in line), None)
    if start is None:
        print(f"  no stall-sampling column in {path}; its first lines:")
        print("\n".join("    " + line[:160] for line in lines[:5]))
        return
    rows = list(csv.DictReader(lines[start:]))
    columns = rows[0].keys() if rows else []
    samples = next((c for c in columns if "Stall Sampling (All" in c), None) or next(
        c for c in columns if "Stall Sampling" in c)
    source = next((c for c in columns if c.strip().lower() in ("source", "sass")), None)
    address = next((c for c in columns if "Address" in c), None)
    total = sum(number(r[samples]) for r in rows) or 1.0
    print(f"  {len(rows)} instructions, {total:.0f} samples ('{samples}'); the top {top}:")
    for r in sorted(rows, key=lambda r: -number(r[samples]))[:top]:
        where = r.get(address, "") if address else ""
        text = (r.get(source, "") if source else "").strip()
        print(f"  {100 * number(r[samples]) / total:5.1f}%  {where:>8}  {text[:90]}")


if __name__ == "__main__":
    main()
