"""The FP8 forward of the MoE layer, staged (not fused): mok's block-scaled
FP8 grouped GEMMs joined by torch quantization, gathers and the combine. It
is the FP8 recipe of issue 16 end to end -- activations quantized per 1 x 128
block, weights per 128 x 128 block (mok.quantize_weights), fp32 promotion
every 128 of K, the shared expert in BF16 -- a staged reference of the
recipe; the fused FP8 forward (mok.fused_forward_fp8) quantizes inside its
dispatch and its gate/up epilogue instead.

    out = shared(x) + sum_j w_j y_j          fp32, slots in order, one bf16 rounding
    y   = grouped_mm_fp8(hq, W2)
    hq  = grouped_mm_fp8_swiglu_quantize(quantize_rows(x rows), W13)   h quantized from fp32 in the
                                                                       gate/up epilogue (I % 128 == 0;
                                                                       else h in bf16, then quantize_rows)

The kernels are injected (Fp8Ops), so the same code runs on the CPU with
fp32 torch references of the ops (reference_fp8_ops()).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .quant import BLOCK, QuantizedWeights, quantize_rows
from .staged_backward import routed_schedule


class Fp8Ops(NamedTuple):
    grouped_mm_fp8: Callable         # (a, a_scales, b, b_scales, group_offset, group_rows) -> bf16
    grouped_mm_fp8_swiglu: Callable  # (a, a_scales, w13, w13_scales, group_offset, group_rows) -> bf16
    grouped_mm: Callable             # bf16 (the shared expert)
    grouped_mm_swiglu: Callable
    # (a, a_scales, w13, w13_scales, group_offset, group_rows) -> (h e4m3, h scales): h quantized from fp32
    grouped_mm_fp8_swiglu_quantize: Callable
    quantize_rows: Callable          # bf16 [M, K] -> (e4m3, scales)


def kernel_fp8_ops() -> Fp8Ops:
    m = torch.ops.mok
    return Fp8Ops(m.grouped_mm_fp8, m.grouped_mm_fp8_swiglu, m.grouped_mm, m.grouped_mm_swiglu,
                  m.grouped_mm_fp8_swiglu_quantize, quantize_rows)


def _dequantize_rows(values, scales):
    return values.float() * torch.exp2(scales.float() - 127).repeat_interleave(BLOCK, dim=-1)


def reference_fp8_ops() -> Fp8Ops:
    """fp32 torch references over the dequantized operands, per group."""
    from .testing import _group_spans, reference_grouped_mm

    def dequantized_weights(b, b_scales):
        return QuantizedWeights(b, b_scales, b, b_scales).dequantize()

    def mm(a, a_scales, b, b_scales, group_offset, group_rows, swiglu=False, dtype=torch.bfloat16):
        a_f, b_f = _dequantize_rows(a, a_scales), dequantized_weights(b, b_scales)
        n = b.shape[1] // 2 if swiglu else b.shape[1]
        out = torch.zeros(a.shape[0], n, dtype=dtype, device=a.device)
        for g, (first, end) in enumerate(_group_spans(group_offset, group_rows)):
            acc = a_f[first:end] @ b_f[g].t()
            if swiglu:
                acc = torch.nn.functional.silu(acc[:, :n]) * acc[:, n:]
            out[first:end] = acc.to(dtype)
        return out

    def swiglu_quantize(*args):
        # h in fp32 (no bf16 rounding), then the 1 x 128 quantizer; rows
        # outside every group come out as zeros (the kernel leaves them).
        return quantize_rows(mm(*args, swiglu=True, dtype=torch.float32))

    def swiglu_bf16(a, w13, group_offset, group_rows):
        gu = reference_grouped_mm(a, w13, group_offset, group_rows).float()
        n = w13.shape[1] // 2
        return (torch.nn.functional.silu(gu[:, :n]) * gu[:, n:]).bfloat16()

    return Fp8Ops(mm, lambda *a: mm(*a, swiglu=True), reference_grouped_mm, swiglu_bf16, swiglu_quantize,
                  quantize_rows)


def staged_fp8_forward(x, expert_ids, weights, w13: QuantizedWeights, w2: QuantizedWeights, shared_w13=None,
                       shared_w2=None, *, ops: Fp8Ops | None = None) -> torch.Tensor:
    """out [T, H] bf16 for x [T, H] bf16, expert_ids [T, k] (global ids),
    weights [T, k] fp32, the routed experts quantized (w13 of [E, 2I, H], w2
    of [E, H, I]: mok.quantize_weights) and the shared expert in bf16
    (shared_w13 [2S, H], shared_w2 [H, S]) or None. One rank, every expert."""
    if ops is None:
        ops = reference_fp8_ops() if x.device.type == "cpu" else kernel_fp8_ops()
    T, k = expert_ids.shape
    E = w13.values.shape[0]
    s = routed_schedule(expert_ids, E)
    xq, xs = ops.quantize_rows(x.index_select(0, s.token_of_row))
    if (w13.values.shape[1] // 2) % BLOCK == 0:  # h quantized in the gate/up epilogue, from fp32
        hq, hs = ops.grouped_mm_fp8_swiglu_quantize(xq, xs, w13.values, w13.scales, s.group_offset, s.group_rows)
    else:
        hq, hs = ops.quantize_rows(ops.grouped_mm_fp8_swiglu(xq, xs, w13.values, w13.scales, s.group_offset,
                                                             s.group_rows))
    y = ops.grouped_mm_fp8(hq, hs, w2.values, w2.scales, s.group_offset, s.group_rows)
    acc = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    if shared_w13 is not None:  # the shared expert stays BF16
        one = torch.arange(2, dtype=torch.int32, device=x.device) * T
        rows = torch.full((1,), T, dtype=torch.int32, device=x.device)
        sh = ops.grouped_mm_swiglu(x, shared_w13.unsqueeze(0), one, rows)
        acc = acc + ops.grouped_mm(sh, shared_w2.unsqueeze(0), one, rows).float()
    slot_rows = s.row_of_entry.view(T, k)
    for j in range(k):  # the forward's combine order: shared, then slots 0..k-1
        acc = acc + weights[:, j:j + 1].float() * y.index_select(0, slot_rows[:, j]).float()
    return acc.to(torch.bfloat16)


__all__ = ["Fp8Ops", "kernel_fp8_ops", "reference_fp8_ops", "staged_fp8_forward"]
