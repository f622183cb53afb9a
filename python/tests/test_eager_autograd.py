"""mok/eager_autograd.py: in eager mode mok.fused_forward's autograd skips
torch.library's per-call wrapper. It must change nothing but host time: the
same outputs, the same gradient bits and Nones, for every mode and world, as
the registered formulas (MOK_EAGER_AUTOGRAD=0), and the same errors. CPU: the
ops are mok.testing's reference stand-ins, the kernels their fp32 references."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
mok = pytest.importorskip("mok")
if not hasattr(torch.ops.mok, "fused_forward_train"):
    pytest.skip("the loaded library predates fused_forward_train", allow_module_level=True)

from mok import eager_autograd  # noqa: E402
from mok.testing import cpu_reference_forward, random_global_layer, split_world  # noqa: E402

CASES = {
    "shared, R=1": dict(T=40, H=64, I=64, E=4, k=2, S=64, R=1),
    "no shared, top-1, R=2": dict(T=33, H=64, I=128, E=6, k=1, S=0, R=2),
    "shared, uneven, R=2": dict(T=7, H=64, I=64, E=8, k=2, S=64, R=2),
}


def _run(case, save, eager, monkeypatch, use_ranks=None, retain=False):
    """(outputs, gradients [, gradients of a second backward]) of one call."""
    monkeypatch.setenv("MOK_EAGER_AUTOGRAD", "1" if eager else "0")
    layer = random_global_layer(case["T"], case["H"], case["I"], case["E"], case["k"], case["S"], seed=11)
    xs, ids, ws, w13s, w2s, sw13, sw2 = split_world(layer, case["R"])
    R = case["R"]
    x, w, w13, w2 = ([t.clone().requires_grad_(True) for t in group] for group in (xs, ws, w13s, w2s))
    shared = [None if t is None else t.clone().requires_grad_(True) for t in (sw13, sw2)]
    with cpu_reference_forward():
        assert eager_autograd.applies(x, ids, w, w13, w2, *shared) == eager
        out = mok.fused_forward(x, ids, w, w13, w2, *shared, num_experts=case["E"], save_activations=save)
        ranks = range(R) if use_ranks is None else use_ranks
        used = [out[r] for r in ranks]
        douts = [torch.randn(t.shape, generator=torch.Generator().manual_seed(5 + r)).bfloat16()
                 for r, t in zip(ranks, used)]
        inputs = [t for t in x + w + w13 + w2 + shared if t is not None]
        grads = torch.autograd.grad(used, inputs, douts, retain_graph=retain, allow_unused=True)
        again = torch.autograd.grad(used, inputs, douts, allow_unused=True) if retain else None
    return out, grads, again


def _same(a, b, what):
    assert (a is None) == (b is None), f"{what}: one path gives None"
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape, what
        assert torch.equal(a, b), f"{what}: differs by {(a.float() - b.float()).abs().max()}"


@pytest.mark.parametrize("save", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_the_eager_path_gives_the_registered_paths_bits(name, save, monkeypatch):
    out_e, grads_e, _ = _run(CASES[name], save, True, monkeypatch)
    out_r, grads_r, _ = _run(CASES[name], save, False, monkeypatch)
    for r, (a, b) in enumerate(zip(out_e, out_r)):
        _same(a, b, f"out[{r}]")
    assert len(grads_e) == len(grads_r)
    for i, (a, b) in enumerate(zip(grads_e, grads_r)):
        _same(a, b, f"gradient {i}")
    assert all(g is not None for g in grads_e)


@pytest.mark.parametrize("save", [False, True])
def test_an_unused_rank_and_a_retained_graph(save, monkeypatch):
    """Rank 0's out unused (its dout comes as None), and two backwards of one
    graph: the second reads needs_input_grad again (the eager path restores it)."""
    case = CASES["shared, uneven, R=2"]
    _, first_e, second_e = _run(case, save, True, monkeypatch, use_ranks=[1], retain=True)
    _, first_r, second_r = _run(case, save, False, monkeypatch, use_ranks=[1], retain=True)
    for i, (a, b, c) in enumerate(zip(first_e, second_e, first_r)):
        _same(a, b, f"gradient {i}, second backward")
        _same(a, c, f"gradient {i}")


def test_only_recorded_well_formed_calls_take_the_eager_path(monkeypatch):
    monkeypatch.setenv("MOK_EAGER_AUTOGRAD", "1")
    layer = random_global_layer(8, 64, 64, 4, 2, 0, seed=1)
    xs, ids, ws, w13s, w2s, _, _ = split_world(layer, 2)
    assert not eager_autograd.applies(xs, ids, ws, w13s, w2s, None, None)  # nothing requires grad
    x = [t.clone().requires_grad_(True) for t in xs]
    assert eager_autograd.applies(x, ids, ws, w13s, w2s, None, None)
    with torch.no_grad():
        assert not eager_autograd.applies(x, ids, ws, w13s, w2s, None, None)
    assert not eager_autograd.applies(x, ids[:1], ws, w13s, w2s, None, None)  # a list one short
    monkeypatch.setenv("MOK_EAGER_AUTOGRAD", "0")
    assert not eager_autograd.applies(x, ids, ws, w13s, w2s, None, None)


def test_a_malformed_call_still_gets_the_ops_error(monkeypatch):
    """A list one short must not be split by hand into the wrong ranks: the
    call reaches the op as without the eager path, and fails the same way (on
    the CPU the op is the reference stand-in, so the message is its own; the
    kernel op's names the lists: test_errors.py)."""
    layer = random_global_layer(8, 64, 64, 4, 2, 0, seed=1)
    xs, ids, ws, w13s, w2s, _, _ = split_world(layer, 2)
    x = [t.clone().requires_grad_(True) for t in xs]
    messages = []
    for eager in ("1", "0"):
        monkeypatch.setenv("MOK_EAGER_AUTOGRAD", eager)
        with cpu_reference_forward(), pytest.raises(RuntimeError) as error:
            mok.fused_forward(x, ids[:1], ws, w13s, w2s, num_experts=4)
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_double_backward_still_raises(monkeypatch):
    monkeypatch.setenv("MOK_EAGER_AUTOGRAD", "1")
    layer = random_global_layer(8, 64, 64, 4, 2, 64, seed=2)
    xs, ids, ws, w13s, w2s, sw13, sw2 = split_world(layer, 1)
    x = [xs[0].clone().requires_grad_(True)]
    with cpu_reference_forward():
        out = mok.fused_forward(x, ids, ws, w13s, w2s, sw13, sw2, num_experts=4)
        with pytest.raises(NotImplementedError, match="create_graph"):
            torch.autograd.grad(out[0].float().sum(), x, create_graph=True)


def test_the_cpp_node_is_for_one_real_cuda_rank_only(monkeypatch):
    """node_applies (mok.fused_forward's choice of the C++ autograd node,
    test_train_node_gpu.py's subject): never for CPU or meta tensors, a
    virtual world of R > 1, MOK_CPP_AUTOGRAD=0, or MOK_BACKWARD=fused; and
    the op, reached with CPU tensors, refuses them by name."""
    if not hasattr(torch.ops.mok, "fused_forward_train_node"):
        pytest.skip("the loaded library predates fused_forward_train_node")
    x = torch.randn(8, 64).bfloat16()
    assert not eager_autograd.node_applies([x])
    assert not eager_autograd.node_applies([x.to("meta")])
    assert not eager_autograd.node_applies([x, x])
    monkeypatch.setenv("MOK_BACKWARD", "nonsense")
    assert not eager_autograd.node_applies([x])  # CPU: decided before MOK_BACKWARD is read
    monkeypatch.delenv("MOK_BACKWARD")
    ids = torch.zeros(8, 1, dtype=torch.int32)
    w13, w2 = torch.randn(2, 128, 64).bfloat16(), torch.randn(2, 64, 64).bfloat16()
    with pytest.raises(RuntimeError, match=r"x\[0\] is on cpu"):
        torch.ops.mok.fused_forward_train_node(x.requires_grad_(), ids, torch.ones(8, 1), w13, w2, None, None, 2,
                                               [], False, 0, True, None, None, None, None)
