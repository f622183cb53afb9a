"""The backward's ops (grouped_mm_kn, swiglu_backward_mm, weight_grad_mm,
weight_grad_mm_acc_) without a GPU: output shapes on meta tensors, each bad
argument named (op_errors.hpp's convention), CPU tensors refused. Their values:
test_backward_gpu.py."""

import pytest
import torch

import mok
from mok.staged_backward import has_kernel_ops

if not has_kernel_ops():
    pytest.skip("libmok_torch.so predates the backward ops", allow_module_level=True)

M, H, I, G = 96, 128, 64, 3


def _t(*shape, dtype=torch.bfloat16, device="meta"):
    return torch.empty(*shape, dtype=dtype, device=device)


def _tables(device="meta", groups=G):
    return _t(groups + 1, dtype=torch.int32, device=device), _t(groups, dtype=torch.int32, device=device)


def test_output_shapes_and_dtypes():
    off, rows = _tables()
    out = mok.grouped_mm_kn(_t(M, 2 * I), _t(G, 2 * I, H), off, rows)
    assert out.shape == (M, H) and out.dtype == torch.bfloat16
    for scale in (_t(M, dtype=torch.float32), None):
        d13, act, dscale = mok.swiglu_backward_mm(_t(M, H), _t(G, H, I), _t(M, 2 * I), scale, off, rows)
        assert d13.shape == (M, 2 * I) and act.shape == (M, I) and dscale.shape == (M,)
        assert d13.dtype == act.dtype == torch.bfloat16 and dscale.dtype == torch.float32
    grad = mok.weight_grad_mm(_t(M, 2 * I), _t(M, H), off, rows, G)
    assert grad.shape == (G, 2 * I, H) and grad.dtype == torch.float32
    acc = _t(G, 2 * I, H, dtype=torch.float32)
    assert mok.weight_grad_mm_acc_(acc, _t(M, 2 * I), _t(M, H), off, rows) is acc


def _call(op, args):
    return getattr(mok, op)(*args)


def _good(op, device="meta"):
    def _t(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device=device)
    off, rows = _tables(device)
    return {
        "grouped_mm_kn": [_t(M, 2 * I), _t(G, 2 * I, H), off, rows],
        "swiglu_backward_mm": [_t(M, H), _t(G, H, I), _t(M, 2 * I), _t(M, dtype=torch.float32), off, rows],
        "weight_grad_mm": [_t(M, 2 * I), _t(M, H), off, rows, G],
        "weight_grad_mm_acc_": [_t(G, 2 * I, H, dtype=torch.float32), _t(M, 2 * I), _t(M, H), off, rows],
    }[op]


@pytest.mark.parametrize("op, position, bad, message", [
    ("grouped_mm_kn", 0, lambda t: t.float(), r"a must be BFloat16 \(got Float\)"),
    ("grouped_mm_kn", 1, lambda t: t[:, :64].contiguous(), r"a is \[M, K\] = \[96, 128\] but b is \[G, K, N\] = "
                                              r"\[3, 64, 128\]: K differs"),
    ("grouped_mm_kn", 1, lambda t: t.transpose(1, 2), "b must be contiguous"),
    ("grouped_mm_kn", 2, lambda t: t[:3], r"group_offset must have G \+ 1 = 4 entries \(got 3\)"),
    ("swiglu_backward_mm", 1, lambda t: t[:, :64].contiguous(), "H differs"),
    ("swiglu_backward_mm", 2, lambda t: t[:, :I].contiguous(), r"preact must be \[M, 2I\].* = \[96, 128\]"),
    ("swiglu_backward_mm", 3, lambda t: t[:5].contiguous(), r"row_scale must be \[M\].* = \[96\] \(got \[5\]\)"),
    ("swiglu_backward_mm", 3, lambda t: t.bfloat16(), r"row_scale must be Float"),
    ("swiglu_backward_mm", 5, lambda t: t.long(), "group_rows must be Int"),
    ("weight_grad_mm", 1, lambda t: t[:5].contiguous(), "their row counts M differ"),
    ("weight_grad_mm", 4, lambda t: 0, "num_groups = 0 must be >= 1"),
    ("weight_grad_mm", 4, lambda t: 2, r"group_rows must have G = 2 entries \(got 3\)"),
    ("weight_grad_mm_acc_", 0, lambda t: t.bfloat16(), r"out must be Float \(got BFloat16\)"),
    ("weight_grad_mm_acc_", 0, lambda t: t[:, :64].contiguous(), r"out must be \[G, m, n\].* = \[3, 128, 128\]"),
])
def test_a_bad_argument_is_named(op, position, bad, message):
    args = _good(op)
    args[position] = bad(args[position])
    with pytest.raises(RuntimeError, match=message):
        _call(op, args)


def test_tensors_on_another_device_are_refused():
    args = _good("weight_grad_mm_acc_")
    args[2] = _t(M, H, device="cpu")
    with pytest.raises(RuntimeError, match="b is on cpu; out is on meta"):
        _call("weight_grad_mm_acc_", args)


@pytest.mark.parametrize("op", ["grouped_mm_kn", "swiglu_backward_mm", "weight_grad_mm", "weight_grad_mm_acc_"])
def test_cpu_tensors_are_refused_by_name(op):
    args = _good(op, "cpu")
    first = {"swiglu_backward_mm": "dout_rows", "weight_grad_mm_acc_": "out"}.get(op, "a")
    with pytest.raises(RuntimeError, match=first + " is on cpu; mok runs on CUDA tensors"):
        _call(op, args)


def test_gather_indices_set_the_row_count():
    """With an index, the operand is a source of any row count and M is the index's length."""
    off, rows = _tables()
    idx = _t(M, dtype=torch.int32)
    d13, act, dscale = mok.swiglu_backward_mm(_t(7, H), _t(G, H, I), _t(M, 2 * I), None, off, rows, idx)
    assert d13.shape == (M, 2 * I) and act.shape == (M, I) and dscale.shape == (M,)
    grad = mok.weight_grad_mm(_t(M, 2 * I), _t(5, H), off, rows, G, None, None, idx)
    assert grad.shape == (G, 2 * I, H)
    grad = mok.weight_grad_mm(_t(9, 2 * I), _t(5, H), off, rows, G, torch.bfloat16, idx, idx)
    assert grad.shape == (G, 2 * I, H) and grad.dtype == torch.bfloat16
    acc = _t(G, 2 * I, H, dtype=torch.float32)
    assert mok.weight_grad_mm_acc_(acc, _t(M, 2 * I), _t(5, H), off, rows, None, idx) is acc


@pytest.mark.parametrize("call, message", [
    (lambda off, rows: mok.swiglu_backward_mm(_t(7, H), _t(G, H, I), _t(M, 2 * I), None, off, rows,
                                              _t(M, dtype=torch.int64)), r"dout_index must be Int \(got Long\)"),
    (lambda off, rows: mok.swiglu_backward_mm(_t(7, H), _t(G, H, I), _t(M, 2 * I), None, off, rows,
                                              _t(M + 1, dtype=torch.int32)), r"preact must be \[M, 2I\]"),
    (lambda off, rows: mok.weight_grad_mm(_t(M, 2 * I), _t(5, H), off, rows, G, None, None,
                                          _t(M - 1, dtype=torch.int32)), "their row counts M differ"),
    (lambda off, rows: mok.weight_grad_mm(_t(M, 2 * I), _t(0, H), off, rows, G, None, None,
                                          _t(M, dtype=torch.int32)), "b_index gathers rows of a tensor with none"),
    (lambda off, rows: mok.weight_grad_mm(_t(M, 2 * I), _t(5, H), off, rows, G, None, _t(M, 2, dtype=torch.int32)),
     "a_index must have 1 dimensions"),
])
def test_a_bad_gather_index_is_named(call, message):
    off, rows = _tables()
    with pytest.raises(RuntimeError, match=message):
        call(off, rows)
