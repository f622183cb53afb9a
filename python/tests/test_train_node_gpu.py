"""The C++ autograd node of one rank's staged backward
(torch.ops.mok.fused_forward_train_node, python/csrc/train_node_ops.cpp)
against the Python nodes it stands in for (mok/eager_autograd.py's
FusedForwardTrain in save mode, FusedForward in recompute mode;
MOK_CPP_AUTOGRAD=0), on a Hopper GPU with fresh random data: which calls
take it, the same output and gradient bits in both modes for every subset of
needed gradients, with and without a shared expert, through autograd.grad
and backward; main_grad buffers; .grad
accumulated in place (seen through a dispatch mode, which sees the staged
chain's op however it is called) and the cases that must keep torch's
accumulation; double backward refused."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import skip_without_hopper

skip_without_hopper()

import mok  # noqa: E402
import mok.nn  # noqa: E402
from mok.testing import random_global_layer  # noqa: E402
from test_backward_gpu import _rand, _same_bits  # noqa: E402

if not hasattr(torch.ops.mok, "fused_forward_train_node"):
    pytest.skip("libmok_torch.so predates mok::fused_forward_train_node", allow_module_level=True)

T, H, I, E, K, S = 320, 256, 192, 8, 3, 128


class StagedBackwardCalls(TorchDispatchMode):
    """Records, for each call of mok::staged_backward (from Python or from the
    C++ node), the data pointers of the bf16 buffers it was handed to add
    weight gradients to in place (main buffers of gradients it computes)."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.bf16_buffers = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.mok.staged_backward.default:
            self.calls += 1
            needs, mains = args[14], args[16:20]
            for needed, main in zip(needs[2:], mains):
                if needed and main is not None and main.dtype == torch.bfloat16:
                    self.bf16_buffers.append(main.data_ptr())
        return func(*args, **(kwargs or {}))


def _leaves(layer):
    x, ids, w, w13, w2, sw13, sw2 = layer
    x, w, w13, w2 = (t.clone().requires_grad_() for t in (x, w, w13, w2))
    sw13, sw2 = (None if t is None else t.clone().requires_grad_() for t in (sw13, sw2))
    return x, ids, w, w13, w2, sw13, sw2


def _forward(leaves, node, monkeypatch, save=True):
    monkeypatch.setenv("MOK_CPP_AUTOGRAD", "1" if node else "0")
    x, ids, w, w13, w2, sw13, sw2 = leaves
    (out,) = mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E, check_errors=True,
                               save_activations=save)
    taken = "TrainNode" in out.grad_fn.name()
    assert taken == node, out.grad_fn.name()
    return out


WANT = {"all": (0, 2, 3, 4, 5, 6), "x": (0,), "router weights": (2,), "routed weights": (3, 4),
        "shared weights": (5, 6), "x and w2": (0, 4)}


@pytest.mark.parametrize("save", [True, False], ids=["save", "recompute"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("want", list(WANT))
def test_the_node_gives_the_python_nodes_bits(want, shared, save, monkeypatch):
    monkeypatch.setenv("MOK_BACKWARD", "staged")
    layer = random_global_layer(T, H, I, E, K, S if shared else 0, seed=70, device="cuda")
    dout = _rand(T, H, seed=71)
    results = []
    for node in (True, False, True):
        leaves = _leaves(layer)
        out = _forward(leaves, node, monkeypatch, save)
        inputs = [leaves[i] for i in WANT[want] if leaves[i] is not None]
        if not inputs:
            pytest.skip("no shared expert to differentiate")
        with StagedBackwardCalls() as seen:
            grads = torch.autograd.grad(out, inputs, dout)
        # The node calls the staged chain's op; the Python node, under a
        # dispatch mode, runs the chain's Python reference instead.
        assert seen.calls == (1 if node else 0) and not seen.bf16_buffers  # autograd.grad: nothing in place
        results.append((out.detach(), grads))
    (out1, g1), (out0, g0), (out2, g2) = results
    assert _same_bits(out1, out0) and _same_bits(out1, out2)
    for a, b, c in zip(g1, g0, g2):
        assert torch.isfinite(a).all() and a.abs().sum() > 0
        assert _same_bits(a, b) and _same_bits(a, c)


def _moe_grads(node, monkeypatch, *, main_grad=False, micro_batches=3, hook=False, save=True):
    monkeypatch.setenv("MOK_CPP_AUTOGRAD", "1" if node else "0")
    torch.manual_seed(0)
    moe = mok.nn.MoE(H, I, E, K, shared_intermediate=S, device="cuda", save_activations=save,
                     fp32_main_grad=main_grad)
    experts = (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2)
    if hook:
        moe.w13.register_hook(lambda g: g)
    seen = StagedBackwardCalls()
    for step in range(micro_batches):
        x = torch.randn(T + 29 * step, H, device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(step)).bfloat16()
        loss = moe(x).float().square().mean()
        with seen:
            loss.backward()
    grads = [None if p.grad is None else p.grad.clone() for p in experts]
    mains = [p.main_grad.clone() for p in experts] if main_grad else None
    return moe, experts, grads, mains, seen


@pytest.mark.parametrize("save", [True, False], ids=["save", "recompute"])
def test_grads_accumulated_in_place_as_the_python_node_does(save, monkeypatch):
    _, _, want, _, seen0 = _moe_grads(False, monkeypatch, save=save)
    moe, experts, got, _, seen1 = _moe_grads(True, monkeypatch, save=save)
    # The first micro-batch finds no .grad; the next two add to the four
    # expert weights' .grads in place, on both paths.
    assert seen1.calls == 3 and len(seen1.bf16_buffers) == 8
    assert set(seen1.bf16_buffers) == {p.grad.data_ptr() for p in experts}
    for name, g, w in zip(("w13", "w2", "shared_w13", "shared_w2"), got, want):
        assert _same_bits(g, w), name


def test_in_place_switched_off_and_hooks_keep_torchs_accumulation(monkeypatch):
    monkeypatch.setenv("MOK_GRAD_IN_PLACE", "0")
    _, _, want, _, seen = _moe_grads(True, monkeypatch)
    assert seen.calls == 3 and not seen.bf16_buffers
    monkeypatch.delenv("MOK_GRAD_IN_PLACE")
    moe, experts, got, _, seen = _moe_grads(True, monkeypatch, hook=True)
    assert set(seen.bf16_buffers) == {p.grad.data_ptr() for p in experts[1:]}  # w13 has a hook
    for g, w in zip(got, want):
        assert _same_bits(g, w)


@pytest.mark.parametrize("save", [True, False], ids=["save", "recompute"])
def test_main_grads_get_the_python_nodes_bits(save, monkeypatch):
    _, _, _, want, _ = _moe_grads(False, monkeypatch, main_grad=True, micro_batches=2, save=save)
    _, experts, grads, got, seen = _moe_grads(True, monkeypatch, main_grad=True, micro_batches=2, save=save)
    assert not seen.bf16_buffers and all(g is None for g in grads)
    for name, g, w in zip(("w13", "w2", "shared_w13", "shared_w2"), got, want):
        assert g.abs().sum() > 0 and _same_bits(g, w), name


def test_the_nodes_backward_has_no_backward(monkeypatch):
    layer = random_global_layer(T, H, I, E, K, S, seed=72, device="cuda")
    leaves = _leaves(layer)
    out = _forward(leaves, True, monkeypatch)
    with pytest.raises(NotImplementedError, match="create_graph=True is not supported"):
        torch.autograd.grad(out.float().sum(), [leaves[0]], create_graph=True)


def test_which_calls_take_the_node(monkeypatch):
    layer = random_global_layer(T, H, I, E, K, S, seed=73, device="cuda")
    for save in (True, False):
        _forward(_leaves(layer), True, monkeypatch, save)
        _forward(_leaves(layer), False, monkeypatch, save)  # MOK_CPP_AUTOGRAD=0
    monkeypatch.setenv("MOK_CPP_AUTOGRAD", "1")
    monkeypatch.setenv("MOK_BACKWARD", "fused")  # the fused backward kernel keeps the Python node
    x, ids, w, w13, w2, sw13, sw2 = _leaves(layer)
    for save in (True, False):
        (out,) = mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E, save_activations=save)
        assert "TrainNode" not in out.grad_fn.name()
    monkeypatch.setenv("MOK_BACKWARD", "staged")
    with torch.no_grad():  # nothing recorded: no node at all
        (out,) = mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E)
    assert out.grad_fn is None
