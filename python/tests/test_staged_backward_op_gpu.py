"""The staged backward's C++ paths against their Python references, on a
Hopper GPU with fresh random data:
- torch.ops.mok.staged_backward (the chain enqueued from C++) against the
  same chain enqueued from Python (mok/staged_backward.py's layer_backward
  with the kernels given): the same bits for every gradient, in save and
  recompute mode, with and without a shared expert, on virtual worlds of 1
  and 2 ranks, for every subset of needed gradients, and into main_grad
  buffers;
- torch.ops.mok.staged_schedule (the saved schedule's row tables from one
  kernel) against saved_schedule's torch ops: the same tables on worlds of
  1, 2 and 4 ranks, with padding rows, empty experts and unused capacity."""

import pytest
import torch

from conftest import skip_without_hopper

skip_without_hopper()

from mok import staged_backward  # noqa: E402
from mok.staged_backward import MainGrads, Needs, kernel_ops, layer_backward  # noqa: E402
from mok.options import tuning_list  # noqa: E402
from mok.testing import random_global_layer  # noqa: E402
from test_backward_gpu import _fused_grads, _rand, _same_bits  # noqa: E402

if not hasattr(torch.ops.mok, "staged_backward"):
    pytest.skip("libmok_torch.so predates mok::staged_backward", allow_module_level=True)


def _equal(a, b):
    return (a is None and b is None) or (a is not None and b is not None and _same_bits(a, b))


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("save", [True, False])
def test_the_autograds_backward_gives_the_python_chains_bits(save, shared, world, monkeypatch):
    monkeypatch.setenv("MOK_BACKWARD", "staged")
    T, H, I, E, K = 384, 256, 192, 8, 3
    layer = random_global_layer(T, H, I, E, K, 128 if shared else 0, seed=50 + world, device="cuda")
    dout = _rand(T, H, seed=51)
    from_cpp = _fused_grads(layer, world, dout, save=save)
    monkeypatch.setattr(staged_backward, "_enqueues_from_cpp", lambda x: False)
    monkeypatch.setenv("MOK_CPP_AUTOGRAD", "0")  # save mode's C++ node calls the op itself
    from_python = _fused_grads(layer, world, dout, save=save)
    for i, (a, b) in enumerate(zip(from_cpp, from_python)):
        assert a is None or torch.isfinite(a).all(), i
        assert _equal(a, b), i


NEEDS = [Needs(), Needs(weights=False, w13=False, w2=False, shared_w13=False, shared_w2=False),
         Needs(x=False, weights=False), Needs(x=False, w13=False, w2=False, weights=False),
         Needs(x=False, shared_w13=False, shared_w2=False)]


@pytest.mark.parametrize("grad_dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("needs", NEEDS, ids=["all", "dx", "weights", "shared", "routed"])
def test_every_subset_of_gradients_and_main_grads(needs, grad_dtype):
    T, H, I, E, K, S = 300, 256, 128, 6, 2, 192
    x, ids, w, w13, w2, sw13, sw2 = random_global_layer(T, H, I, E, K, S, seed=60, device="cuda")
    dout = _rand(T, H, seed=61)
    args = (dout, x, ids, w, w13, w2, sw13, sw2)
    got = layer_backward(*args, needs=needs, grad_dtype=grad_dtype)
    want = layer_backward(*args, needs=needs, grad_dtype=grad_dtype, ops=kernel_ops())
    for name, a, b in zip(got._fields, got, want):
        assert _equal(a, b), name
    assert (got.dx is not None) == needs.x and (got.dw13 is not None) == needs.w13

    # main_grad buffers, from the same random start: each sum added once.
    g = torch.Generator(device="cuda").manual_seed(62)
    starts = [torch.randn(t.shape, device="cuda", generator=g) for t in (w13, w2, sw13, sw2)]
    mains_cpp = MainGrads(*(s.clone() for s in starts))
    mains_py = MainGrads(*(s.clone() for s in starts))
    got = layer_backward(*args, needs=needs, grad_dtype=grad_dtype, main_grads=mains_cpp)
    want = layer_backward(*args, needs=needs, grad_dtype=grad_dtype, main_grads=mains_py, ops=kernel_ops())
    assert got.dw13 is None and got.dw2 is None and got.dshared_w13 is None and got.dshared_w2 is None
    for name, a, b in zip(got._fields, got, want):
        assert _equal(a, b), name
    for name, a, b, start, needed in zip(MainGrads._fields, mains_cpp, mains_py, starts,
                                         (needs.w13, needs.w2, needs.shared_w13, needs.shared_w2)):
        assert _same_bits(a, b), name
        assert _same_bits(a, start) != needed, name  # added to exactly when needed


def test_save_mode_schedule_and_repeats():
    # Save mode through layer_backward directly (the training op's kept
    # tensors and the saved schedule), three times: the same bits each time.
    T, H, I, E, K, S = 256, 256, 128, 8, 2, 128
    x, ids, w, w13, w2, sw13, sw2 = random_global_layer(T, H, I, E, K, S, seed=70, device="cuda")
    dout = _rand(T, H, seed=71)
    outs = torch.ops.mok.fused_forward_train([x], [ids], [w], [w13], [w2], sw13, sw2, E, tuning_list({}), True)
    saved = staged_backward.SavedForward(*(list(group) for group in outs[1:]))
    schedule = staged_backward.saved_schedule(saved, [T], K)
    args = (dout, x, ids, w, w13, w2, sw13, sw2)
    runs = [layer_backward(*args, saved=saved, schedule=schedule) for _ in range(3)]
    want = layer_backward(*args, saved=saved, schedule=schedule, ops=kernel_ops())
    for got in runs:
        for name, a, b in zip(got._fields, got, want):
            assert a is not None and torch.isfinite(a).all(), name
            assert _equal(a, b), name


def _python_tables(saved, tokens, k, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(staged_backward, "_eager_cuda", lambda t, op: False)
        return staged_backward.saved_schedule(saved, tokens, k)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_schedule_tables_from_one_kernel_are_the_python_ones(world, monkeypatch):
    # A real training forward's saved schedule (uneven ranks: the last gets
    # fewer tokens; odd experts get no rows; capacity left unused), then the
    # same with garbage in the rows past each rank's schedule end (never read).
    T, H, I, E, K = 300, 128, 64, 8, 3
    x, _, w, w13, w2, _, _ = random_global_layer(T, H, I, E, K, 0, seed=80 + world, device="cuda")
    base = torch.randint(0, E // 2, (T, 1), device="cuda", generator=torch.Generator(device="cuda").manual_seed(82))
    ids = (2 * ((base + torch.arange(K, device="cuda")) % (E // 2))).int()  # distinct, even experts only
    tokens = [T // world] * (world - 1) + [T - (T // world) * (world - 1) - 7]
    x, ids, w = x[:sum(tokens)], ids[:sum(tokens)], w[:sum(tokens)]
    bounds = [0]
    for t in tokens:
        bounds.append(bounds[-1] + t)
    E_r = E // world
    outs = torch.ops.mok.fused_forward_train(
        [x[a:b] for a, b in zip(bounds, bounds[1:])], [ids[a:b] for a, b in zip(bounds, bounds[1:])],
        [w[a:b] for a, b in zip(bounds, bounds[1:])], list(w13.split(E_r)), list(w2.split(E_r)), None, None, E,
        tuning_list({}), True)
    saved = staged_backward.SavedForward(*(list(group) for group in outs[1:]))
    for garbage in (False, True):
        if garbage:
            g = torch.Generator(device="cuda").manual_seed(81)
            for rows, offsets in zip(saved.schedule_rows, saved.expert_offset):
                end = int(offsets[-1])
                rows[end:] = torch.randint(-5, 1000, rows[end:].shape, device="cuda", generator=g,
                                           dtype=torch.int32)
        got = staged_backward.saved_schedule(saved, tokens, K)
        want = _python_tables(saved, tokens, K, monkeypatch)
        for name, a, b in zip(staged_backward.Schedule._fields, got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (garbage, name)
        assert all(_equal(a, b) for a, b in zip(got, staged_backward.saved_schedule(saved, tokens, K)))
