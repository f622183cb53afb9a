"""The fused forward's autograd in eager mode, without torch.library's wrapper.

torch.library.register_autograd (mok/autograd.py registers the formulas that
way, which is what torch.compile traces) runs every call of a recorded op
through a generic Python wrapper: the op's list arguments are flattened and
rebuilt with pytree, its defaults filled in from the schema, its outputs
flattened again, and the same in the backward. For mok's ops, with five
per-rank lists each, that wrapper costs several times the op's own host
time (docs/perf-notes.md v3: on the CPU machine, with the ops stubbed, a
recorded forward takes 163-316 us through it and 62-145 us here, its
backward 153-382 and 113-268 us; a noisy two-core machine, five paired
runs). On a small layer, whose kernels run for about a millisecond,
the host's time per call decides whether a training loop keeps the GPU busy.

So in eager mode, where autograd records the call, mok.fused_forward goes
through the two autograd.Functions below instead: they take the per-rank
lists flattened by hand, call the same op below autograd, and run the same
setup_context and backward functions as the registered formulas (in
mok/autograd.py), so the saved state, the gradients and their bits are the
registered path's. Under torch.compile, or with MOK_EAGER_AUTOGRAD=0, the op
is called as registered. Either way the kernels and what they compute are
the same; only the host's bookkeeping differs.

One step further, on one rank with the staged backward (node_applies, save
or recompute mode): torch.ops.mok.fused_forward_train_node records the call
as a C++ autograd node (python/csrc/train_node_ops.cpp), whose backward runs
no Python at all -- the largest host cost left before the backward's first
kernel (docs/perf-notes.md v34). MOK_CPP_AUTOGRAD=0 keeps the Functions
below.
"""

from __future__ import annotations

import contextlib
import os

import torch

from . import autograd

# The structured needs_input_grad the backward functions read: x, expert_ids,
# weights, w13, w2 (per-rank lists), shared_w13, shared_w2; then one False per
# non-tensor argument they may be cut to (_fit returns as many entries).
_LISTS = 5
_TAIL = 5  # num_experts, tuning, check_errors, (keep_preact,) token_capacity: never differentiable


def enabled() -> bool:
    """Whether mok.fused_forward uses these Functions (eager mode, not
    disabled by MOK_EAGER_AUTOGRAD=0)."""
    if torch.compiler.is_compiling():
        return False
    return os.environ.get("MOK_EAGER_AUTOGRAD", "1").strip().lower() not in ("0", "off", "false", "no")


def below_autograd():
    """A context in which mok's ops dispatch below autograd: what their
    registered autograd kernel does itself when it records nothing (grad mode
    off, or no input requiring grad), without entering that kernel, which
    torch.library implements in Python (a per-call cost before the launch).
    For calls that autograd does not record: the plain op without grad, and
    the op inside the Functions below (their forward runs with grad mode off).
    Never under torch.compile, which must see the op as registered."""
    guard = getattr(torch._C, "_AutoDispatchBelowAutograd", None)
    return guard() if guard is not None and not torch.compiler.is_compiling() else contextlib.nullcontext()


def applies(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, *, recorded: bool | None = None) -> bool:
    """Whether a mok.fused_forward call with these (list) arguments goes
    through the Functions here: autograd records it (autograd.records_grad,
    or `recorded` when the caller has it already), enabled(), and the per-rank
    lists are well formed (one tensor per rank each), so that flattening them
    by hand cannot misplace a tensor; a malformed call goes to the op, whose
    checks name what is wrong."""
    if recorded is None:
        recorded = autograd.records_grad(x, weights, w13, w2, shared_w13, shared_w2)
    if not recorded or not enabled():
        return False
    R = len(x)
    lists = (x, expert_ids, weights, w13, w2)
    if R == 0 or any(len(group) != R or not all(isinstance(t, torch.Tensor) for t in group) for group in lists):
        return False
    return all(t is None or isinstance(t, torch.Tensor) for t in (shared_w13, shared_w2))


def _flatten(x, expert_ids, weights, w13, w2, shared_w13, shared_w2) -> tuple:
    return (*x, *expert_ids, *weights, *w13, *w2, shared_w13, shared_w2)


def _lists(flat, R):
    """The flattened inputs back into (x, expert_ids, weights, w13, w2), shared_w13, shared_w2."""
    lists = tuple(list(flat[i * R:(i + 1) * R]) for i in range(_LISTS))
    return lists, flat[_LISTS * R], flat[_LISTS * R + 1]


def _structured_needs(flat_needs, R):
    (x, ids, w, w13, w2), sw13, sw2 = _lists(flat_needs, R)
    return (x, ids, w, w13, w2, sw13, sw2) + (False,) * _TAIL


def _flat_grads(grads, R):
    """The backward functions' structured result, flattened as the inputs were
    (one gradient per per-rank tensor, then the shared expert's two)."""
    flat = [None]  # the spec argument
    for i in range(_LISTS):
        flat += list(grads[i]) if grads[i] is not None else [None] * R
    flat += [grads[_LISTS], grads[_LISTS + 1]]
    return tuple(flat)


def _backward(ctx, backward_fn, douts):
    R = ctx.world
    flat_needs = ctx.needs_input_grad
    ctx.needs_input_grad = _structured_needs(flat_needs[1:], R)
    try:
        grads = backward_fn(ctx, douts)
    finally:
        ctx.needs_input_grad = flat_needs  # a retained graph's next backward reads it again
    return _flat_grads(grads, R)


class FusedForward(torch.autograd.Function):
    """torch.ops.mok.fused_forward with mok/autograd.py's formula (the staged
    backward, recompute mode)."""

    @staticmethod
    def forward(ctx, spec, *flat):
        R, num_experts, tuning, check_errors, token_capacity = spec
        (x, ids, w, w13, w2), shared_w13, shared_w2 = _lists(flat, R)
        with below_autograd():
            out = torch.ops.mok.fused_forward(x, ids, w, w13, w2, shared_w13, shared_w2, num_experts, tuning,
                                              check_errors, token_capacity=token_capacity)
        inputs = (x, ids, w, w13, w2, shared_w13, shared_w2, num_experts, tuning, check_errors, token_capacity)
        autograd._setup_fused_forward(ctx, inputs, out)
        return tuple(out)

    @staticmethod
    def backward(ctx, *douts):
        return _backward(ctx, autograd._fused_forward_backward, list(douts))


class FusedForwardTrain(torch.autograd.Function):
    """torch.ops.mok.fused_forward_train with mok/autograd.py's formula (save
    mode, or the fused backward kernel's recompute mode with keep_preact
    False). Returns every output flattened: out (one per rank) first."""

    @staticmethod
    def forward(ctx, spec, *flat):
        R, num_experts, tuning, check_errors, keep_preact, token_capacity = spec
        (x, ids, w, w13, w2), shared_w13, shared_w2 = _lists(flat, R)
        with below_autograd():
            result = torch.ops.mok.fused_forward_train(x, ids, w, w13, w2, shared_w13, shared_w2, num_experts,
                                                       tuning, check_errors, keep_preact=keep_preact,
                                                       token_capacity=token_capacity)
        inputs = (x, ids, w, w13, w2, shared_w13, shared_w2, num_experts, tuning, check_errors, keep_preact,
                  token_capacity)
        autograd._setup_fused_forward_train(ctx, inputs, result)
        return tuple(t for group in result for t in group)

    @staticmethod
    def backward(ctx, *grads):
        # Only out's gradients (the first R) matter; the kept outputs' are None.
        return _backward(ctx, autograd._fused_forward_train_backward, list(grads[:ctx.world]))


def node_applies(x) -> bool:
    """Whether a recorded call with the staged backward (one that applies()
    accepted; save or recompute mode) goes through
    torch.ops.mok.fused_forward_train_node, the same forward recorded as a
    C++ autograd node whose backward is the staged chain
    (python/csrc/train_node_ops.cpp: the same kernels and bits, without the
    Python node's host time before the backward's first kernel): one rank,
    real CUDA tensors in eager mode with no dispatch mode, the staged backward
    (MOK_BACKWARD unset, "auto" or "staged"), a library with the op, and not
    MOK_CPP_AUTOGRAD=0 (read at each forward)."""
    if len(x) != 1 or os.environ.get("MOK_CPP_AUTOGRAD", "1").strip().lower() in ("0", "off", "false", "no"):
        return False
    from .staged_backward import _eager_cuda
    return _eager_cuda(x[0], "fused_forward_train_node") and autograd.backward_path(x[0].device) == "staged"


def fused_forward_train_node(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning,
                             check_errors, save_activations, token_capacity):
    """[out]: the forward for one rank through
    torch.ops.mok.fused_forward_train_node (node_applies), in save mode
    (save_activations) or recompute mode. The main_grad buffers hung on the
    weights are read here, at the forward, as the Python path's setup does."""
    main = autograd._main_grads(w13, w2, shared_w13, shared_w2)
    return [torch.ops.mok.fused_forward_train_node(x[0], expert_ids[0], weights[0], w13[0], w2[0], shared_w13,
                                                   shared_w2, num_experts, tuning, check_errors, token_capacity,
                                                   bool(save_activations), main.w13, main.w2, main.shared_w13,
                                                   main.shared_w2)]


def fused_forward(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning, check_errors,
                  token_capacity):
    """[out[r]]: torch.ops.mok.fused_forward's result, through FusedForward."""
    spec = (len(x), num_experts, tuning, check_errors, token_capacity)
    return list(FusedForward.apply(spec, *_flatten(x, expert_ids, weights, w13, w2, shared_w13, shared_w2)))


def fused_forward_train_out(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning,
                            check_errors, keep_preact, token_capacity):
    """[out[r]] of torch.ops.mok.fused_forward_train, through FusedForwardTrain
    (what it kept stays in the autograd graph)."""
    spec = (len(x), num_experts, tuning, check_errors, keep_preact, token_capacity)
    flat = FusedForwardTrain.apply(spec, *_flatten(x, expert_ids, weights, w13, w2, shared_w13, shared_w2))
    return list(flat[:len(x)])


__all__ = ["FusedForward", "FusedForwardTrain", "applies", "below_autograd", "enabled", "fused_forward",
           "fused_forward_train_node", "fused_forward_train_out", "node_applies"]
