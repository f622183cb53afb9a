"""mok: deterministic MoE kernels for Hopper, as PyTorch custom ops.

Importing this package loads libmok_torch.so, which registers:

  torch.ops.mok.grouped_mm(a, b, group_offset, group_rows) -> out
      a [M, K] bf16, b [G, N, K] bf16 (nn.Linear layout), group_offset int32
      [G + 1] (padded start rows), group_rows int32 [G] (real rows); all on one
      CUDA device. out [M, N] bf16; rows of a group past its real rows (the
      padding) are left unwritten (uninitialised memory).
  torch.ops.mok.grouped_mm_swiglu(a, w13, group_offset, group_rows) -> out
      w13 [G, 2N, K]: rows [0, N) gate, [N, 2N) up. out [M, N] =
      silu(a @ gate^T) * (a @ up^T), fp32 math, one bf16 rounding.

  torch.ops.mok.fused_forward(x, expert_ids, weights, w13, w2, shared_w13,
                              shared_w2, num_experts, ...) -> out
      The fused MoE forward over a virtual world of R = len(x) ranks on one
      GPU; see fused_forward() below.

K and N must be multiples of 64. The library is searched in $MOK_LIB_DIR, then
<repo>/build/python.
"""

from __future__ import annotations

import os
import pathlib

import torch

_LIB_NAME = "libmok_torch.so"


def _find_library() -> pathlib.Path:
    candidates = []
    env = os.environ.get("MOK_LIB_DIR")
    if env:
        candidates.append(pathlib.Path(env) / _LIB_NAME)
    candidates.append(pathlib.Path(__file__).resolve().parents[2] / "build" / "python" / _LIB_NAME)
    for path in candidates:
        if path.is_file():
            return path
    raise ImportError(
        "mok: cannot find " + _LIB_NAME + " (looked in: " + ", ".join(str(p) for p in candidates)
        + "); build it with `cmake --preset default -DMOK_TORCH=ON && cmake --build --preset default`"
        " or set MOK_LIB_DIR")


torch.ops.load_library(str(_find_library()))


def grouped_mm(a: torch.Tensor, b: torch.Tensor, group_offset: torch.Tensor,
               group_rows: torch.Tensor) -> torch.Tensor:
    """out[rows of group g] = a[rows] @ b[g]^T (see module docstring)."""
    return torch.ops.mok.grouped_mm(a, b, group_offset, group_rows)


def grouped_mm_swiglu(a: torch.Tensor, w13: torch.Tensor, group_offset: torch.Tensor,
                      group_rows: torch.Tensor) -> torch.Tensor:
    """out = silu(a @ gate^T) * (a @ up^T) per group, fused (see module docstring)."""
    return torch.ops.mok.grouped_mm_swiglu(a, w13, group_offset, group_rows)


def fused_forward(x, expert_ids, weights, w13, w2, shared_w13=None, shared_w2=None, *,
                  num_experts: int, minibatch_rows: int = 0, ring_slots: int = 0,
                  ctas_per_rank: int = 0, comm_ctas_per_rank: int = 0, lookahead: int = 0,
                  check_errors: bool = False):
    """The fused MoE layer forward (one persistent kernel).

    Lists hold one tensor per rank of a virtual world on one GPU (R = len(x)):
    x[r] [T_r, H] bf16, expert_ids[r] [T_r, k] int32 (global ids),
    weights[r] [T_r, k] fp32, w13[r] [E/R, 2I, H] bf16 (gate rows, then up),
    w2[r] [E/R, H, I] bf16; shared_w13 [2S, H] and shared_w2 [H, S] bf16, or
    None. Returns [out[r] [T_r, H] bf16]. Results are bitwise identical for
    any R, minibatch, ring size or SM split. check_errors=True synchronises
    and raises on a stalled pass or a bad expert id (rank, token, slot named).
    The tuning options are FusedForwardOptions (include/mok/fused_forward.hpp);
    0 keeps the library's default, or its automatic choice for the CTA counts.
    """
    out = torch.ops.mok.fused_forward(list(x), list(expert_ids), list(weights), list(w13), list(w2),
                                      shared_w13, shared_w2, num_experts, minibatch_rows, ring_slots,
                                      ctas_per_rank, comm_ctas_per_rank, lookahead, check_errors)
    if not out:  # the op reports errors through last_error(), never by a C++ exception
        raise RuntimeError(torch.ops.mok.last_error())
    return out


def layout_from_counts(counts, tile_rows: int = 1, device=None):
    """(group_offset, group_rows) int32 tensors for groups of `counts` rows,
    each padded to a multiple of `tile_rows` (1 = contiguous, no padding)."""
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + (int(c) + tile_rows - 1) // tile_rows * tile_rows)
    return (torch.tensor(offsets, dtype=torch.int32, device=device),
            torch.tensor([int(c) for c in counts], dtype=torch.int32, device=device))


__all__ = ["fused_forward", "grouped_mm", "grouped_mm_swiglu", "layout_from_counts"]
