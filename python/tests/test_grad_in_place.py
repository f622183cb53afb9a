"""Gradient accumulation into .grad in place (mok/autograd.py): when a bf16
weight already has a .grad and loss.backward() will add to it, the staged
backward adds the weight gradient there itself (weight_grad_mm_acc_ on the
bf16 .grad) and returns none, so torch's AccumulateGrad has nothing to add.
On the CPU, through mok.nn.MoE and the reference ops: the same .grad bits as
torch's own accumulation, micro-batch after micro-batch; and every case where
it must not happen (autograd.grad, hooks, MOK_GRAD_IN_PLACE=0, a .grad
not contiguous, a main_grad) leaves torch's path alone. The GPU twin, with the
kernels: test_grad_in_place_gpu.py."""

import pytest
import torch

import mok
import mok.nn
import mok.testing
from mok.testing import cpu_reference_forward

H, I, E, K, S, T = 64, 64, 4, 2, 64, 24


def make_moe(seed=0):
    torch.manual_seed(seed)
    return mok.nn.MoE(H, I, E, K, shared_intermediate=S)


def batches(count=3):
    return [torch.randn(T, H, generator=torch.Generator().manual_seed(s)).bfloat16() for s in range(1, count + 1)]


@pytest.fixture()
def acc_calls(monkeypatch):
    """The bf16 targets the reference weight_grad_mm_acc_ was given: the
    .grads it added to in place (the reference weight_grad_mm runs it on an
    fp32 sum of its own, not counted); it still runs."""
    calls = []
    original = mok.testing.reference_weight_grad_mm_acc_

    def counting(out, *args):
        if out.dtype == torch.bfloat16:
            calls.append(out)
        return original(out, *args)

    monkeypatch.setattr(mok.testing, "reference_weight_grad_mm_acc_", counting)
    return calls


def where(tensors):
    """Where each tensor's data starts (the op gets views of the .grads)."""
    return {t.data_ptr() for t in tensors}


def accumulate(moe, xs):
    with cpu_reference_forward():
        for x in xs:
            moe(x).float().square().mean().backward()
    return [p.grad.clone() for p in (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2)]


def test_in_place_gives_torchs_accumulated_bits(monkeypatch, acc_calls):
    xs = batches()
    monkeypatch.setenv("MOK_GRAD_IN_PLACE", "0")
    want = accumulate(make_moe(), xs)
    assert not acc_calls
    monkeypatch.setenv("MOK_GRAD_IN_PLACE", "1")
    moe = make_moe()
    got = accumulate(moe, xs)
    # The first micro-batch finds no .grad (returned, stolen by torch); the
    # next two add to it: four expert weights each.
    assert len(acc_calls) == 8
    experts = (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2)
    assert where(acc_calls) == where(p.grad for p in experts)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16 and torch.equal(g.view(torch.int16), w.view(torch.int16))
    # The router's weight is not mok's: torch accumulates it as always.
    assert moe.router.weight.grad is not None


def test_a_zeroed_grad_is_added_to_from_the_first_micro_batch(acc_calls):
    xs = batches(1)
    want = accumulate(make_moe(), xs)
    moe = make_moe()
    for p in moe.parameters():
        p.grad = torch.zeros_like(p)  # zero_grad(set_to_none=False)
    got = accumulate(moe, xs)
    assert len(acc_calls) == 4
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_autograd_grad_returns_the_gradient_and_leaves_grad_alone(acc_calls):
    moe = make_moe()
    accumulate(moe, batches(1))
    before = moe.w13.grad.clone()
    with cpu_reference_forward():
        out = moe(batches(2)[1]).float().square().mean()
        (g13,) = torch.autograd.grad(out, [moe.w13])
    assert not acc_calls
    assert torch.equal(moe.w13.grad, before) and g13.shape == moe.w13.shape and g13.abs().sum() > 0
    # Only some inputs: the others' AccumulateGrad does not run either.
    with cpu_reference_forward():
        out = moe(batches(2)[1]).float().square().mean()
        out.backward(inputs=[moe.w2])
    assert len(acc_calls) == 1 and where(acc_calls) == where([moe.w2.grad])
    assert torch.equal(moe.w13.grad, before)


def test_hooks_keep_torchs_path(acc_calls):
    moe = make_moe()
    accumulate(moe, batches(1))
    seen, accumulated = [], []
    moe.w13.register_hook(lambda g: seen.append(g.shape))
    moe.w2.register_post_accumulate_grad_hook(lambda p: accumulated.append(p.grad.shape))
    accumulate(moe, batches(2)[1:])
    assert seen == [moe.w13.shape] and accumulated == [moe.w2.shape]
    assert where(acc_calls) == where([moe.shared_w13.grad, moe.shared_w2.grad])


@pytest.mark.filterwarnings("ignore:grad and param do not obey the gradient layout contract")
def test_switched_off_or_not_contiguous(monkeypatch, acc_calls):
    moe = make_moe()
    accumulate(moe, batches(1))
    monkeypatch.setenv("MOK_GRAD_IN_PLACE", "0")
    accumulate(moe, batches(2)[1:])
    assert not acc_calls
    monkeypatch.delenv("MOK_GRAD_IN_PLACE")
    moe.w2.grad = moe.w2.grad.transpose(1, 2).contiguous().transpose(1, 2)  # not contiguous: torch adds to it
    before = moe.w2.grad.clone()
    accumulate(moe, batches(3)[2:])
    assert where(acc_calls) == where([moe.w13.grad, moe.shared_w13.grad, moe.shared_w2.grad])
    assert not torch.equal(moe.w2.grad, before)


def test_a_main_grad_wins():
    moe = mok.nn.MoE(H, I, E, K, shared_intermediate=S, fp32_main_grad=True)
    for p in (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2):
        p.grad = torch.zeros_like(p)
    accumulate(moe, batches(2))
    for p in (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2):
        assert not p.grad.any() and p.main_grad.abs().sum() > 0


def test_weight_nodes_come_from_the_backwards_own_edges(monkeypatch, acc_calls):
    """Each weight's AccumulateGrad node is read from the backward node's
    edges, not found through get_gradient_edge (which records a view op per
    call: host time before the first kernel); the decisions are the same."""
    looked_up = []
    original = torch.autograd.graph.get_gradient_edge

    def counting(t):
        looked_up.append(t.shape)
        return original(t)

    monkeypatch.setattr(torch.autograd.graph, "get_gradient_edge", counting)
    moe = make_moe()
    accumulate(moe, batches(1))
    accumulate(moe, batches(2)[1:])
    assert len(acc_calls) == 4 and not looked_up
    with cpu_reference_forward():
        moe(batches(3)[2]).float().square().mean().backward(inputs=[moe.w2])
    assert len(acc_calls) == 5 and where(acc_calls[4:]) == where([moe.w2.grad]) and not looked_up
