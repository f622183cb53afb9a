"""Autograd on the ops, on meta tensors (no GPU): fused_forward and grouped_mm
have a staged backward whose gradients have their inputs' shapes and dtypes;
grouped_mm_swiglu's backward raises a clear error (never a silent None
gradient), and so does a double backward."""

import pytest
import torch

import mok
from mok.autograd import BACKWARD_UNAVAILABLE
from mok.staged_backward import has_kernel_ops

H, I, E, K, T = 128, 64, 4, 2, 16

needs_backward_ops = pytest.mark.skipif(not has_kernel_ops(), reason="libmok_torch.so predates the backward ops")


def _layer(requires_grad, tokens=T, shared=False):
    def t(*shape, dtype=torch.bfloat16, grad=requires_grad):
        return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)
    x = t(tokens, H)
    ids = t(tokens, K, dtype=torch.int32, grad=False)
    w = t(tokens, K, dtype=torch.float32)
    w13 = t(E, 2 * I, H)
    w2 = t(E, H, I)
    sw13 = t(2 * I, H) if shared else None
    sw2 = t(H, I) if shared else None
    return x, ids, w, w13, w2, sw13, sw2


@needs_backward_ops
@pytest.mark.parametrize("shared", [True, False])
def test_fused_forward_backward_gives_every_input_a_gradient_of_its_shape(shared):
    x, ids, w, w13, w2, sw13, sw2 = _layer(True, shared=shared)
    out = mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E)[0]
    out.float().sum().backward()
    for leaf in (x, w, w13, w2) + ((sw13, sw2) if shared else ()):
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype


@needs_backward_ops
def test_fused_forward_backward_splits_gradients_per_rank():
    # Two ranks: 16 and 0 tokens (a rank may have none), two experts each.
    x0, ids0, w0, _, _, _, _ = _layer(True)
    x1, ids1, w1, _, _, _, _ = _layer(True, tokens=0)
    w13 = [torch.empty(E // 2, 2 * I, H, dtype=torch.bfloat16, device="meta", requires_grad=True) for _ in range(2)]
    w2 = [torch.empty(E // 2, H, I, dtype=torch.bfloat16, device="meta", requires_grad=True) for _ in range(2)]
    outs = mok.fused_forward([x0, x1], [ids0, ids1], [w0, w1], w13, w2, num_experts=E, ring_slots=2)
    torch.cat(outs).float().sum().backward()
    for leaf in [x0, x1, w0, w1] + w13 + w2:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype


@needs_backward_ops
def test_only_what_requires_grad_gets_a_gradient():
    x, ids, w, w13, w2, _, _ = _layer(False)
    w2.requires_grad_(True)
    out = mok.fused_forward([x], [ids], [w], [w13], [w2], num_experts=E)[0]
    out.float().sum().backward()
    assert w2.grad is not None and w2.grad.shape == w2.shape
    assert x.grad is None and w.grad is None and w13.grad is None


def test_no_grad_inputs_need_no_backward():
    x, ids, w, w13, w2, _, _ = _layer(requires_grad=False)
    out = mok.fused_forward([x], [ids], [w], [w13], [w2], num_experts=E)[0]
    assert not out.requires_grad


@needs_backward_ops
def test_double_backward_raises():
    x, ids, w, w13, w2, _, _ = _layer(True)
    out = mok.fused_forward([x], [ids], [w], [w13], [w2], num_experts=E)[0]
    with pytest.raises(NotImplementedError, match="create_graph=True is not supported"):
        torch.autograd.grad(out.float().sum(), [x], create_graph=True)


def _gemm_operands(requires_grad):
    a = torch.empty(64, 128, dtype=torch.bfloat16, device="meta", requires_grad=requires_grad)
    b = torch.empty(2, 192, 128, dtype=torch.bfloat16, device="meta", requires_grad=requires_grad)
    off = torch.empty(3, dtype=torch.int32, device="meta")
    rows = torch.empty(2, dtype=torch.int32, device="meta")
    return a, b, off, rows


@needs_backward_ops
def test_grouped_mm_backward_gives_gradients_of_the_operands_shapes():
    a, b, off, rows = _gemm_operands(True)
    mok.grouped_mm(a, b, off, rows).float().sum().backward()
    assert a.grad.shape == a.shape and a.grad.dtype == torch.bfloat16
    assert b.grad.shape == b.shape and b.grad.dtype == torch.bfloat16


def test_grouped_mm_swiglu_backward_raises():
    a, b, off, rows = _gemm_operands(True)
    out = mok.grouped_mm_swiglu(a, b, off, rows)
    with pytest.raises(NotImplementedError, match="mok.grouped_mm_swiglu has no gradient"):
        out.float().sum().backward()
    assert a.grad is None


def test_the_message_says_what_to_do():
    text = BACKWARD_UNAVAILABLE.format(op="mok.grouped_mm_swiglu")
    assert "torch.no_grad()" in text and "detach" in text
