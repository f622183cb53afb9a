"""Where one traced pass's time went, from a `mok_cli --trace FILE` CSV
(rank, cta, kind, detail, begin_ns, end_ns, cycles): the pass's span; per
role (GEMM CTAs: those that ran a mainloop; dispatch CTAs: those that
copied rows) the mean time per CTA in each event kind; and per task kind
the tasks, the mean mainloop time and its rate per SM.

  python3 scripts/trace_summary.py FILE.csv [--flop KIND=FLOP ...]

Without --flop, a task's FLOP is not known here and only times are printed;
mok_cli's own report (printed with the trace) gives useful TFLOP/s.
"""
from __future__ import annotations

import argparse
import collections
import csv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--flop", action="append", default=[], help="KIND=FLOP per task of that kind (detail)")
    args = parser.parse_args()
    flop = dict(item.split("=") for item in args.flop)
    rows = list(csv.DictReader(open(args.csv)))
    if not rows:
        print("  (empty trace)")
        return
    begin = min(int(r["begin_ns"]) for r in rows)
    end = max(int(r["end_ns"]) for r in rows)
    print(f"  traced pass: {(end - begin) / 1e6:.3f} ms")
    per_cta = collections.defaultdict(collections.Counter)
    detailed = ("mainloop", "task wait", "epilogue")
    for r in rows:
        key = r["kind"] + ("/" + r["detail"] if r["kind"] in detailed else "")
        per_cta[int(r["cta"])][key] += int(r["end_ns"]) - int(r["begin_ns"])
    roles = collections.defaultdict(list)
    for cta, kinds in per_cta.items():
        is_gemm = any(k.startswith("mainloop/") for k in kinds)
        roles["gemm" if is_gemm else "dispatch" if kinds["dispatch copy"] else "other"].append(cta)
    for role, ctas in sorted(roles.items()):
        total = collections.Counter()
        for cta in ctas:
            total.update(per_cta[cta])
        spent = ", ".join(f"{k} {v / 1e6 / len(ctas):.3f}" for k, v in sorted(total.items()))
        print(f"  {role} CTAs ({len(ctas)}), ms per CTA: {spent}")
    tasks, loop_ns = collections.Counter(), collections.Counter()
    for r in rows:
        if r["kind"] == "mainloop":
            tasks[r["detail"]] += 1
            loop_ns[r["detail"]] += int(r["end_ns"]) - int(r["begin_ns"])
    for kind in sorted(tasks):
        mean_ns = loop_ns[kind] / tasks[kind]
        rate = f", {float(flop[kind]) / mean_ns / 1e3:.2f} TFLOP/s per SM" if kind in flop else ""
        print(f"  task kind {kind}: {tasks[kind]} tasks, mainloop {mean_ns / 1e3:.2f} us each{rate}")


if __name__ == "__main__":
    main()
