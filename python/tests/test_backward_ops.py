"""The backward's ops (grouped_mm_kn, swiglu_backward_mm, weight_grad_mm,
weight_grad_mm_acc_, scatter_rows, staged_schedule) without a GPU: output shapes on meta tensors, each bad
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
    outs = mok.scatter_rows([_t(12, H), _t(12, 2 * I)], _t(12, 8, dtype=torch.long), _t(M, dtype=torch.long))
    assert [o.shape for o in outs] == [(M, H), (M, 2 * I)] and outs[0].dtype == torch.bfloat16


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(sources=[]), r"sources must hold 1 to 4 tensors \(got 0\)"),
    (lambda a: a.update(sources=[_t(12, H)] * 5), r"sources must hold 1 to 4 tensors \(got 5\)"),
    (lambda a: a.update(sources=[_t(12, H), _t(11, H)]), r"sources\[1\] must be .* = \[12, 128\] \(got \[11, 128\]\)"),
    (lambda a: a.update(sources=[_t(12, H, dtype=torch.float32)]), r"sources\[0\] must be BFloat16"),
    (lambda a: a.update(sources=[_t(12, 12)]), "multiple of 8 columns"),
    (lambda a: a.update(row_of_entry=_t(11, 8, dtype=torch.long)), r"row_of_entry must be \[tokens, k\]"),
    (lambda a: a.update(row_of_entry=_t(12, 8, dtype=torch.int32)), "row_of_entry must be Long"),
    (lambda a: a.update(entry_of_row=_t(M, 1, dtype=torch.long)), "entry_of_row must have 1 dimensions"),
    (lambda a: a.update(row_of_entry=_t(12, 65, dtype=torch.long)), r"k = 65 must be in \[1, 64\]"),
])
def test_scatter_rows_names_a_bad_argument(change, message):
    args = dict(sources=[_t(12, H)], row_of_entry=_t(12, 8, dtype=torch.long), entry_of_row=_t(M, dtype=torch.long))
    change(args)
    with pytest.raises(RuntimeError, match=message):
        mok.scatter_rows(**args)


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
    ("weight_grad_mm_acc_", 0, lambda t: t.half(), r"out must be float32 \(a main_grad\) or bfloat16 .* \(got Half\)"),
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


@pytest.mark.skipif(not hasattr(torch.ops.mok, "staged_schedule"), reason="libmok_torch.so predates the op")
def test_staged_schedule_shapes_and_bad_arguments():
    # Two ranks of 100 saved rows, 30 + 20 tokens, k = 3: a table per saved
    # row (all ranks) and one per entry of the world's tokens.
    rows = [_t(100, 3, dtype=torch.int32)] * 2
    offsets = [_t(5, dtype=torch.int32)] * 2
    entry_of_row, row_of_entry, token_of_row = torch.ops.mok.staged_schedule(rows, offsets, [30, 20], 3)
    assert entry_of_row.shape == token_of_row.shape == (200,) and row_of_entry.shape == (150,)
    assert entry_of_row.dtype == row_of_entry.dtype == token_of_row.dtype == torch.long
    with pytest.raises(RuntimeError, match="one entry a rank"):
        torch.ops.mok.staged_schedule(rows, offsets[:1], [30, 20], 3)
    with pytest.raises(RuntimeError, match=r"schedule_rows\[1\] must be \[rows of rank 0, 3\]"):
        torch.ops.mok.staged_schedule([rows[0], _t(90, 3, dtype=torch.int32)], offsets, [30, 20], 3)
    with pytest.raises(RuntimeError, match=r"schedule_rows\[0\] must be Int \(got Long\)"):
        torch.ops.mok.staged_schedule([_t(100, 3, dtype=torch.long)], offsets[:1], [30], 3)
    with pytest.raises(RuntimeError, match="top_k = 0 must be >= 1"):
        torch.ops.mok.staged_schedule(rows, offsets, [30, 20], 0)
    with pytest.raises(RuntimeError, match="runs on CUDA tensors"):
        torch.ops.mok.staged_schedule([torch.zeros(10, 3, dtype=torch.int32)], [torch.zeros(3, dtype=torch.int32)],
                                      [5], 2)


@pytest.mark.skipif(not hasattr(torch.ops.mok, "staged_backward"), reason="libmok_torch.so predates the op")
def test_staged_backward_refuses_cpu_tensors_and_a_partial_schedule():
    T, H, I, E, k = 8, 64, 64, 2, 1
    args = (torch.zeros(T, H, dtype=torch.bfloat16), torch.zeros(T, H, dtype=torch.bfloat16),
            torch.zeros(T, k, dtype=torch.int32), torch.ones(T, k), torch.zeros(E, 2 * I, H, dtype=torch.bfloat16),
            torch.zeros(E, H, I, dtype=torch.bfloat16), None, None, None, None)
    with pytest.raises(RuntimeError, match="x is on cpu; mok runs on CUDA tensors"):
        torch.ops.mok.staged_backward(*args, None, None, None, None, [1] * 6, None, None, None, None, None)
    with pytest.raises(RuntimeError, match="all four schedule tensors"):
        torch.ops.mok.staged_backward(*args, torch.zeros(T, dtype=torch.long), None, None, None, [1] * 6, None,
                                      None, None, None, None)
    with pytest.raises(RuntimeError, match="needs must have 6 entries"):
        torch.ops.mok.staged_backward(*args, None, None, None, None, [1] * 5, None, None, None, None, None)
