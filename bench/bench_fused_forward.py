"""Fused forward megakernel vs the torch-native MoE forward, one process, one GPU.

The torch-native pipeline: stable sort of (token, slot) entries by expert,
gather, torch._grouped_mm (gate/up), SwiGLU, torch._grouped_mm (down), scatter
back, fp32 weighted sum over the k slots, plus the shared expert as dense
matmuls. Both sides get the same bf16 inputs. Useful FLOPs only (no padding):
6 * H * (T*k*I + T*S) with a shared expert of width S (the MoK count).
Times are medians of CUDA-event timings after warm-up, native and fused timed
in balanced rounds (native fused, fused native, ...; each row's own native
time), so that clock and temperature drift over the run and the power state
one call leaves the next weigh on both alike. The dense bf16 peak is
measured in the same run (8192^3 matmul). Prints a table last.

--wild runs layers of released MoE models instead (WILD_SHAPES: expert
counts from 8 to 128, top-1 to top-8, widths that are not powers of two --
768, 1408, 1536, 14336 --, shared experts wider than the routed ones),
uniform routing, no sweeps: performance must hold on any shape, not the
presets only. (None of them has a width that is a multiple of 64 and not of
128; the GPU tests cover those on small shapes.)

The DeepSeek-V3 slice's default configuration is measured twice: first (the
table's first row) and again after the sweeps ("R=1 again"), each against
its own native time, so that the table shows how far one configuration's
ratio moves within a run (the rows' spread) next to what the sweeps change.

usage: python3 bench/bench_fused_forward.py [--quick | --wild]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mok  # noqa: E402  (loads libmok_torch.so)
from mok.testing import split_world  # noqa: E402
from bench_timing import balanced_medians, event_ms, upper_median  # noqa: E402


# The benchmarked layers: name, T, H, I, E (one GPU's slice at EP 8), k, shared expert.
SHAPES = [
    ("dsv3-ep8-slice", 4096, 7168, 2048, 32, 8, True),
    ("glm4.5-ep8-slice", 4096, 5120, 1536, 20, 8, True),
    ("qwen3-235b-ep8-slice", 4096, 4096, 1536, 16, 8, False),
]

# Layers of released models as one GPU holds them (the whole layer, or one
# expert-parallel rank's slice of a larger one): name, T, H, I, E, k, shared
# expert width (0: none; the sum of the widths where a model has several).
WILD_SHAPES = [
    ("qwen3-30b-a3b", 4096, 2048, 768, 128, 8, 0),
    ("olmoe-1b-7b", 4096, 2048, 1024, 64, 8, 0),
    ("granite-3.0-3b-a800m", 4096, 1536, 512, 40, 8, 0),
    ("deepseek-v2-lite", 4096, 2048, 1408, 64, 6, 2816),
    ("qwen1.5-moe-a2.7b", 4096, 2048, 1408, 60, 4, 5632),
    ("mixtral-8x7b", 4096, 4096, 14336, 8, 2, 0),
    ("llama4-scout-ep2-slice", 4096, 5120, 8192, 8, 1, 8192),
    ("glm4.5-air-ep8-slice", 4096, 4096, 1408, 16, 8, 1408),
    ("kimi-k2-ep8-slice", 4096, 7168, 2048, 48, 8, 2048),
]


def shared_width(I, shared):
    """The shared expert's width: `shared` True means one of width I, False
    or 0 none, an int that width."""
    if isinstance(shared, bool):
        return I if shared else 0
    return int(shared)


def forward_flops(T, H, I, k, shared):
    """Useful forward FLOPs: 6 H (T k I + T S), S the shared expert's width."""
    return 6.0 * H * (T * k * I + T * shared_width(I, shared))


def median_ms(fn, warmup=5, iters=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return upper_median([event_ms(fn) for _ in range(iters)])


def paired_ms(fn_a, fn_b, cycles=3, iters=4, host_ahead=False):
    """Medians of fn_a and fn_b timed in balanced rounds (A B, B A, ...;
    bench_timing.balanced_times), so that clock and temperature drift and the
    power state one call leaves the next weigh on both alike (host_ahead:
    bench_timing.event_ms's host-ahead timing)."""
    return tuple(balanced_medians([fn_a, fn_b], cycles, iters, host_ahead))


def dense_peak_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ b, warmup=3, iters=10)
    return 2 * 8192**3 / ms / 1e9


def make_layer(T, H, I, E, k, shared, skew=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.rand(T, H, device="cuda", generator=g) * 2 - 1).bfloat16()
    scores = torch.rand(T, E, device="cuda", generator=g)
    if skew:
        scores = scores / torch.arange(1, E + 1, device="cuda").float()  # low ids win more often
    top = torch.topk(scores, k, dim=1)
    ids = top.indices.int().contiguous()
    w = torch.softmax(top.values, dim=1).float().contiguous()
    w13 = ((torch.rand(E, 2 * I, H, device="cuda", generator=g) * 2 - 1) / H**0.5).bfloat16()
    w2 = ((torch.rand(E, H, I, device="cuda", generator=g) * 2 - 1) / I**0.5).bfloat16()
    sw13 = sw2 = None
    S = shared_width(I, shared)
    if S:
        sw13 = ((torch.rand(2 * S, H, device="cuda", generator=g) * 2 - 1) / H**0.5).bfloat16()
        sw2 = ((torch.rand(H, S, device="cuda", generator=g) * 2 - 1) / S**0.5).bfloat16()
    return x, ids, w, w13, w2, sw13, sw2


def torch_native(x, ids, w, w13, w2, sw13, sw2):
    k = ids.shape[1]
    E, I = w13.shape[0], w13.shape[1] // 2
    flat = ids.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    xs = x[order // k]
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    gu = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)
    h = F.silu(gu[:, :I]) * gu[:, I:]
    y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)
    return combine_slots(y, order, x, w, sw13, sw2)


def combine_slots(y, order, x, w, sw13, sw2):
    """The torch-native pipeline's end: the expert rows y (in `order`, sorted
    by expert) back to their (token, slot), the fp32 weighted sum over the k
    slots, plus the shared expert as dense bf16 matmuls."""
    T, k = w.shape
    H = x.shape[1]
    y_slots = torch.empty_like(y)
    y_slots[order] = y
    out = (y_slots.view(T, k, H).float() * w.unsqueeze(-1)).sum(1)
    if sw13 is not None:
        S = sw2.shape[1]
        s = F.silu(x @ sw13[:S].t()) * (x @ sw13[S:].t())
        out = out + (s @ sw2.t()).float()
    return out.bfloat16()


def fused(R, layer, check=False, **tuning):
    """The fused forward of `layer` over a virtual world of R ranks; tuning:
    mok.TUNING_OPTIONS by name (absent: the library's default)."""
    xs, idss, ws, w13s, w2s, sw13, sw2 = split_world(layer, R)
    E = layer[3].shape[0]

    def fn():
        return mok.fused_forward(xs, idss, ws, w13s, w2s, sw13, sw2, num_experts=E, check_errors=check, **tuning)
    return fn


def start(quick_help, wild=False):
    """A benchmark's start: its --quick flag (and with `wild`, --wild)
    parsed, the seed fixed, the dense bf16 peak measured and printed with the
    device. Returns (args, peak)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help=quick_help)
    if wild:
        parser.add_argument("--wild", action="store_true",
                            help="layers of released models (WILD_SHAPES), uniform routing, no sweeps")
    args = parser.parse_args()
    torch.manual_seed(0)
    peak = dense_peak_tflops()
    print(f"device: {torch.cuda.get_device_name()}, dense bf16 peak measured: {peak:.0f} TFLOP/s", flush=True)
    return args, peak


def main():
    args, peak = start("fewer shapes and iterations", wild=True)

    shapes = WILD_SHAPES if args.wild else SHAPES[:1] if args.quick else SHAPES
    rows = []
    failed = []
    for name, T, H, I, E, k, shared in shapes:
        for skew in (False,) if args.wild else (False, True):
            label = name + (" skewed" if skew else "")
            layer = make_layer(T, H, I, E, k, shared, skew=skew)
            flops = forward_flops(T, H, I, k, shared)
            ref = torch_native(*layer)
            try:
                out = fused(1, layer, check=True)()[0]
            except (RuntimeError, ValueError) as e:  # one layer mok refuses or fails on must not hide the rest
                failed.append(label)
                print(f"{label}: FAILED: {e}", flush=True)
                continue
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            t_native, t_fused = paired_ms(lambda: torch_native(*layer), fused(1, layer))
            rows.append((label, "R=1", t_native, t_fused, flops, err))
            print(f"{label}: native {t_native:.3f} ms, fused {t_fused:.3f} ms, rel err vs native {err:.2e}", flush=True)
        if name == "dsv3-ep8-slice":
            layer = make_layer(T, H, I, E, k, shared)
            sweeps = [(f"R={R} virtual", dict(R=R)) for R in (2, 4, 8)]
            sweeps += [(f"R=1 lookahead {la}", dict(lookahead=la)) for la in (1, 3)]
            sweeps += [(f"R=1 comm CTAs {c}", dict(comm_ctas_per_rank=c)) for c in (2, 4, 11)]
            sweeps += [(f"R=1 minibatch {mb}", dict(minibatch_rows=mb)) for mb in (1024, 4096)]
            sweeps += [("R=1 again", {})]
            for cfg, kw in sweeps:
                R = kw.pop("R", 1)
                t_native, t = paired_ms(lambda: torch_native(*layer), fused(R, layer, **kw))
                rows.append((name, cfg, t_native, t, flops, float("nan")))
                print(f"{name} {cfg}: fused {t:.3f} ms", flush=True)

    print()
    print(f"{'shape':<30} {'config':<20} {'native ms':>10} {'fused ms':>9} {'ratio':>6} {'TFLOP/s':>8} {'% peak':>7}")
    for label, cfg, tn, tf, flops, _ in rows:
        tflops = flops / tf / 1e9
        print(f"{label:<30} {cfg:<20} {tn:>10.3f} {tf:>9.3f} {tn / tf:>6.2f} {tflops:>8.0f} {100 * tflops / peak:>6.1f}%")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
