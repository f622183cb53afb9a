"""The fused FP8 forward (issue 16) against mok's bf16 fused forward and two
torch-native pipelines, one process, one GPU, the same inputs:

  native bf16   bench_fused_forward.torch_native (sort, gather,
                torch._grouped_mm, SwiGLU, torch._grouped_mm, scatter, fp32
                combine, dense shared expert);
  native fp8    the same with torch._scaled_grouped_mm (rowwise FP8: one fp32
                scale per activation row and per weight output channel,
                use_fast_accum=True as torchao's rowwise MoE training uses)
                for the routed GEMMs, x and h quantized per row inside the
                timed region, the weights once outside it; shared expert bf16;
  mok bf16      mok.fused_forward;
  mok fp8       mok.fused_forward_fp8 (weights from mok.quantize_weights,
                quantized once outside the timed region).

All four are timed in balanced rounds (bench_timing.balanced_times: medians
of CUDA-event timings; each takes every position, and follows every other,
equally often), so clock and temperature drift and the power state each call
leaves the next weigh on all alike; ratios are within one run.
Each output's error is measured against the fp32 layer on unquantized
weights (per expert in fp32, no bf16 roundings). Useful FLOPs only, as in
bench_fused_forward.py.

--wild: bench_fused_forward.WILD_SHAPES (layers of released models), uniform
routing.

usage: python3 bench/bench_fused_forward_fp8.py [--quick | --wild]
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mok  # noqa: E402  (loads libmok_torch.so)
from mok.testing import split_world  # noqa: E402
from bench_fused_forward import SHAPES, WILD_SHAPES, combine_slots, forward_flops, make_layer, start, torch_native  # noqa: E402
from bench_timing import balanced_medians  # noqa: E402

E4M3_MAX = 448.0


def fp32_layer(x, ids, w, w13, w2, sw13, sw2):
    """The layer in fp32 on the unquantized weights, expert by expert."""
    T, k = ids.shape
    I = w2.shape[2]
    xf = x.float()
    out = torch.zeros_like(xf)
    for e in range(w13.shape[0]):
        t, j = torch.nonzero(ids == e, as_tuple=True)
        if t.numel() == 0:
            continue
        gu = xf[t] @ w13[e].float().t()
        y = (F.silu(gu[:, :I]) * gu[:, I:]) @ w2[e].float().t()
        out.index_add_(0, t, w[t, j].unsqueeze(1) * y)
    if sw13 is not None:
        S = sw2.shape[1]
        out += (F.silu(xf @ sw13[:S].float().t()) * (xf @ sw13[S:].float().t())) @ sw2.float().t()
    return out


def rowwise(a):
    """Rowwise FP8 of a [..., K]: (e4m3 values, fp32 scale per row: a ~ values * scale)."""
    scale = (a.float().abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    return (a.float() / scale).to(torch.float8_e4m3fn), scale.squeeze(-1)


def native_fp8_pipeline(layer):
    """The torch-native pipeline with rowwise FP8 routed GEMMs; returns fn()."""
    x, ids, w, w13, w2, sw13, sw2 = layer
    k = ids.shape[1]
    E, I = w13.shape[0], w13.shape[1] // 2
    q13, s13 = rowwise(w13)  # [E, 2I, H], scale per (expert, output channel)
    q2, s2 = rowwise(w2)     # [E, H, I]

    def fn():
        flat = ids.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        xs, xs_scale = rowwise(x[order // k])
        offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
        gu = torch._scaled_grouped_mm(xs, q13.transpose(-2, -1), xs_scale, s13, offs=offs, out_dtype=torch.bfloat16,
                                      use_fast_accum=True)
        h, h_scale = rowwise(F.silu(gu[:, :I]) * gu[:, I:])
        y = torch._scaled_grouped_mm(h, q2.transpose(-2, -1), h_scale, s2, offs=offs, out_dtype=torch.bfloat16,
                                     use_fast_accum=True)
        return combine_slots(y, order, x, w, sw13, sw2)
    return fn


def mok_fp8(layer):
    xs, ids, ws, w13, w2, sw13, sw2 = split_world(layer, 1)
    q13, q2 = [mok.quantize_weights(w) for w in w13], [mok.quantize_weights(w) for w in w2]
    E = layer[3].shape[0]
    return lambda: mok.fused_forward_fp8(xs, ids, ws, q13, q2, sw13, sw2, num_experts=E)[0]


def mok_bf16(layer):
    xs, ids, ws, w13, w2, sw13, sw2 = split_world(layer, 1)
    E = layer[3].shape[0]
    return lambda: mok.fused_forward(xs, ids, ws, w13, w2, sw13, sw2, num_experts=E)[0]


def rel(a, b):
    return ((a.float() - b).norm() / b.norm()).item()


def main():
    args, _ = start("the DeepSeek-V3 slice only", wild=True)  # prints the device and the dense bf16 peak
    names = ["native bf16", "native fp8", "mok bf16", "mok fp8"]
    rows = []
    for name, T, H, I, E, k, shared in (WILD_SHAPES if args.wild else SHAPES[:1] if args.quick else SHAPES):
        for skew in (False, True) if not (args.quick or args.wild) else (False,):
            label = name + (" skewed" if skew else "")
            layer = make_layer(T, H, I, E, k, shared, skew=skew)
            flops = forward_flops(T, H, I, k, shared)
            exact = fp32_layer(*layer)
            fns = [lambda: torch_native(*layer), None, mok_bf16(layer), mok_fp8(layer)]
            try:
                fns[1] = native_fp8_pipeline(layer)
                fns[1]()
            except (RuntimeError, TypeError) as e:  # an older torch, or a shape it refuses
                print(f"{label}: native fp8 pipeline unavailable ({str(e).splitlines()[0]})", flush=True)
                fns[1] = None
            errors = [rel(fn(), exact) if fn is not None else float("nan") for fn in fns]
            timed = [fn for fn in fns if fn is not None]
            medians = iter(balanced_medians(timed))
            ms = [next(medians) if fn is not None else float("nan") for fn in fns]
            rows.append((label, ms, errors, flops))
            print(f"{label}: " + ", ".join(f"{n} {t:.3f} ms (err {e:.2e})" for n, t, e in zip(names, ms, errors)),
                  flush=True)
            del layer, exact, fns, timed
            torch.cuda.empty_cache()

    print()
    print(f"{'shape':<28} " + " ".join(f"{n + ' ms':>14}" for n in names) +
          f" {'fp8/bf16 mok':>13} {'vs nat bf16':>12} {'vs nat fp8':>11} {'fp8 TFLOP/s':>12}")
    for label, ms, errors, flops in rows:
        print(f"{label:<28} " + " ".join(f"{t:>14.3f}" for t in ms) +
              f" {ms[2] / ms[3]:>13.2f} {ms[0] / ms[3]:>12.2f} {ms[1] / ms[3]:>11.2f} {flops / ms[3] / 1e9:>12.0f}")
    print()
    print("relative L2 error against the fp32 layer on unquantized weights:")
    for label, _, errors, _ in rows:
        print(f"  {label:<28} " + ", ".join(f"{n} {e:.2e}" for n, e in zip(names, errors)))


if __name__ == "__main__":
    main()
