"""The staged backward (mok/staged_backward.py) on the CPU, with mok.testing's
fp32 torch references of its ops: against torch autograd of the fp32 layer
(mok.testing.reference_forward) on several shapes, top-1, empty experts,
without a shared expert; through mok.fused_forward's autograd (its CPU kernel
replaced by the reference forward) on virtual worlds of 1 and 2 ranks; what it
skips when a gradient is not needed; the reference SwiGLU backward against
autograd; a mutant that the checks catch; and mok.nn's MoE trained a few steps.
The same on a GPU with mok's kernels: test_backward_gpu.py."""

import pytest
import torch

import mok
from mok.staged_backward import BackwardOps, Needs, layer_backward, routed_schedule
from mok.testing import (cpu_reference_forward, random_global_layer, reference_layer_grads, reference_ops,
                         reference_swiglu_backward_mm, split_world)

NAMES = ("dx", "dweights", "dw13", "dw2", "dshared_w13", "dshared_w2")
# Every gradient passes through at most a few bf16 roundings (dout, d13, the
# per-slot dx rows, the final dx) on top of the forward's: ~0.4% measured.
TOLERANCE = 1e-2


def _rel(got, want):
    return float((got.float() - want).norm() / want.norm())


def _layer(T, H, I, E, K, S, seed, experts_used=None):
    """random_global_layer, its routing drawn from `experts_used` only (the
    other experts get no rows) when given."""
    layer = list(random_global_layer(T, H, I, E, K, S, seed))
    if experts_used is not None:
        g = torch.Generator().manual_seed(seed + 1)
        scores = torch.full((T, E), float("-inf"))
        scores[:, experts_used] = torch.rand(T, len(experts_used), generator=g)
        top = torch.topk(scores, K, dim=1)
        layer[1], layer[2] = top.indices.int(), torch.softmax(top.values, dim=1).float()
    return tuple(layer)


def _dout(T, H, seed):
    g = torch.Generator().manual_seed(seed + 7)
    return (torch.rand(T, H, generator=g) * 2 - 1).bfloat16()


def _errors(grads, want):
    return {name: _rel(got, ref) for name, got, ref in zip(NAMES, grads, want) if ref is not None}


CASES = {
    "shared": dict(T=64, H=128, I=64, E=4, K=2, S=64),
    "top1, no shared": dict(T=40, H=64, I=128, E=8, K=1, S=0),
    "every expert, k = E": dict(T=24, H=64, I=64, E=4, K=4, S=128),
    "empty experts": dict(T=50, H=128, I=64, E=8, K=2, S=64, experts_used=[1, 2, 6]),
    "one token": dict(T=1, H=64, I=64, E=4, K=2, S=64),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_torch_autograd_of_the_fp32_layer(case):
    layer = _layer(seed=1, **case)
    dout = _dout(case["T"], case["H"], 1)
    grads = layer_backward(dout, *layer, ops=reference_ops())
    assert grads.dx.dtype == torch.bfloat16 and grads.dweights.dtype == torch.float32
    assert grads.dw13.dtype == torch.float32 and grads.dw13.shape == layer[3].shape
    assert (grads.dshared_w13 is None) == (case["S"] == 0)
    errors = _errors(grads, reference_layer_grads(*layer, dout))
    assert len(errors) == (6 if case["S"] else 4)
    assert max(errors.values()) < TOLERANCE, errors


def test_empty_experts_get_zero_weight_gradients():
    case = CASES["empty experts"]
    layer = _layer(seed=2, **case)
    grads = layer_backward(_dout(case["T"], case["H"], 2), *layer, ops=reference_ops())
    unused = [e for e in range(case["E"]) if e not in case["experts_used"]]
    assert not grads.dw13[unused].any() and not grads.dw2[unused].any()
    assert grads.dw13[case["experts_used"]].abs().amax(dim=(1, 2)).min() > 0


def test_swapping_gate_and_up_is_caught():
    # The mutant: the SwiGLU backward reads up as gate. Every routed gradient
    # moves far beyond the tolerance (~35% to 140%), so the checks above can fail.
    case = CASES["shared"]
    layer = _layer(seed=3, **case)
    dout = _dout(case["T"], case["H"], 3)
    want = reference_layer_grads(*layer, dout)
    good = _errors(layer_backward(dout, *layer, ops=reference_ops()), want)
    bad = _errors(layer_backward(dout, *layer, ops=reference_ops(swap_gate_up=True)), want)
    assert max(good.values()) < TOLERANCE
    assert min(bad.values()) > 10 * TOLERANCE, bad


def test_the_schedule_keeps_global_token_order_within_each_expert():
    ids = torch.tensor([[2, 0], [0, 3], [2, 3], [3, 0]], dtype=torch.int32)
    s = routed_schedule(ids, 5)
    assert s.group_offset.tolist() == [0, 3, 3, 5, 8, 8]  # expert 1 and 4: no rows
    assert s.group_rows.tolist() == [3, 0, 2, 3, 0]
    assert s.entry_of_row.tolist() == [1, 2, 7, 0, 4, 3, 5, 6]  # entry = token * k + slot
    assert s.token_of_row.tolist() == [0, 1, 3, 0, 2, 1, 2, 3]
    assert torch.equal(s.entry_of_row[s.row_of_entry], torch.arange(8))
    assert s.group_offset.dtype == s.group_rows.dtype == torch.int32


def test_the_reference_scatter_is_the_row_gather_on_claimed_rows_and_zero_elsewhere():
    T, k, pad = 5, 3, 4
    g = torch.Generator().manual_seed(3)
    row_of_entry = torch.randperm(T * k + pad, generator=g)[:T * k]
    entry_of_row = torch.full((T * k + pad,), T * k, dtype=torch.long)
    entry_of_row[row_of_entry] = torch.arange(T * k)
    x = torch.randn(T, 16, generator=g)
    (rows,) = reference_ops().scatter_rows([x], row_of_entry.view(T, k), entry_of_row)
    claimed = entry_of_row < T * k
    assert torch.equal(rows[claimed], x.index_select(0, entry_of_row[claimed] // k))
    assert not rows[~claimed].any() and (~claimed).sum() == pad
    # An entry whose row holds another entry claims nothing (its own row is zeroed).
    row_of_entry[2] = row_of_entry[4]
    (rows,) = reference_ops().scatter_rows([x], row_of_entry.view(T, k), entry_of_row)
    assert not rows[entry_of_row == 2].any() and torch.equal(rows[entry_of_row == 4], x[1:2])


def _counting(ops):
    """ops that also record the name of each call."""
    calls = []

    def wrap(name, fn):
        def call(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return call
    return BackwardOps(*(wrap(name, fn) for name, fn in zip(BackwardOps._fields, ops))), calls


@pytest.mark.parametrize("needs, expected_calls", [
    (Needs(), {"grouped_mm": 2, "swiglu_backward_mm": 2, "grouped_mm_kn": 2, "weight_grad_mm": 4, "row_combine": 1,
               "scatter_rows": 1}),
    (Needs(x=False, weights=False, w13=False, shared_w13=False, shared_w2=False),
     {"grouped_mm": 1, "swiglu_backward_mm": 1, "weight_grad_mm": 1, "scatter_rows": 1}),
    (Needs(x=False, weights=False, w13=False, w2=False, shared_w13=False),
     {"grouped_mm": 1, "swiglu_backward_mm": 1, "weight_grad_mm": 1}),
    (Needs(x=False, w13=False, w2=False, shared_w13=False, shared_w2=False),
     {"grouped_mm": 1, "swiglu_backward_mm": 1, "scatter_rows": 1}),
    (Needs(x=False, weights=False, w13=False, w2=False, shared_w13=False, shared_w2=False), {}),
])
def test_computes_only_what_is_needed(needs, expected_calls):
    case = CASES["shared"]
    layer = _layer(seed=4, **case)
    dout = _dout(case["T"], case["H"], 4)
    ops, calls = _counting(reference_ops())
    grads = layer_backward(dout, *layer, needs=needs, ops=ops)
    assert {name: calls.count(name) for name in set(calls)} == expected_calls
    wanted = reference_layer_grads(*layer, dout)
    for name, got, want, need in zip(NAMES, grads, wanted, needs):
        assert (got is None) != need, name
        if need:
            assert _rel(got, want) < TOLERANCE, name


def _padded(s, T, k, multiple, tail):
    """Schedule s with each group's rows padded to `multiple` and `tail` unused
    rows after the last group, as the forward's saved schedule lays them out:
    padding rows hold the dummy entry T k and token 0."""
    rows = s.group_rows.tolist()
    offsets = [0]
    for r in rows:
        offsets.append(offsets[-1] + -(-r // multiple) * multiple)
    M = offsets[-1] + tail
    entry_of_row = torch.full((M,), T * k, dtype=torch.long)
    for g, r in enumerate(rows):
        first = int(s.group_offset[g])
        entry_of_row[offsets[g]:offsets[g] + r] = s.entry_of_row[first:first + r]
    real = entry_of_row < T * k
    row_of_entry = torch.zeros(T * k, dtype=torch.long)
    row_of_entry[entry_of_row[real]] = torch.arange(M)[real]
    return s._replace(entry_of_row=entry_of_row, row_of_entry=row_of_entry,
                      token_of_row=torch.where(real, torch.div(entry_of_row, k, rounding_mode="floor"), 0),
                      group_offset=torch.tensor(offsets, dtype=torch.int32))


@pytest.mark.parametrize("case", ["shared", "empty experts"])
def test_padding_rows_are_never_read(case):
    # The staged backward leaves every padding row uninitialised
    # (zero_padding=False); the reference ops fill them with NaN, so a read of
    # one would reach a gradient. Padded, the gradients are those of the
    # unpadded schedule.
    shape = CASES[case]
    layer = _layer(seed=4, **shape)
    T, K = shape["T"], shape["K"]
    dout = _dout(T, shape["H"], 4)
    schedule = routed_schedule(layer[1], shape["E"])
    padded = _padded(schedule, T, K, multiple=16, tail=5)
    assert int(padded.group_offset[-1]) + 5 > T * K  # there is padding
    want = layer_backward(dout, *layer, ops=reference_ops(), schedule=schedule)
    got = layer_backward(dout, *layer, ops=reference_ops(), schedule=padded)
    for name, a, b in zip(NAMES, want, got):
        if a is not None:
            assert torch.isfinite(b).all(), name
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6, msg=name)


def test_the_reference_swiglu_backward_is_the_derivative_of_the_forward():
    # acc plays dL/dy for y = w * silu(gate) * up: autograd of that expression
    # gives d13 (wrt [gate | up]) and row_scale_grad (wrt w). Rows 3 and 11 are
    # padding (outside both groups): zeros.
    g = torch.Generator().manual_seed(5)
    M, H, I = 12, 64, 32
    dout = (torch.rand(M, H, generator=g) * 2 - 1).bfloat16()
    w2 = (torch.rand(2, H, I, generator=g) * 2 - 1).bfloat16()
    preact = (torch.rand(M, 2 * I, generator=g) * 4 - 2).bfloat16()
    scale = torch.rand(M, generator=g)
    offset, rows = torch.tensor([0, 4, 12], dtype=torch.int32), torch.tensor([3, 7], dtype=torch.int32)
    d13, scaled_act, scale_grad = reference_swiglu_backward_mm(dout, w2, preact, scale, offset, rows)
    inside = torch.tensor([r not in (3, 11) for r in range(M)])
    group = torch.tensor([0] * 4 + [1] * 8)
    acc = torch.einsum("mh,mhi->mi", dout.float(), w2.float()[group])
    pre = preact.float().requires_grad_()
    w = scale.clone().requires_grad_()
    h = torch.nn.functional.silu(pre[:, :I]) * pre[:, I:]
    (w.unsqueeze(1) * h * acc)[inside].sum().backward()
    assert _rel(d13.float(), pre.grad) < 1e-2  # one bf16 rounding
    assert _rel(scale_grad, w.grad) < 1e-5
    assert _rel(scaled_act.float(), (w.unsqueeze(1) * h).detach() * inside.unsqueeze(1)) < 1e-2
    assert not d13[~inside].any() and not scaled_act[~inside].any() and not scale_grad[~inside].any()


def test_reference_weight_grad_sums_each_groups_outer_products():
    g = torch.Generator().manual_seed(6)
    a = torch.rand(10, 64, generator=g).bfloat16()
    b = torch.rand(10, 128, generator=g).bfloat16()
    offset, rows = torch.tensor([0, 2, 2, 9], dtype=torch.int32), torch.tensor([2, 0, 5], dtype=torch.int32)
    out = mok.testing.reference_weight_grad_mm(a, b, offset, rows, 3)
    for group, members in enumerate([[0, 1], [], [2, 3, 4, 5, 6]]):
        want = sum((torch.outer(a[r].float(), b[r].float()) for r in members), torch.zeros(64, 128))
        torch.testing.assert_close(out[group], want)
    start = torch.rand(3, 64, 128, generator=g)
    acc = start.clone()
    mok.testing.reference_weight_grad_mm_acc_(acc, a, b, offset, rows)
    torch.testing.assert_close(acc, start + out)


# ---- through mok.fused_forward's autograd (CPU kernel = reference forward) --

def _fused_grads(layer, world, dout):
    """Gradients of every input of mok.fused_forward on a virtual world of `world` ranks."""
    xs, ids, ws, w13s, w2s, sw13, sw2 = split_world(layer, world)
    leaves = [t.requires_grad_() for t in xs + ws + w13s + w2s]
    shared = [t.clone().requires_grad_() for t in (sw13, sw2)] if sw13 is not None else [None, None]
    with cpu_reference_forward():
        outs = mok.fused_forward(xs, ids, ws, w13s, w2s, *shared, num_experts=w13s[0].shape[0] * world)
    assert len(outs) == world and all(o.dtype == torch.bfloat16 for o in outs)
    torch.cat(outs).backward(dout)
    assert all(t.grad.dtype == t.dtype and t.grad.shape == t.shape for t in leaves)

    def joined(group):
        return torch.cat([t.grad for t in group])
    return (joined(xs), joined(ws), joined(w13s), joined(w2s),
            *(None if t is None else t.grad for t in shared))


@pytest.mark.parametrize("shared", [True, False])
def test_fused_forward_backward_matches_autograd_on_worlds_of_one_and_two(shared):
    layer = random_global_layer(64, 128, 64, 4, 2, 64 if shared else 0, seed=8)
    dout = _dout(64, 128, 8)
    want = reference_layer_grads(*layer, dout)
    one, two = _fused_grads(layer, 1, dout), _fused_grads(layer, 2, dout)
    errors = _errors(one, want)
    assert max(errors.values()) < TOLERANCE, errors
    # The ranks are concatenated back into the one global layer: same bits.
    for name, a, b in zip(NAMES, one, two):
        assert (a is None and b is None) or torch.equal(a, b), name


def test_a_loss_on_some_ranks_outputs_only():
    layer = random_global_layer(32, 64, 64, 4, 2, 0, seed=9)
    xs, ids, ws, w13s, w2s, _, _ = split_world(layer, 2)
    for t in xs + w13s:
        t.requires_grad_()
    with cpu_reference_forward():
        outs = mok.fused_forward(xs, ids, ws, w13s, w2s, num_experts=4)
    outs[1].float().sum().backward()  # rank 0's output is unused: its tokens get zero gradients
    assert not xs[0].grad.any() and xs[1].grad.abs().sum() > 0
    assert all(t.grad is not None for t in w13s)


# ---- mok.nn ------------------------------------------------------------------

def train_moe_a_few_steps(device, steps=4):
    """Losses of a regression (MoE to a fixed target) over SGD steps, checking
    on the way that every parameter gets a finite gradient. Shared with
    test_backward_gpu.py."""
    torch.manual_seed(11)
    H, I, E, K, S, T = 128, 64, 4, 2, 64, 64
    moe = mok.nn.MoE(H, I, E, K, shared_intermediate=S, device=device)
    x = (torch.rand(T, H, device=device) * 2 - 1).bfloat16()
    target = (torch.rand(T, H, device=device) * 2 - 1) * 0.1
    optimizer = torch.optim.SGD(moe.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (moe(x).float() - target).square().sum(dim=-1).mean()
        loss.backward()
        for name, p in moe.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_moe_trains():
    with cpu_reference_forward():
        losses = train_moe_a_few_steps("cpu")
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0], losses


def test_fp32_main_grad_accumulates_each_micro_batch_once():
    from mok.nn import MoE
    from mok.testing import cpu_reference_forward
    torch.manual_seed(0)
    moe = MoE(64, 64, 4, 2, shared_intermediate=64, fp32_main_grad=True)
    batches = [torch.randn(10, 64, generator=torch.Generator().manual_seed(s)).bfloat16() for s in (1, 2)]
    with cpu_reference_forward():
        for x in batches:
            moe(x).float().square().sum().backward()
    experts = [moe.w13, moe.w2, moe.shared_w13, moe.shared_w2]
    assert all(p.grad is None for p in experts)
    # The same sums, returned in fp32 per micro-batch and added in order.
    want = [torch.zeros_like(p, dtype=torch.float32) for p in experts]
    for x in batches:
        tokens = x.contiguous()
        ids, w = moe.router(tokens)
        with cpu_reference_forward():
            out = mok.fused_forward([tokens], [ids], [w], [moe.w13.detach()], [moe.w2.detach()],
                                    moe.shared_w13.detach(), moe.shared_w2.detach(), num_experts=4)[0]
        dout = (2 * out.float()).bfloat16()  # d/d out of sum(out^2)
        g = layer_backward(dout, tokens, ids, w.detach(), moe.w13.detach(), moe.w2.detach(), moe.shared_w13.detach(),
                           moe.shared_w2.detach(), ops=reference_ops())
        for acc, grad in zip(want, (g.dw13, g.dw2, g.dshared_w13, g.dshared_w2)):
            acc += grad
    for p, w in zip(experts, want):
        assert torch.equal(p.main_grad, w)
    # A main_grad of the wrong dtype is refused by name.
    moe.w13.main_grad = torch.zeros_like(moe.w13)
    with cpu_reference_forward(), pytest.raises(ValueError, match="main_grad"):
        moe(batches[0]).float().sum().backward()
