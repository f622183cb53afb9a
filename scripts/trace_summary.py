"""Where one traced pass's time went, from a `mok_cli --trace FILE` CSV
(rank, cta, kind, detail, begin_ns, end_ns, cycles; FILE.csv.xz too): the
pass's span; per role (GEMM CTAs: those that ran a mainloop; dispatch CTAs:
those that copied rows) the mean time per CTA in each event kind; and per
task kind the tasks, the mean mainloop time and its rate per SM, then the
consumers' cycles per task: mainloop, epilogue, hand-off, and the gap from
the previous task's hand-off to this task's mainloop on the same CTA (which
holds the tracer's own event records); then the pass's timeline: when each
task kind's mainloops ran, how far apart the GEMM CTAs' last tasks end, and
how long the combine runs past them.

  python3 scripts/trace_summary.py FILE.csv [--flop KIND=FLOP ...]

Without --flop, a task's FLOP is not known here and only times are printed;
mok_cli's own report (printed with the trace) gives useful TFLOP/s.
"""
from __future__ import annotations

import argparse
import collections
import csv
import lzma


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--flop", action="append", default=[], help="KIND=FLOP per task of that kind (detail)")
    args = parser.parse_args()
    flop = dict(item.split("=") for item in args.flop)
    rows = list(csv.DictReader(lzma.open(args.csv, "rt") if args.csv.endswith(".xz") else open(args.csv)))
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
    consumer_cycles(rows)
    timeline(rows, begin, roles)


def timeline(rows, begin: int, roles) -> None:
    """ms from the pass's first event: each task kind's first mainloop start and
    last mainloop end, the spread of the GEMM CTAs' last mainloop ends, and
    the combine's span on each role's CTAs (its tail: past the last mainloop)."""
    ms = lambda ns: (ns - begin) / 1e6
    spans = {}
    last_task = collections.defaultdict(int)
    combine = collections.defaultdict(lambda: [None, 0])
    role_of = {cta: role for role, ctas in roles.items() for cta in ctas}
    for r in rows:
        b, e = int(r["begin_ns"]), int(r["end_ns"])
        if r["kind"] == "mainloop":
            first, last = spans.get(r["detail"], (b, e))
            spans[r["detail"]] = (min(first, b), max(last, e))
            last_task[int(r["cta"])] = max(last_task[int(r["cta"])], e)
        elif r["kind"] == "combine":
            span = combine[role_of.get(int(r["cta"]), "other")]
            span[0] = b if span[0] is None else min(span[0], b)
            span[1] = max(span[1], e)
    if not spans:
        return
    print("  timeline (ms from the pass's first event): task kind, mainloops from .. to")
    for kind, (first, last) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        print(f"    {kind:>3}: {ms(first):7.3f} .. {ms(last):7.3f}")
    ends = sorted(last_task.values())
    print(f"  GEMM CTAs' last mainloop ends: {ms(ends[0]):.3f} .. {ms(ends[-1]):.3f} (median {ms(ends[len(ends) // 2]):.3f})")
    for role, (first, last) in sorted(combine.items()):
        print(f"  combine on the {role} CTAs: {ms(first):.3f} .. {ms(last):.3f} "
              f"({(last - ends[-1]) / 1e3:+.0f} us past the last mainloop)")


def consumer_cycles(rows) -> None:
    """Per task kind, the consumers' mean cycles in each phase of a task."""
    timeline = collections.defaultdict(list)
    for r in rows:
        if r["kind"] in ("mainloop", "epilogue", "handoff"):
            timeline[(r["rank"], r["cta"])].append(
                (int(r["begin_ns"]), r["kind"], r["detail"], int(r["cycles"] or 0), int(r["end_ns"])))
    phases = collections.defaultdict(lambda: collections.defaultdict(list))
    for events in timeline.values():
        events.sort()
        handoff_end = None
        for begin, kind, detail, cycles, end in events:
            phases[detail][kind].append(cycles)
            if kind == "mainloop" and handoff_end is not None:
                phases[detail]["gap ns"].append(begin - handoff_end)
            if kind == "handoff":
                handoff_end = end
    if not phases:
        return
    print("  consumers per task (mean): kind, mainloop / epilogue / hand-off cycles, gap before the mainloop")
    for detail in sorted(phases, key=int):
        p = phases[detail]
        mean = {k: sum(v) / len(v) for k, v in p.items() if v}
        print(f"    {detail:>3}: {mean.get('mainloop', 0):9.0f} / {mean.get('epilogue', 0):7.0f} / "
              f"{mean.get('handoff', 0):6.0f} cycles, gap {mean.get('gap ns', 0) / 1e3:.2f} us")


if __name__ == "__main__":
    main()
