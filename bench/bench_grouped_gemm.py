"""Grouped GEMM: mok vs torch._grouped_mm, side by side in one process.

Per shape (local experts of one GPU, ~1024 routed rows per expert unless
skewed), three problems:
  gate_up   x[M, H] . w13[g]^T -> [M, 2I]           (plain, both libraries)
  swiglu    silu(x . gate^T) * (x . up^T) -> [M, I]  mok fused vs torch
            grouped_mm + silu(g) * u (and mok unfused, same split)
  down      h[M, I] . w2[g]^T -> [M, H]
TFLOP/s count real rows only: 2 * rows * N * K. Groups are contiguous and
unpadded for both libraries (offs = cumulative ends for torch; the same
offsets/rows for mok). Inputs are far larger than the 60 MB L2, so no rotation.
Timing: triton.testing.do_bench median (warm-up 25 ms, 200 ms of repeats).

Usage: python3 bench/bench_grouped_gemm.py [--shapes a,b] [--rep-ms 200]
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import mok

# name: (hidden H, expert intermediate I, local experts G, rows per expert or None for skewed)
SHAPES = {
    "dsv3-32x1024": (7168, 2048, 32, 1024),      # 32 experts x 1024 rows, H 7168 -> 2x2048
    "glm4.5-ep8": (5120, 1536, 20, 1024),        # 160 experts / 8 GPUs, ~1024 rows each
    "qwen3-235b-ep8": (4096, 1536, 16, 1024),    # 128 experts / 8 GPUs, ~1024 rows each
    "dsv3-skewed": (7168, 2048, 32, None),       # 32768 rows, Zipf-like routing, empty experts
}


def skewed_counts(groups: int, total: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    weights = torch.tensor([1.0 / (i + 1) ** 1.1 for i in range(groups)])
    weights = weights[torch.randperm(groups, generator=g)]
    weights[torch.randperm(groups, generator=g)[:3]] = 0.0  # a few experts get nothing
    counts = (weights / weights.sum() * total).floor().long()
    counts[int(torch.argmax(counts))] += total - int(counts.sum())
    return counts.tolist()


def bench(fn, rep_ms: float) -> float:
    return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.float(), ref.float()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def run_shape(name: str, rep_ms: float, rows_out: list):
    hidden, inter, groups, per = SHAPES[name]
    counts = [per] * groups if per is not None else skewed_counts(groups, 1024 * groups)
    m = sum(counts)
    dev = "cuda"
    torch.manual_seed(0)
    x = torch.randn(m, hidden, device=dev, dtype=torch.bfloat16)
    w13 = torch.randn(groups, 2 * inter, hidden, device=dev, dtype=torch.bfloat16) / math.sqrt(hidden)
    w2 = torch.randn(groups, hidden, inter, device=dev, dtype=torch.bfloat16) / math.sqrt(inter)
    h = torch.randn(m, inter, device=dev, dtype=torch.bfloat16)

    off, rows = mok.layout_from_counts(counts, 1, device=dev)
    ends = off[1:].contiguous()  # torch: cumulative END offsets, int32
    w13_t, w2_t = w13.transpose(-2, -1), w2.transpose(-2, -1)

    print(f"\n== {name}: H {hidden}, I {inter}, {groups} experts, {m} rows "
          f"(min {min(counts)}, max {max(counts)} per expert)", flush=True)

    # Correctness cross-check against torch on the same inputs.
    ours_gu = mok.grouped_mm(x, w13, off, rows)
    torch_gu = torch._grouped_mm(x, w13_t, offs=ends)
    ours_sw = mok.grouped_mm_swiglu(x, w13, off, rows)
    torch_sw = F.silu(torch_gu[:, :inter].float()) * torch_gu[:, inter:].float()
    ours_dn = mok.grouped_mm(h, w2, off, rows)
    torch_dn = torch._grouped_mm(h, w2_t, offs=ends)
    print(f"   rel err vs torch: gate_up {rel_err(ours_gu, torch_gu):.2e}  "
          f"swiglu {rel_err(ours_sw, torch_sw):.2e}  down {rel_err(ours_dn, torch_dn):.2e}", flush=True)
    del ours_gu, torch_gu, ours_sw, torch_sw, ours_dn, torch_dn

    f_gu = 2.0 * m * (2 * inter) * hidden
    f_dn = 2.0 * m * hidden * inter

    def torch_swiglu():
        t = torch._grouped_mm(x, w13_t, offs=ends)
        return F.silu(t[:, :inter]) * t[:, inter:]

    def ours_unfused():
        t = mok.grouped_mm(x, w13, off, rows)
        return F.silu(t[:, :inter]) * t[:, inter:]

    cases = [
        ("gate_up", f_gu, lambda: mok.grouped_mm(x, w13, off, rows),
         lambda: torch._grouped_mm(x, w13_t, offs=ends)),
        ("swiglu", f_gu, lambda: mok.grouped_mm_swiglu(x, w13, off, rows), torch_swiglu),
        ("down", f_dn, lambda: mok.grouped_mm(h, w2, off, rows),
         lambda: torch._grouped_mm(h, w2_t, offs=ends)),
    ]
    for op, flops, ours, ref in cases:
        t_ours = bench(ours, rep_ms)
        t_ref = bench(ref, rep_ms)
        extra = ""
        if op == "swiglu":
            t_unf = bench(ours_unfused, rep_ms)
            extra = f"  mok unfused {t_unf:.3f} ms"
        print(f"   {op:8s} mok {t_ours:.3f} ms {tflops(flops, t_ours):6.1f} TF/s | "
              f"torch {t_ref:.3f} ms {tflops(flops, t_ref):6.1f} TF/s | ratio {t_ref / t_ours:.3f}{extra}",
              flush=True)
        rows_out.append((name, op, tflops(flops, t_ours), tflops(flops, t_ref), t_ref / t_ours))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--rep-ms", type=float, default=200.0)
    args = p.parse_args()
    print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__)
    table = []
    for name in args.shapes.split(","):
        run_shape(name, args.rep_ms, table)
        torch.cuda.empty_cache()
    print("\nshape            op        mok TF/s  torch TF/s  mok/torch (time ratio)")
    for name, op, ours, ref, ratio in table:
        print(f"{name:16s} {op:8s} {ours:9.1f} {ref:11.1f} {ratio:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
