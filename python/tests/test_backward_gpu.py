"""The backward's ops and the staged backward on a Hopper GPU: each op against
its fp32 torch reference (mok.testing) on fresh random data, with NaN in the
rows outside every group (never read) and an accumulation target that starts
from random values; bitwise repeats; mok.fused_forward's and mok.grouped_mm's
backward against torch autograd of fp32 computations, bitwise the same on
virtual worlds of 1, 2 and 4 ranks; and mok.nn's MoE trained a few steps.
The CPU twin (reference ops): test_backward.py."""

import pytest
import torch

from conftest import skip_without_hopper

skip_without_hopper()

import mok  # noqa: E402
from mok.staged_backward import has_kernel_ops  # noqa: E402
from mok.testing import (random_global_layer, reference_grouped_mm_kn, reference_layer_grads,  # noqa: E402
                         reference_swiglu_backward_mm, reference_weight_grad_mm, split_world)
from test_backward import NAMES, TOLERANCE, train_moe_a_few_steps  # noqa: E402

if not has_kernel_ops():
    pytest.skip("libmok_torch.so predates the backward ops", allow_module_level=True)

COUNTS, PAD = [130, 0, 1, 128, 257], [3, 0, 17, 0, 5]


def _layout(counts=COUNTS, pad=PAD):
    offsets = [0]
    for c, p in zip(counts, pad):
        offsets.append(offsets[-1] + c + p)
    inside = torch.zeros(offsets[-1], dtype=torch.bool)
    for o, c in zip(offsets, counts):
        inside[o:o + c] = True
    return (torch.tensor(offsets, dtype=torch.int32, device="cuda"),
            torch.tensor(counts, dtype=torch.int32, device="cuda"), inside.cuda())


def _rand(*shape, seed, scale=1.0, inside=None):
    """Uniform in [-scale, scale) as bf16 on the GPU; rows outside `inside` NaN."""
    g = torch.Generator().manual_seed(seed)
    t = ((torch.rand(*shape, generator=g) * 2 - 1) * scale).bfloat16().cuda()
    if inside is not None:
        t[~inside] = float("nan")
    return t


def _same_bits(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _close_on(rows, got, want, tol):
    torch.testing.assert_close(got[rows].float(), want[rows].float(), rtol=tol, atol=tol)


def test_grouped_mm_kn_matches_its_reference():
    off, rows, inside = _layout()
    K, N = 192, 320
    a = _rand(inside.numel(), K, seed=1, inside=inside)
    b = _rand(len(COUNTS), K, N, seed=2, scale=2 / K ** 0.5)
    out = mok.grouped_mm_kn(a, b, off, rows)
    assert out.shape == (inside.numel(), N) and out.dtype == torch.bfloat16
    _close_on(inside, out, reference_grouped_mm_kn(a, b, off, rows), 2e-2)
    assert not out[~inside].any()  # zeros, not NaN: the padding rows were never read
    assert all(_same_bits(out, mok.grouped_mm_kn(a, b, off, rows)) for _ in range(3))


@pytest.mark.parametrize("scaled", [True, False])
def test_swiglu_backward_matches_its_reference(scaled):
    off, rows, inside = _layout()
    M, H, I = inside.numel(), 320, 192  # I: not a multiple of 128 (a partial n-tile of parts)
    dout = _rand(M, H, seed=3, inside=inside)
    w2 = _rand(len(COUNTS), H, I, seed=4, scale=2 / H ** 0.5)
    preact = _rand(M, 2 * I, seed=5, scale=3.0, inside=inside)
    scale = torch.rand(M, device="cuda") if scaled else None
    if scaled:
        scale[~inside] = float("nan")
    got = mok.swiglu_backward_mm(dout, w2, preact, scale, off, rows)
    want = reference_swiglu_backward_mm(dout, w2, preact, scale, off, rows)  # reads group rows only
    for name, g, w, tol in zip(("d13", "scaled_act", "row_scale_grad"), got, want, (2e-2, 2e-2, 1e-3)):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        _close_on(inside, g, w, tol)
        assert not g[~inside].any(), name
    again = mok.swiglu_backward_mm(dout, w2, preact, scale, off, rows)
    assert all(_same_bits(a, b) for a, b in zip(got, again))


def test_row_combine_equals_its_reference_bit_for_bit():
    g = torch.Generator(device="cuda").manual_seed(21)
    T, k, width, N = 300, 5, 1024, 1700
    rows = torch.randn(N, width, device="cuda", generator=g).bfloat16()
    base = torch.randn(T, width, device="cuda", generator=g).bfloat16()
    index = torch.randint(-1, N, (T, k), device="cuda", generator=g, dtype=torch.int32)  # some -1
    for b in (base, None):
        out = mok.row_combine(rows, index, b)
        assert _same_bits(out, mok.testing.reference_row_combine(rows, index, b))
    with pytest.raises(RuntimeError, match="row_index"):
        mok.row_combine(rows, index.long(), base)


def test_scatter_rows_equals_its_reference_bit_for_bit():
    # The saved schedule's shape of indices: a padded row space, padding rows
    # holding the dummy entry T k, and an entry kept out (pointing at row 0).
    g = torch.Generator(device="cuda").manual_seed(23)
    T, k, width, pad = 257, 8, 7168 // 2, 131
    M = T * k + pad
    row_of_entry = torch.randperm(M, device="cuda", generator=g)[:T * k]
    entry_of_row = torch.full((M,), T * k, dtype=torch.long, device="cuda")
    entry_of_row[row_of_entry] = torch.arange(T * k, device="cuda")
    row_of_entry[5] = 0
    row_of_entry = row_of_entry.view(T, k)
    x = torch.randn(T, width, device="cuda", generator=g).bfloat16()
    dout = torch.randn(T, width, device="cuda", generator=g).bfloat16()
    got = mok.scatter_rows([dout, x], row_of_entry, entry_of_row)
    want = mok.testing.reference_scatter_rows([dout, x], row_of_entry, entry_of_row)
    assert all(_same_bits(a, b) for a, b in zip(got, want))
    again = mok.scatter_rows([dout, x], row_of_entry, entry_of_row)
    assert all(_same_bits(a, b) for a, b in zip(got, again))
    # Where a row gather by token would agree: every claimed row.
    token_of_row = torch.div(entry_of_row.clamp_max(T * k - 1), k, rounding_mode="floor")
    claimed = got[1].ne(0).any(1)
    assert claimed.sum() >= T * k - 1
    assert _same_bits(got[1][claimed], x.index_select(0, token_of_row)[claimed])
    with pytest.raises(RuntimeError, match="row_of_entry must be Long"):
        mok.scatter_rows([x], row_of_entry.int(), entry_of_row)


def test_weight_grad_bf16_output_is_the_fp32_sum_rounded_once():
    off, rows, inside = _layout()
    M, m, n = inside.numel(), 192, 128
    a = _rand(M, m, seed=16, inside=inside)
    b = _rand(M, n, seed=17, inside=inside)
    fp32 = mok.weight_grad_mm(a, b, off, rows, len(COUNTS))
    bf16 = mok.weight_grad_mm(a, b, off, rows, len(COUNTS), out_dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and bf16.shape == fp32.shape
    assert _same_bits(bf16, fp32.to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="out_dtype"):
        mok.weight_grad_mm(a, b, off, rows, len(COUNTS), out_dtype=torch.float16)


def test_weight_grad_matches_its_reference_and_accumulates():
    off, rows, inside = _layout()
    M, m, n = inside.numel(), 192, 128
    a = _rand(M, m, seed=6, inside=inside)
    b = _rand(M, n, seed=7, inside=inside)
    out = mok.weight_grad_mm(a, b, off, rows, len(COUNTS))
    want = reference_weight_grad_mm(a, b, off, rows, len(COUNTS))
    assert out.shape == (len(COUNTS), m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-3)
    assert not out[1].any()  # a group without rows: zeros
    assert all(_same_bits(out, mok.weight_grad_mm(a, b, off, rows, len(COUNTS))) for _ in range(3))
    start = torch.randn(len(COUNTS), m, n, device="cuda")
    acc = start.clone()
    assert mok.weight_grad_mm_acc_(acc, a, b, off, rows) is acc
    torch.testing.assert_close(acc, start + want, rtol=1e-3, atol=1e-3)
    assert _same_bits(acc[1], start[1])  # nothing added to a group without rows
    assert _same_bits(acc, start + out)  # one addition to the old value, after the sum


def test_weight_grad_bits_do_not_depend_on_where_the_group_sits():
    a = _rand(512, 128, seed=8)
    b = _rand(512, 64, seed=9)
    alone = mok.weight_grad_mm(a[:257].contiguous(), b[:257].contiguous(), *_layout([257], [0])[:2], 1)
    # The same 257 rows as the third group, after 255 other rows.
    moved_a = torch.cat([a[257:], a[:257]])
    moved_b = torch.cat([b[257:], b[:257]])
    off, rows, _ = _layout([100, 155, 257], [0, 0, 0])
    moved = mok.weight_grad_mm(moved_a, moved_b, off, rows, 3)
    assert _same_bits(moved[2], alone[0])


def _fused_grads(layer, world, dout, save=False):
    xs, ids, ws, w13s, w2s, sw13, sw2 = split_world(layer, world)
    for t in xs + ws + w13s + w2s:
        t.requires_grad_()
    shared = [t.clone().requires_grad_() for t in (sw13, sw2)] if sw13 is not None else [None, None]
    outs = mok.fused_forward(xs, ids, ws, w13s, w2s, *shared, num_experts=w13s[0].shape[0] * world,
                             check_errors=True, save_activations=save)
    torch.cat(outs).backward(dout)
    return tuple(torch.cat([t.grad for t in group]) for group in (xs, ws, w13s, w2s)) + tuple(
        None if t is None else t.grad for t in shared)


def _poisoned_block(shape, dtype):
    """A freed block of the caching allocator holding 0xFF bytes (NaN in bf16
    and fp32), and its address: the next allocation of the same size on this
    stream gets it back, so an op's output that comes back with 0xFF where it
    was allocated uninitialised shows the op never wrote there."""
    t = torch.empty(shape, dtype=dtype, device="cuda")
    t.view(torch.uint8).fill_(0xFF)
    address = t.data_ptr()
    del t
    return address


def _untouched(t, rows):
    return bool((t[rows].contiguous().view(torch.uint8) == 0xFF).all())


def test_zero_padding_false_writes_the_same_real_rows_and_leaves_the_padding():
    off, rows, inside = _layout()
    M, K, N, H, I = inside.numel(), 192, 320, 320, 192
    a = _rand(M, K, seed=31, inside=inside)
    b = _rand(len(COUNTS), K, N, seed=32, scale=2 / K ** 0.5)
    zeroed = mok.grouped_mm_kn(a, b, off, rows)
    address = _poisoned_block((M, N), torch.bfloat16)
    left = mok.grouped_mm_kn(a, b, off, rows, zero_padding=False)
    assert left.data_ptr() == address  # the allocator gave the poisoned block back
    assert _same_bits(left[inside], zeroed[inside]) and not zeroed[~inside].any()
    assert _untouched(left, ~inside)

    dout = _rand(M, H, seed=33, inside=inside)
    w2 = _rand(len(COUNTS), H, I, seed=34, scale=2 / H ** 0.5)
    preact = _rand(M, 2 * I, seed=35, scale=3.0, inside=inside)
    scale = torch.rand(M, device="cuda")
    zeroed = mok.swiglu_backward_mm(dout, w2, preact, scale, off, rows)
    address = _poisoned_block((M, 2 * I), torch.bfloat16)
    left = mok.swiglu_backward_mm(dout, w2, preact, scale, off, rows, zero_padding=False)
    assert left[0].data_ptr() == address
    for name, z, l in zip(("d13", "scaled_act", "row_scale_grad"), zeroed, left):
        assert _same_bits(l[inside], z[inside]) and not z[~inside].any(), name
    assert _untouched(left[0], ~inside)
    assert not left[2][~inside].any()  # the routing weights' gradient: zeros on padding either way

    g = torch.Generator(device="cuda").manual_seed(36)
    T, k, width, pad = 100, 4, 512, 77
    row_of_entry = torch.randperm(T * k + pad, device="cuda", generator=g)[:T * k]
    entry_of_row = torch.full((T * k + pad,), T * k, dtype=torch.long, device="cuda")
    entry_of_row[row_of_entry] = torch.arange(T * k, device="cuda")
    claimed = entry_of_row < T * k
    x = torch.randn(T, width, device="cuda", generator=g).bfloat16()
    (zeroed,) = mok.scatter_rows([x], row_of_entry.view(T, k), entry_of_row)
    address = _poisoned_block((T * k + pad, width), torch.bfloat16)
    (left,) = mok.scatter_rows([x], row_of_entry.view(T, k), entry_of_row, zero_padding=False)
    assert left.data_ptr() == address
    assert _same_bits(left[claimed], zeroed[claimed]) and not zeroed[~claimed].any()
    assert _untouched(left, ~claimed)


def _poison_free_memory():
    """Fills the caching allocator's free memory with NaN: 32 segments of the
    small pool (where tensors up to 1 MB go) and one large block, allocated as
    0xFF bytes and freed, so that the tensors an op then allocates
    uninitialised mostly start as NaN (not all: an allocation may also land
    in free space of a segment that was in use)."""
    held = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda").fill_(0xFF) for _ in range(64)]
    held += [torch.empty(256 << 20, dtype=torch.uint8, device="cuda").fill_(0xFF)]
    torch.cuda.synchronize()
    del held


@pytest.mark.parametrize("save", [True, False])
def test_the_staged_backward_reads_no_padding_row(save):
    # Its ops leave every padding row uninitialised (zero_padding=False); with
    # the free memory full of NaN, a read of one would reach a gradient.
    T, H, I, E, K = 256, 256, 128, 8, 2  # ~64 rows an expert: every group padded
    layer = random_global_layer(T, H, I, E, K, 128, seed=37, device="cuda")
    dout = _rand(T, H, seed=38)
    clean = _fused_grads(layer, 1, dout, save=save)
    _poison_free_memory()
    poisoned = _fused_grads(layer, 1, dout, save=save)
    for name, a, b in zip(NAMES, clean, poisoned):
        assert torch.isfinite(b).all(), name
        assert _same_bits(a, b), name


@pytest.mark.parametrize("shared", [True, False])
def test_fused_forward_backward_matches_fp32_autograd_and_every_world(shared):
    T, H, I, E, K = 256, 256, 128, 8, 2
    layer = random_global_layer(T, H, I, E, K, 128 if shared else 0, seed=10, device="cuda")
    dout = _rand(T, H, seed=11)
    want = reference_layer_grads(*layer, dout)
    torch.use_deterministic_algorithms(True)  # raises on a torch op that has no deterministic CUDA kernel
    try:
        grads = {world: _fused_grads(layer, world, dout) for world in (1, 2, 4)}
        again = _fused_grads(layer, 1, dout)
    finally:
        torch.use_deterministic_algorithms(False)
    for name, got, ref in zip(NAMES, grads[1], want):
        if ref is not None:
            assert torch.isfinite(got).all(), name
            assert float((got.float() - ref).norm() / ref.norm()) < TOLERANCE, name
    for other in (grads[2], grads[4], again):
        for name, a, b in zip(NAMES, grads[1], other):
            assert (a is None and b is None) or _same_bits(a, b), name


@pytest.mark.parametrize("shared", [True, False])
def test_the_fused_backward_kernel_matches_fp32_autograd_and_keeps_its_routed_bits_at_every_world(
        shared, monkeypatch):
    # MOK_BACKWARD=fused: save mode's backward is the fused kernel. Every
    # gradient against torch autograd of the fp32 layer; the routed ones (and
    # dx, the router weights') the same bits at every world size (the shared
    # expert's weight gradients are per-rank shares added in rank order at
    # R > 1: fp32 rounding apart, checked by the tolerance).
    monkeypatch.setenv("MOK_BACKWARD", "fused")
    T, H, I, E, K = 256, 256, 128, 8, 2
    layer = random_global_layer(T, H, I, E, K, 128 if shared else 0, seed=20, device="cuda")
    dout = _rand(T, H, seed=21)
    want = reference_layer_grads(*layer, dout)
    grads = {world: _fused_grads(layer, world, dout, save=True) for world in (1, 2, 4)}
    for world, got_all in grads.items():
        for name, got, ref in zip(NAMES, got_all, want):
            if ref is not None:
                assert torch.isfinite(got).all(), (world, name)
                assert float((got.float() - ref).norm() / ref.norm()) < TOLERANCE, (world, name)
    for other in (grads[2], grads[4]):
        for name, a, b in zip(NAMES[:4], grads[1][:4], other[:4]):
            assert _same_bits(a, b), name


@pytest.mark.parametrize("world", [1, 2])
def test_save_mode_gives_recompute_modes_bits(world, monkeypatch):
    # The training kernel keeps the gate/up accumulators h comes from, which
    # are the bits the grouped GEMM recomputes: every gradient must match.
    # The staged backward in both modes (save mode's fused backward sums the
    # shared expert's weight gradients per rank at R > 1: test_fused_backward.py).
    monkeypatch.setenv("MOK_BACKWARD", "staged")
    T, H, I, E, K = 256, 256, 128, 8, 2
    layer = random_global_layer(T, H, I, E, K, 128, seed=17, device="cuda")
    dout = _rand(T, H, seed=18)
    recompute = _fused_grads(layer, world, dout)
    save = _fused_grads(layer, world, dout, save=True)
    for name, a, b in zip(NAMES, recompute, save):
        assert _same_bits(a, b), name


def test_fused_forward_backward_with_empty_experts_and_top1():
    T, H, I, E = 200, 128, 64, 8
    x, ids, w, w13, w2, sw13, sw2 = random_global_layer(T, H, I, E, 1, 64, seed=12, device="cuda")
    ids = torch.where(ids % 2 == 1, ids - 1, ids)  # odd experts get no rows
    layer = (x, ids, w, w13, w2, sw13, sw2)
    dout = _rand(T, H, seed=13)
    got = _fused_grads(layer, 2, dout)
    for name, g, ref in zip(NAMES, got, reference_layer_grads(*layer, dout)):
        assert float((g.float() - ref).norm() / ref.norm()) < TOLERANCE, name
    assert not got[2][1::2].any() and not got[3][1::2].any()  # dW13, dW2 of the empty experts


def test_grouped_mm_backward_matches_fp32_autograd():
    off, rows, inside = _layout()
    K, N = 192, 256
    a = _rand(inside.numel(), K, seed=14).requires_grad_()
    b = _rand(len(COUNTS), N, K, seed=15, scale=2 / K ** 0.5).requires_grad_()
    dout = _rand(inside.numel(), N, seed=16)
    out = mok.grouped_mm(a, b, off, rows)
    (out.float() * dout.float())[inside].sum().backward()  # padding rows of out are not part of the loss
    af, bf = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    group = torch.repeat_interleave(torch.arange(len(COUNTS), device="cuda"),
                                    torch.diff(off.long()))
    ref = torch.einsum("mk,mnk->mn", af, bf[group])
    (ref * dout.float())[inside].sum().backward()
    assert float((a.grad.float() - af.grad).norm() / af.grad.norm()) < TOLERANCE
    assert float((b.grad.float() - bf.grad).norm() / bf.grad.norm()) < TOLERANCE
    assert not a.grad[~inside].any()


def test_moe_trains():
    losses = train_moe_a_few_steps("cuda")
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0], losses
