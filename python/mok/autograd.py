"""Autograd for the mok ops.

The fused backward does not exist yet, so each op's backward raises a clear
error instead of leaving gradients silently None. Each op has its own context
setup and backward here; the real backward replaces `_backward_unavailable`
for its op (and its setup saves, or marks for recomputation, what that
backward needs) without touching the op or its callers.
"""

from __future__ import annotations

import torch

BACKWARD_UNAVAILABLE = (
    "mok: the fused backward is not implemented yet; {op} has no gradient. Call it on tensors that do not "
    "require grad (detach them, or run it under torch.no_grad()), or use a torch implementation of the layer "
    "for training until the fused backward lands.")


def _backward_unavailable(op_name: str):
    def backward(ctx, *grads):
        raise NotImplementedError(BACKWARD_UNAVAILABLE.format(op=op_name))
    return backward


def _save_nothing(ctx, inputs, output):
    """Nothing to save until a backward exists."""


def register() -> None:
    """Registers the autograd formulas (once, at import of mok)."""
    for name in ("fused_forward", "grouped_mm", "grouped_mm_swiglu", "process_world_run"):
        torch.library.register_autograd("mok::" + name, _backward_unavailable("mok." + name),
                                        setup_context=_save_nothing)
