"""Operands gathered on load (swiglu_backward_mm's dout_index, weight_grad_mm's
and weight_grad_mm_acc_'s a_index / b_index): the kernels read source rows
through an index with the bits of a gathered copy, never read a row no group
needs, and a bad index fails the launch instead of reading other memory. The
staged backward, which now gathers nothing but the recompute's x rows, keeps
its bits. Needs a Hopper GPU."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import skip_without_hopper

skip_without_hopper()

import mok  # noqa: E402
from mok import staged_backward  # noqa: E402
from mok.staged_backward import BackwardOps, has_kernel_ops, kernel_ops  # noqa: E402

if not has_kernel_ops():
    pytest.skip("libmok_torch.so predates the backward ops", allow_module_level=True)

# Groups of 130 (a partial 64-row block), none, 1, 128 and 257 rows, with
# padding rows between some; SOURCE rows in all, of which the NaN ones are
# never indexed by a group row (reading one would poison a sum).
COUNTS, PAD = [130, 0, 1, 128, 257], [3, 0, 17, 0, 5]
SOURCE = 700


def _layout(seed=0):
    offsets = [0]
    for c, p in zip(COUNTS, PAD):
        offsets.append(offsets[-1] + c + p)
    M = offsets[-1]
    inside = torch.zeros(M, dtype=torch.bool)
    for o, c in zip(offsets, COUNTS):
        inside[o:o + c] = True
    g = torch.Generator().manual_seed(seed)
    nan_rows = torch.randperm(SOURCE, generator=g)[:50]
    usable = torch.ones(SOURCE, dtype=torch.bool)
    usable[nan_rows] = False
    good = usable.nonzero().squeeze(1)
    index = good[torch.randint(0, good.numel(), (M,), generator=g)]
    index[~inside] = nan_rows[0]  # padding rows point at a NaN row: never read
    return (torch.tensor(offsets, dtype=torch.int32, device="cuda"),
            torch.tensor(COUNTS, dtype=torch.int32, device="cuda"),
            index.to(torch.int32).cuda(), nan_rows.cuda())


def _source(width, seed, nan_rows, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    t = ((torch.rand(SOURCE, width, generator=g) * 2 - 1) * scale).bfloat16().cuda()
    t[nan_rows] = float("nan")
    return t


def _same_bits(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("gather", ["a", "b", "ab"])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_weight_grad_with_gathered_operands_has_the_gathered_copys_bits(gather, out_dtype):
    off, rows, index, nan_rows = _layout()
    m, n = 192, 320
    a_src, b_src = _source(m, 1, nan_rows), _source(n, 2, nan_rows)
    a_copy, b_copy = a_src[index.long()], b_src[index.long()]
    want = mok.weight_grad_mm(a_copy, b_copy, off, rows, len(COUNTS), out_dtype)
    a, a_index = (a_src, index) if "a" in gather else (a_copy, None)
    b, b_index = (b_src, index) if "b" in gather else (b_copy, None)
    for _ in range(3):
        got = mok.weight_grad_mm(a, b, off, rows, len(COUNTS), out_dtype, a_index, b_index)
        assert not torch.isnan(got).any()
        assert _same_bits(got, want)
    if out_dtype is None:  # accumulating into old values, poisoned where nothing is added
        start = torch.randn(len(COUNTS), m, n, device="cuda")
        acc_want, acc_got = start.clone(), start.clone()
        mok.weight_grad_mm_acc_(acc_want, a_copy, b_copy, off, rows)
        mok.weight_grad_mm_acc_(acc_got, a, b, off, rows, a_index, b_index)
        assert _same_bits(acc_got, acc_want) and _same_bits(acc_got[1], start[1])


@pytest.mark.parametrize("scaled", [True, False])
def test_swiglu_backward_with_gathered_dout_has_the_gathered_copys_bits(scaled):
    off, rows, index, nan_rows = _layout(seed=1)
    M, H, I = index.numel(), 320, 192
    dout = _source(H, 3, nan_rows)
    g = torch.Generator().manual_seed(4)
    w2 = ((torch.rand(len(COUNTS), H, I, generator=g) * 2 - 1) * 2 / H ** 0.5).bfloat16().cuda()
    preact = (torch.randn(M, 2 * I, generator=g) * 3).bfloat16().cuda()
    scale = torch.rand(M, device="cuda") if scaled else None
    want = mok.swiglu_backward_mm(dout[index.long()], w2, preact, scale, off, rows)
    for _ in range(3):
        got = mok.swiglu_backward_mm(dout, w2, preact, scale, off, rows, index)
        for name, x, y in zip(("d13", "scaled_act", "row_scale_grad"), got, want):
            assert not torch.isnan(x).any(), name
            assert _same_bits(x, y), name


def _copying_ops():
    """The kernels, but every gather index served by a gathered copy (what the
    staged backward did before it read rows through the index)."""
    k = kernel_ops()

    def rows(t, index):
        return t if index is None else t.index_select(0, index.long())

    def swiglu(dout, w2, preact, scale, off, cnt, dout_index=None):
        return k.swiglu_backward_mm(rows(dout, dout_index), w2, preact, scale, off, cnt)

    def wgrad(a, b, off, cnt, groups, dtype=None, a_index=None, b_index=None):
        return k.weight_grad_mm(rows(a, a_index), rows(b, b_index), off, cnt, groups, dtype)

    def wgrad_acc(out, a, b, off, cnt, a_index=None, b_index=None):
        return k.weight_grad_mm_acc_(out, rows(a, a_index), rows(b, b_index), off, cnt)

    return BackwardOps(k.grouped_mm, k.grouped_mm_kn, swiglu, wgrad, k.row_combine, wgrad_acc)


@pytest.mark.parametrize("save", [True, False])
def test_the_staged_backward_keeps_its_bits(save, monkeypatch):
    monkeypatch.setenv("MOK_GATHER_ON_LOAD", "1")  # the kernels read rows through the index
    assert staged_backward.gather_on_load()
    from mok.testing import random_global_layer
    layer = random_global_layer(333, 256, 192, 6, 3, 128, seed=5, device="cuda")
    x, ids, w, w13, w2, sw13, sw2 = layer
    dout = torch.randn(x.shape[0], x.shape[1], device="cuda").bfloat16()
    saved = None
    if save:
        out = torch.ops.mok.fused_forward_train([x], [ids], [w], [w13], [w2], sw13, sw2, w13.shape[0], [0] * 5, False)
        saved = staged_backward.SavedForward(*(list(g) for g in out[1:]))
    grads = [staged_backward.layer_backward(dout, x, ids, w, w13, w2, sw13, sw2, ops=ops, saved=saved,
                                            tokens_per_rank=[x.shape[0]], grad_dtype=torch.bfloat16)
             for ops in (kernel_ops(), _copying_ops())]
    for name, got, want in zip(staged_backward.LayerGrads._fields, *grads):
        assert (got is None) == (want is None), name
        if got is not None:
            assert _same_bits(got, want), name


def test_an_index_outside_the_source_fails_the_launch():
    """A trap ends the CUDA context, so this runs in a process of its own."""
    code = """
import torch, mok
off = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
cnt = torch.tensor([64], dtype=torch.int32, device="cuda")
a = torch.randn(64, 64, device="cuda").bfloat16()
b = torch.randn(10, 64, device="cuda").bfloat16()
index = torch.zeros(64, dtype=torch.int32, device="cuda")
index[5] = 10  # b has 10 rows
mok.weight_grad_mm(a, b, off, cnt, 1, None, None, index)
torch.cuda.synchronize()
print("NO ERROR")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert "NO ERROR" not in done.stdout
    assert done.returncode != 0
    assert "CUDA error" in done.stderr or "launch failure" in done.stderr.lower(), done.stderr[-2000:]
