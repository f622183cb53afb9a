"""Autograd on the ops: until the fused backward exists, backward through any
of them raises a clear error; a gradient is never silently None."""

import pytest
import torch

import mok
from mok.autograd import BACKWARD_UNAVAILABLE

H, I, E, K, T = 128, 64, 4, 2, 16


def _layer(requires_grad):
    x = torch.empty(T, H, dtype=torch.bfloat16, device="meta", requires_grad=requires_grad)
    ids = torch.empty(T, K, dtype=torch.int32, device="meta")
    w = torch.empty(T, K, dtype=torch.float32, device="meta")
    w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device="meta")
    w2 = torch.empty(E, H, I, dtype=torch.bfloat16, device="meta", requires_grad=requires_grad)
    return x, ids, w, w13, w2


def test_backward_raises_a_clear_error():
    x, ids, w, w13, w2 = _layer(requires_grad=True)
    out = mok.fused_forward([x], [ids], [w], [w13], [w2], num_experts=E)[0]
    assert out.requires_grad and out.grad_fn is not None
    with pytest.raises(NotImplementedError, match="mok: the fused backward is not implemented yet"):
        out.float().sum().backward()
    assert x.grad is None


def test_no_grad_inputs_need_no_backward():
    x, ids, w, w13, w2 = _layer(requires_grad=False)
    out = mok.fused_forward([x], [ids], [w], [w13], [w2], num_experts=E)[0]
    assert not out.requires_grad


def test_grouped_gemm_backward_raises_too():
    a = torch.empty(64, 128, dtype=torch.bfloat16, device="meta", requires_grad=True)
    b = torch.empty(2, 192, 128, dtype=torch.bfloat16, device="meta")
    off = torch.empty(3, dtype=torch.int32, device="meta")
    rows = torch.empty(2, dtype=torch.int32, device="meta")
    out = mok.grouped_mm(a, b, off, rows)
    with pytest.raises(NotImplementedError, match="mok.grouped_mm has no gradient"):
        out.float().sum().backward()


def test_the_message_says_what_to_do():
    text = BACKWARD_UNAVAILABLE.format(op="mok.fused_forward")
    assert "torch.no_grad()" in text and "detach" in text
