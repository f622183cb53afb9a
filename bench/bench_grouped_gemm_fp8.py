"""The block-scaled FP8 grouped GEMM (mok.grouped_mm_fp8) against mok's BF16
grouped GEMM and torch._scaled_grouped_mm (rowwise-scaled FP8), one process,
one GPU, on the DeepSeek-V3 slice's two expert GEMMs (32 experts x 1024
rows: gate/up K 7168 N 4096, down K 2048 N 7168) and GLM-4.5's. Operands are
quantized beforehand (kernel time only); paired rounds (bench_fused_forward
.paired_ms); TFLOP/s = 2 M N K / time; the dense FP8 and BF16 peaks are
measured in the same run (8192^3 torch._scaled_mm and matmul). Each result is
checked against fp32 torch over the dequantized operands first.

Then where the FP8 forward quantizes (mok's row quantizer against the torch
code; h quantized in the gate/up epilogue against a separate pass), and the
layer: the staged FP8 forward (mok/fp8_forward.py, not fused)
against mok's fused BF16 forward and the torch-native BF16 pipeline on the
DeepSeek-V3 slice, with each one's error against an fp32 torch computation of
the layer.

usage: python3 bench/bench_grouped_gemm_fp8.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fused_forward import SHAPES, dense_peak_tflops, make_layer, median_ms, paired_ms, torch_native  # noqa: E402
import mok  # noqa: E402
from mok.fp8_forward import staged_fp8_forward  # noqa: E402


def fp8_peak_tflops():
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    ms = median_ms(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16), warmup=3, iters=10)
    return 2 * 8192 ** 3 / ms / 1e9


def torch_rowwise(x, w):
    """torch._scaled_grouped_mm with rowwise scales, or None where this torch lacks it."""
    G, N, K = w.shape
    M = x.shape[0]
    xs = x.abs().amax(1).clamp_min(1e-12) / 448.0
    ws = w.abs().amax(2).clamp_min(1e-12) / 448.0
    a = (x / xs[:, None]).to(torch.float8_e4m3fn)
    b = (w / ws[:, :, None]).to(torch.float8_e4m3fn).transpose(1, 2)  # [G, K, N], column-major per group
    offs = torch.arange(1, G + 1, device="cuda", dtype=torch.int32) * (M // G)
    try:
        fn = lambda: torch._scaled_grouped_mm(a, b, xs.float(), ws.float(), offs=offs, out_dtype=torch.bfloat16)  # noqa: E731
        fn()
        return fn
    except (RuntimeError, AttributeError, TypeError) as e:
        print(f"  torch._scaled_grouped_mm unavailable here: {str(e).splitlines()[0][:120]}")
        return None


def main():
    bf16_peak, fp8_peak = dense_peak_tflops(), fp8_peak_tflops()
    print(f"device: {torch.cuda.get_device_name()}; dense peaks measured: bf16 {bf16_peak:.0f}, "
          f"fp8 {fp8_peak:.0f} TFLOP/s", flush=True)
    problems = [("dsv3 gate/up", 32, 1024, 7168, 4096), ("dsv3 down", 32, 1024, 2048, 7168),
                ("glm4.5 gate/up", 20, 1638, 5120, 3072), ("glm4.5 down", 20, 1638, 1536, 5120)]
    rows = []
    for name, G, per, K, N in problems:
        M = G * per
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(M, K, device="cuda", generator=g)
        w = torch.randn(G, N, K, device="cuda", generator=g) / K ** 0.5
        a, a_s = mok.quantize_rows(x)
        q = mok.quantize_weights(w)
        off, cnt = mok.layout_from_counts([per] * G, device="cuda")
        fp8 = lambda: mok.grouped_mm_fp8(a, a_s, q.values, q.scales, off, cnt)  # noqa: E731
        xb, wb = x.bfloat16(), w.bfloat16()
        bf16 = lambda: mok.grouped_mm(xb, wb, off, cnt)  # noqa: E731
        want = (a.float() * torch.exp2(a_s.float() - 127).repeat_interleave(128, 1)).view(G, per, K)
        want = torch.bmm(want, q.dequantize().transpose(1, 2)).reshape(M, N)
        err = float((fp8().float() - want).norm() / want.norm())
        t_bf16, t_fp8 = paired_ms(bf16, fp8)
        rowwise = torch_rowwise(x, w)
        t_torch = paired_ms(rowwise, fp8)[0] if rowwise is not None else float("nan")
        flops = 2.0 * M * N * K
        rows.append((name, t_bf16, t_fp8, t_torch, flops, err))
        print(f"{name}: mok bf16 {t_bf16:.3f} ms, mok fp8 {t_fp8:.3f} ms, torch rowwise fp8 {t_torch:.3f} ms; "
              f"fp8 rel err vs dequantized {err:.1e}", flush=True)
    print()
    print(f"{'problem':<16} {'bf16 ms':>8} {'fp8 ms':>8} {'fp8/bf16':>9} {'fp8 TFLOP/s':>12} {'% fp8 peak':>11}"
          f" {'torch fp8 ms':>13} {'vs torch':>9}")
    for name, tb, tf, tt, flops, _ in rows:
        tfl = flops / tf / 1e9
        print(f"{name:<16} {tb:>8.3f} {tf:>8.3f} {tb / tf:>9.2f} {tfl:>12.0f} {100 * tfl / fp8_peak:>10.1f}%"
              f" {tt:>13.3f} {tt / tf:>9.2f}")


def quantization_comparison():
    """Where the FP8 forward quantizes, timed on the DeepSeek-V3 gate/up shape:
    x's rows by mok's kernel against the torch code (the same bytes, checked),
    and h quantized in the gate/up epilogue against the gate/up GEMM writing
    bf16 h followed by the row quantizer."""
    if not hasattr(torch.ops.mok, "grouped_mm_fp8_swiglu_quantize"):
        print("\n(this library has no quantizing gate/up: skipped)")
        return
    G, per, K, N = 32, 1024, 7168, 4096
    M = G * per
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    kernel = lambda: mok.quantize_rows(x)  # noqa: E731  (bf16 on the GPU: the kernel)
    torch_code = lambda: mok.quantize_rows(x.float())  # noqa: E731
    (kv, ks), (tv, ts) = kernel(), torch_code()
    assert torch.equal(ks, ts) and torch.equal(kv.view(torch.uint8), tv.view(torch.uint8)), "quantizers disagree"
    t_kernel, t_torch = paired_ms(kernel, torch_code)
    a, a_s = kv, ks
    q = mok.quantize_weights(torch.randn(G, N, K, device="cuda", generator=g) / K ** 0.5)
    off, cnt = mok.layout_from_counts([per] * G, device="cuda")
    fused = lambda: torch.ops.mok.grouped_mm_fp8_swiglu_quantize(a, a_s, q.values, q.scales, off, cnt)  # noqa: E731
    staged = lambda: mok.quantize_rows(mok.grouped_mm_fp8_swiglu(a, a_s, q.values, q.scales, off, cnt))  # noqa: E731
    t_fused, t_staged = paired_ms(fused, staged)
    print(f"\nquantizing x [{M}, {K}]: mok kernel {t_kernel:.3f} ms, torch {t_torch:.3f} ms ({t_torch / t_kernel:.1f}x); "
          f"gate/up with h quantized in the epilogue {t_fused:.3f} ms, gate/up then quantize_rows {t_staged:.3f} ms "
          f"({t_staged / t_fused:.2f}x)", flush=True)


def fp32_layer(x, ids, w, w13, w2, sw13, sw2):
    """The layer in fp32 torch with no rounding in between, one expert at a time."""
    I = w2.shape[2]
    xf = x.float()
    out = torch.zeros_like(xf)
    for e in range(w13.shape[0]):
        t, j = (ids == e).nonzero(as_tuple=True)
        if t.numel() == 0:
            continue
        gu = xf[t] @ w13[e].float().t()
        y = (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]) @ w2[e].float().t()
        out.index_add_(0, t, w[t, j, None].float() * y)
    if sw13 is not None:
        S = sw2.shape[1]
        gu = xf @ sw13.float().t()
        out += (torch.nn.functional.silu(gu[:, :S]) * gu[:, S:]) @ sw2.float().t()
    return out


def layer_comparison():
    name, T, H, I, E, k, shared = SHAPES[0]
    layer = make_layer(T, H, I, E, k, shared)
    x, ids, w, w13, w2, sw13, sw2 = layer
    q13, q2 = mok.quantize_weights(w13), mok.quantize_weights(w2)
    fp8 = lambda: staged_fp8_forward(x, ids, w, q13, q2, sw13, sw2)  # noqa: E731
    bf16 = lambda: mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E)[0]  # noqa: E731
    native = lambda: torch_native(*layer)  # noqa: E731
    # The fp32 layer on a slice of tokens (the full slice in fp32 torch would take minutes).
    rows = 256
    exact = fp32_layer(x[:rows], ids[:rows], w[:rows], w13, w2, sw13, sw2)
    errors = {label: float((fn()[:rows].float() - exact).norm() / exact.norm())
              for label, fn in (("staged fp8", fp8), ("fused bf16", bf16), ("torch-native bf16", native))}
    t_bf16, t_fp8 = paired_ms(bf16, fp8)
    t_native, _ = paired_ms(native, fp8)
    print(f"\n{name} layer: staged fp8 {t_fp8:.3f} ms, mok fused bf16 {t_bf16:.3f} ms "
          f"({t_bf16 / t_fp8:.2f}x), torch-native bf16 {t_native:.3f} ms ({t_native / t_fp8:.2f}x); error vs fp32 "
          f"on {rows} tokens: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))


if __name__ == "__main__":
    main()
    quantization_comparison()
    layer_comparison()
