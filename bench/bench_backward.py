"""The MoE layer's backward and forward+backward: mok against the torch-native
pipeline's autograd, one process, one GPU.

Both sides get the same bf16 layer (bench_fused_forward.make_layer) with x,
the router weights and every weight requiring grad; the backward is timed as
torch.autograd.grad(out, inputs, dout, retain_graph=True) (no .grad
accumulation on either side), the forward+backward as a forward then that
call. Native and mok run in balanced rounds (bench_fused_forward.paired_ms).
Useful FLOPs: the backward is twice the forward's 6 H (T k I + T S) (S the
shared expert's width); recomputed FLOPs are not
counted. The dense bf16 peak is measured in the same run. mok's backward is
the staged one by default (python/mok/staged_backward.py: mok's grouped GEMMs
for the data and weight gradients, torch for the gathers and the combine), or
with MOK_BACKWARD=fused and --save the fused backward kernel
(include/mok/fused_backward.hpp); a per-kernel breakdown of one mok backward
(torch.profiler) is printed too.

--breakdown also times each side's forward alone (recording for autograd, as
in the forward+backward step) and profiles one mok forward+backward step: its
kernels in time order with the idle gap before each, and the GPU's busy time
against the step's span and wall time (how much of the step the host's
launches leave the GPU idle).

--host-ahead also times the backward and the forward+backward with the host
ahead of the GPU (bench_timing.py: a sleep kernel keeps the GPU busy while the
call is enqueued, as in a training loop), which leaves out the host's time to
the first kernel, and prints those ratios in a second table, and each side's
host time per forward and backward call (bench_timing.host_ms). The first
table (calls from an idle GPU) stays the headline figure.

--modes also times mok's two training modes against each other, paired in
the same run: recompute mode's backward and forward+backward over save
mode's (issue 14's recompute target). A mode is what the training forward
keeps and the backward does with it, so the forward+backward ratio is the
one a training step sees; the backward alone is printed beside it.

--wild runs bench_fused_forward.WILD_SHAPES (layers of released models)
instead of the presets, uniform routing only.

usage: python3 bench/bench_backward.py [--quick | --wild] [--no-profile] [--save] [--backward staged|fused]
                                      [--breakdown] [--host-ahead] [--modes]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fused_forward import (SHAPES, WILD_SHAPES, dense_peak_tflops, forward_flops, make_layer,  # noqa: E402
                                 paired_ms, torch_native)
from bench_timing import host_ms  # noqa: E402
import mok  # noqa: E402  (bench_fused_forward put python/ on the path)


def leaves(layer):
    """The layer's differentiable inputs as fresh leaves (ids stay integers)."""
    x, ids, w, w13, w2, sw13, sw2 = layer
    req = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, w, w13, w2, sw13, sw2)]
    x, w, w13, w2, sw13, sw2 = req
    return (x, ids, w, w13, w2, sw13, sw2), [t for t in req if t is not None]


def native_forward(layer):
    return torch_native(*layer)


def mok_forward(layer, save=False):
    x, ids, w, w13, w2, sw13, sw2 = layer
    return mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=w13.shape[0],
                             save_activations=save)[0]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def profile_backward(out, inputs, dout, top=12):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(out, inputs, dout, retain_graph=True)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events)
    print(f"  mok backward, GPU time by kernel (total {total / 1e3:.3f} ms):")
    for e in events[:top]:
        print(f"    {e.device_time_total / 1e3:8.3f} ms {100 * e.device_time_total / total:5.1f}%  x{e.count:<3} {e.key[:90]}")


def profile_step(step, min_us=20.0):
    """One forward+backward step under the profiler: its kernels in time
    order with the idle gap before each (those longer than min_us, or after
    a gap of 10 us or more), then the GPU's busy time (one stream: kernels do
    not overlap) against the span from the first kernel's start to the last
    one's end, and against the step's wall time from the host's first call."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
    wall = start.elapsed_time(end)
    kernels = sorted((e for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0),
                     key=lambda e: e.time_range.start)
    if not kernels:
        print("  mok forward+backward step (profiled): no GPU events recorded")
        return
    first = prev_end = kernels[0].time_range.start
    busy = 0.0
    print("  mok forward+backward step (profiled), kernels in order (start ms, gap before us, ms):")
    for e in kernels:
        gap, duration = e.time_range.start - prev_end, e.time_range.end - e.time_range.start
        busy += duration
        if duration >= min_us or gap >= 10:
            print(f"    {(e.time_range.start - first) / 1e3:7.3f} {gap:7.1f} {duration / 1e3:7.3f}  {e.name[:80]}")
        prev_end = max(prev_end, e.time_range.end)
    print(f"  GPU busy {busy / 1e3:.3f} ms of a {(prev_end - first) / 1e3:.3f} ms span, {wall:.3f} ms wall, "
          f"{len(kernels)} kernels")


def time_modes(layer, inputs, dout):
    """(backward save, backward recompute, f+b save, f+b recompute) in ms:
    each pair timed in balanced rounds (paired_ms)."""
    out_s, out_r = mok_forward(layer, True), mok_forward(layer, False)
    tb_s, tb_r = paired_ms(lambda: torch.autograd.grad(out_s, inputs, dout, retain_graph=True),
                           lambda: torch.autograd.grad(out_r, inputs, dout, retain_graph=True))
    del out_s, out_r
    tfb_s, tfb_r = paired_ms(lambda: torch.autograd.grad(mok_forward(layer, True), inputs, dout),
                             lambda: torch.autograd.grad(mok_forward(layer, False), inputs, dout))
    return tb_s, tb_r, tfb_s, tfb_r


def print_table(rows, peak):
    print()
    print(f"{'shape':<28} {'bwd native':>10} {'bwd mok':>8} {'ratio':>6} {'TFLOP/s':>8} {'% peak':>7}"
          f" {'f+b native':>11} {'f+b mok':>8} {'ratio':>6} {'% peak':>7}")
    for label, tbn, tbm, tfn, tfm, f in rows:
        bw = 2 * f / tbm / 1e9
        fb = 3 * f / tfm / 1e9
        print(f"{label:<28} {tbn:>10.3f} {tbm:>8.3f} {tbn / tbm:>6.2f} {bw:>8.0f} {100 * bw / peak:>6.1f}%"
              f" {tfn:>11.3f} {tfm:>8.3f} {tfn / tfm:>6.2f} {100 * fb / peak:>6.1f}%")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the DeepSeek-V3 slice only")
    parser.add_argument("--wild", action="store_true", help="layers of released models (WILD_SHAPES), uniform routing")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-kernel breakdown")
    parser.add_argument("--save", action="store_true",
                        help="save mode: the forward keeps gate/up, the backward does not recompute it")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the forwards alone and profile one mok forward+backward step")
    parser.add_argument("--host-ahead", action="store_true",
                        help="also time with the host ahead of the GPU (no host latency before the first kernel)")
    parser.add_argument("--modes", action="store_true",
                        help="also time recompute mode against save mode (backward and forward+backward, paired)")
    parser.add_argument("--backward", choices=("staged", "fused"), default=None,
                        help="mok's backward (sets MOK_BACKWARD; fused needs --save); default: the autograd's own")
    args = parser.parse_args()
    if args.backward is not None:
        if args.backward == "fused" and not args.save:
            parser.error("--backward fused runs in save mode only: add --save")
        os.environ["MOK_BACKWARD"] = args.backward
    torch.manual_seed(0)
    peak = dense_peak_tflops()
    backward = os.environ.get("MOK_BACKWARD", "") or "auto"
    print(f"device: {torch.cuda.get_device_name()}, dense bf16 peak measured: {peak:.0f} TFLOP/s; mok in "
          f"{'save' if args.save else 'recompute'} mode, MOK_BACKWARD={backward}", flush=True)
    shapes = WILD_SHAPES if args.wild else SHAPES[:1] if args.quick else SHAPES
    rows = []
    ahead_rows = []
    mode_rows = []
    failed = []
    for name, T, H, I, E, k, shared in shapes:
        for skew in (False,) if args.wild else (False, True):
            label = name + (" skewed" if skew else "")
            base = make_layer(T, H, I, E, k, shared, skew=skew)
            fwd_flops = forward_flops(T, H, I, k, shared)
            dout = torch.randn(T, H, device="cuda").bfloat16()
            native_layer, native_inputs = leaves(base)
            mok_layer, mok_inputs = leaves(base)
            out_n = native_forward(native_layer)
            grads_n = torch.autograd.grad(out_n, native_inputs, dout, retain_graph=True)
            try:
                out_m = mok_forward(mok_layer, args.save)
                grads_m = torch.autograd.grad(out_m, mok_inputs, dout, retain_graph=True)
            except (RuntimeError, ValueError, NotImplementedError) as e:  # must not hide the other layers
                failed.append(label)
                print(f"{label}: FAILED: {e}", flush=True)
                continue
            errs = [rel(gm, gn) for gm, gn in zip(grads_m, grads_n)]
            print(f"{label}: grad rel err vs native (x, w, w13, w2[, shared]): "
                  + ", ".join(f"{e:.1e}" for e in errs), flush=True)
            tb_n, tb_m = paired_ms(lambda: torch.autograd.grad(out_n, native_inputs, dout, retain_graph=True),
                                   lambda: torch.autograd.grad(out_m, mok_inputs, dout, retain_graph=True))

            def step_native():
                torch.autograd.grad(native_forward(native_layer), native_inputs, dout)

            def step_mok():
                torch.autograd.grad(mok_forward(mok_layer, args.save), mok_inputs, dout)
            tfb_n, tfb_m = paired_ms(step_native, step_mok)
            rows.append((label, tb_n, tb_m, tfb_n, tfb_m, fwd_flops))
            print(f"{label}: backward native {tb_n:.3f} ms, mok {tb_m:.3f} ms; "
                  f"forward+backward native {tfb_n:.3f} ms, mok {tfb_m:.3f} ms", flush=True)
            if args.host_ahead:
                ab_n, ab_m = paired_ms(lambda: torch.autograd.grad(out_n, native_inputs, dout, retain_graph=True),
                                       lambda: torch.autograd.grad(out_m, mok_inputs, dout, retain_graph=True),
                                       host_ahead=True)
                afb_n, afb_m = paired_ms(step_native, step_mok, host_ahead=True)
                ahead_rows.append((label, ab_n, ab_m, afb_n, afb_m, fwd_flops))
                print(f"{label}, host ahead: backward native {ab_n:.3f} ms, mok {ab_m:.3f} ms; "
                      f"forward+backward native {afb_n:.3f} ms, mok {afb_m:.3f} ms", flush=True)
                hosts = [host_ms(fn) for fn in (
                    lambda: native_forward(native_layer), lambda: mok_forward(mok_layer, args.save),
                    lambda: torch.autograd.grad(out_n, native_inputs, dout, retain_graph=True),
                    lambda: torch.autograd.grad(out_m, mok_inputs, dout, retain_graph=True))]
                print(f"{label}, host time of one call (bench_timing.host_ms): forward native {hosts[0]:.3f} ms, "
                      f"mok {hosts[1]:.3f} ms; backward native {hosts[2]:.3f} ms, mok {hosts[3]:.3f} ms", flush=True)
            if args.modes:
                mode_rows.append((label, *time_modes(mok_layer, mok_inputs, dout)))
            if args.breakdown:
                tf_n, tf_m = paired_ms(lambda: native_forward(native_layer), lambda: mok_forward(mok_layer, args.save))
                print(f"{label}: forward alone (recording for autograd) native {tf_n:.3f} ms, mok {tf_m:.3f} ms; "
                      f"step minus forward minus backward: native {tfb_n - tf_n - tb_n:+.3f} ms, "
                      f"mok {tfb_m - tf_m - tb_m:+.3f} ms", flush=True)
                if not skew:
                    profile_step(step_mok)
            if not args.no_profile and not skew:
                profile_backward(out_m, mok_inputs, dout)
            del out_n, out_m, grads_n, grads_m
            torch.cuda.empty_cache()

    print_table(rows, peak)
    if ahead_rows:
        print("\nwith the host ahead of the GPU (no host latency before the first kernel; bench_timing.py):")
        print_table(ahead_rows, peak)
    if mode_rows:
        print("\nrecompute mode against save mode (paired in this run):")
        print(f"{'shape':<28} {'bwd save':>9} {'bwd rec':>8} {'ratio':>6} {'f+b save':>9} {'f+b rec':>8} {'ratio':>6}")
        for label, tb_s, tb_r, tfb_s, tfb_r in mode_rows:
            print(f"{label:<28} {tb_s:>9.3f} {tb_r:>8.3f} {tb_r / tb_s:>6.3f} {tfb_s:>9.3f} {tfb_r:>8.3f} "
                  f"{tfb_r / tfb_s:>6.3f}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
