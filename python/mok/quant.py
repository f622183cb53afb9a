"""Block-scaled FP8 weights for the FP8 passes (include/mok/fp8.hpp is the
C++ twin; both follow the same rounding, written out there):

  quantize_weights(w) -> QuantizedWeights(values, scales, values_t, scales_t)
  quantize_rows(x)    -> (values, scales)     activations, 1 x 128 blocks

w [..., rows, cols] (rows and cols multiples of 128; any float dtype, any
device) is quantized in 128 x 128 blocks: scale 2^e per block, the smallest
power of two with amax <= 448 * 2^e (UE8M0, stored as the byte e + 127),
values e4m3 = round-to-nearest-even(w / 2^e) as torch.float8_e4m3fn. The
transposed copy [..., cols, rows] -- what a backward's K-major operand reads --
is the same blocks transposed, which is exactly the quantization of w^T.
Non-finite weights are refused.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BLOCK = 128
E4M3_MAX = 448.0


class QuantizedWeights(NamedTuple):
    values: torch.Tensor    # float8_e4m3fn [..., rows, cols]
    scales: torch.Tensor    # uint8 (UE8M0) [..., rows / 128, cols / 128]
    values_t: torch.Tensor  # float8_e4m3fn [..., cols, rows]
    scales_t: torch.Tensor  # uint8 [..., cols / 128, rows / 128]

    def dequantize(self) -> torch.Tensor:
        """values * 2^(scale - 127) in fp32, [..., rows, cols]."""
        scale = torch.ldexp(torch.ones_like(self.scales, dtype=torch.float32), self.scales.to(torch.int32) - 127)
        scale = scale.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
        return self.values.float() * scale


def scale_exponents(amax: torch.Tensor) -> torch.Tensor:
    """The block scale's exponent e (int32) for blocks of absolute maximum
    `amax`: the smallest e with amax <= 448 * 2^e, in [-127, 127]; 0 for an
    all-zero block. Exact: 448 = 0.875 * 2^9, so with amax = f * 2^k
    (f in [0.5, 1)), e = k - 9 if f <= 0.875, else k - 8."""
    f, k = torch.frexp(amax.float())
    e = torch.where(f <= 0.875, k - 9, k - 8)
    e = torch.where(amax > 0, e, torch.zeros_like(e))
    return e.clamp(-127, 127).to(torch.int32)


def quantize_weights(w: torch.Tensor) -> QuantizedWeights:
    if w.dim() < 2:
        raise ValueError(f"quantize_weights: w has {w.dim()} dims; expected [..., rows, cols]")
    rows, cols = w.shape[-2], w.shape[-1]
    if rows % BLOCK or cols % BLOCK:
        raise ValueError(f"quantize_weights: rows = {rows}, cols = {cols}: both must be multiples of {BLOCK}")
    wf = w.detach().float()
    if not bool(torch.isfinite(wf).all()):
        bad = torch.nonzero(~torch.isfinite(wf))[0].tolist()
        raise ValueError(f"quantize_weights: w{bad} is not finite")
    lead = wf.shape[:-2]
    blocks = wf.reshape(-1, rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    e = scale_exponents(blocks.abs().amax(dim=(2, 4)))  # [G, rows / 128, cols / 128]
    scaled = torch.ldexp(blocks, -e[:, :, None, :, None])  # a power of two: exact
    values = scaled.reshape(wf.shape).to(torch.float8_e4m3fn)
    scales = (e + 127).to(torch.uint8).reshape(*lead, rows // BLOCK, cols // BLOCK)
    return QuantizedWeights(values, scales, values.transpose(-1, -2).contiguous(),
                            scales.transpose(-1, -2).contiguous())


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation rows x [rows, cols] (cols a multiple of 128) in 1 x 128
    blocks, the same rounding as quantize_weights: (values float8_e4m3fn
    [rows, cols], scales uint8 UE8M0 [rows, cols / 128]) -- what
    mok.grouped_mm_fp8 reads as its A operand. Non-finite values are refused.
    bf16 rows on a GPU go through mok's kernel (torch.ops.mok.quantize_rows_fp8),
    which gives the same bytes as this torch code."""
    if x.dim() != 2 or x.shape[1] % BLOCK:
        raise ValueError(f"quantize_rows: x is {tuple(x.shape)}; expected [rows, cols] with cols a multiple of {BLOCK}")
    x = x.detach()
    if not bool(torch.isfinite(x).all()):  # on x itself: the kernel path needs no fp32 copy
        bad = torch.nonzero(~torch.isfinite(x))[0].tolist()
        raise ValueError(f"quantize_rows: x{bad} is not finite")
    if x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch.ops.mok, "quantize_rows_fp8"):
        # The kernel (include/mok/quantize_rows.hpp): the same bytes, one launch.
        return torch.ops.mok.quantize_rows_fp8(x.contiguous())
    xf = x.float()
    blocks = xf.reshape(x.shape[0], -1, BLOCK)
    e = scale_exponents(blocks.abs().amax(dim=2))  # [rows, cols / 128]
    values = torch.ldexp(blocks, -e[:, :, None]).reshape(xf.shape).to(torch.float8_e4m3fn)
    return values, (e + 127).to(torch.uint8)


__all__ = ["QuantizedWeights", "quantize_rows", "quantize_weights", "scale_exponents"]
