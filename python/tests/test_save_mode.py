"""Save mode of the staged backward: the forward's training op keeps its
schedule and the gate/up pre-activations, and the backward reads them instead
of recomputing (mok.fused_forward(..., save_activations=True)). CPU: the op is
replaced by mok.testing.reference_forward_train (the kernel's schedule and
rounding, with NaN and nonsense wherever the kernel writes nothing), the
kernels by their fp32 references; the gradients must equal recompute mode's.
The training op with keep_preact=False (the schedule only) under the staged
backward: recompute mode's gradients too."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
mok = pytest.importorskip("mok")
if not hasattr(torch.ops.mok, "fused_forward_train"):
    pytest.skip("the loaded library predates fused_forward_train", allow_module_level=True)

from mok import staged_backward  # noqa: E402
from mok.testing import (cpu_reference_forward, random_global_layer, reference_forward_train,  # noqa: E402
                         reference_ops, split_world)

CASES = {
    "shared, R=1": dict(T=40, H=64, I=64, E=4, k=2, S=64, R=1),
    "no shared, top-1, R=2": dict(T=33, H=64, I=128, E=6, k=1, S=0, R=2),
    "empty experts, R=2": dict(T=5, H=64, I=64, E=8, k=2, S=64, R=2),
}


def _grads(case, save, keep_preact=True):
    layer = random_global_layer(case["T"], case["H"], case["I"], case["E"], case["k"], case["S"], seed=3)
    args = split_world(layer, case["R"])
    xs, ids, ws, w13s, w2s, sw13, sw2 = args
    leaves = [t.clone().requires_grad_(True) for t in xs + ws + w13s + w2s]
    R = case["R"]
    x, w, w13, w2 = leaves[:R], leaves[R:2 * R], leaves[2 * R:3 * R], leaves[3 * R:]
    shared = [t.clone().requires_grad_(True) for t in (sw13, sw2)] if sw13 is not None else [None, None]
    with cpu_reference_forward():
        if keep_preact:
            out = mok.fused_forward(x, ids, w, w13, w2, *shared, num_experts=case["E"], save_activations=save)
        else:  # the training op itself, keeping its schedule only
            out = torch.ops.mok.fused_forward_train(x, ids, w, w13, w2, *shared, case["E"], mok.tuning_list({}),
                                                    False, keep_preact=False)[0]
        dout = [torch.randn(t.shape, generator=torch.Generator().manual_seed(5)).bfloat16() for t in out]
        inputs = [t for t in leaves + shared if t is not None]
        return out, torch.autograd.grad(out, inputs, dout)


@pytest.mark.parametrize("name", list(CASES))
def test_save_mode_gives_recompute_modes_gradients(name):
    case = CASES[name]
    out_r, grads_r = _grads(case, save=False)
    out_s, grads_s = _grads(case, save=True)
    for a, b in zip(out_r, out_s):
        assert torch.equal(a, b)
    for i, (a, b) in enumerate(zip(grads_r, grads_s)):
        assert torch.isfinite(b).all(), f"input {i}: a NaN the kernel leaves in unwritten rows was read"
        # Same rows, same groups: the reference ops give the same bits.
        assert torch.equal(a, b), f"input {i}: save mode differs from recompute mode by {(a - b).abs().max()}"


@pytest.mark.parametrize("name", list(CASES))
def test_the_training_op_without_preact_gives_recompute_modes_gradients(name, monkeypatch):
    # keep_preact=False keeps the schedule for the fused backward's recompute
    # mode; with the staged backward (MOK_BACKWARD=staged) nothing is read
    # from it: the autograd recomputes, as for the plain op.
    monkeypatch.setenv("MOK_BACKWARD", "staged")
    case = CASES[name]
    out_r, grads_r = _grads(case, save=False)
    out_l, grads_l = _grads(case, save=False, keep_preact=False)
    for a, b in zip(out_r, out_l):
        assert torch.equal(a, b)
    for i, (a, b) in enumerate(zip(grads_r, grads_l)):
        assert torch.equal(a, b), f"input {i}"


def test_saved_schedule_masks_padding_and_the_unused_tail():
    layer = random_global_layer(20, 64, 64, 4, 2, 0, seed=4)
    xs, ids, ws, w13s, w2s, sw13, sw2 = split_world(layer, 2)
    kept = reference_forward_train(xs, ids, ws, w13s, w2s, sw13, sw2, 4)[1:]
    saved = staged_backward.SavedForward(*kept)
    s = staged_backward.saved_schedule(saved, [t.shape[0] for t in xs], 2)
    recomputed = staged_backward.routed_schedule(torch.cat(ids), 4)
    T, k = 20, 2
    # Every (token, slot) entry lands on one row holding that entry.
    assert torch.equal(s.entry_of_row[s.row_of_entry], torch.arange(T * k))
    assert torch.equal(s.group_rows, recomputed.group_rows)
    # Rows outside the groups point at the dummy entry.
    in_group = torch.zeros(s.entry_of_row.numel(), dtype=torch.bool)
    for g in range(4):
        first = int(s.group_offset[g])
        in_group[first:first + int(s.group_rows[g])] = True
    assert (s.entry_of_row[~in_group] == T * k).all()
    assert (s.entry_of_row[in_group] < T * k).all()


def _loop_schedule(saved, tokens_per_rank, k):
    """saved_schedule's definition, one row at a time in Python."""
    R, cap, El = len(saved.schedule_rows), saved.schedule_rows[0].shape[0], saved.expert_rows[0].shape[0]
    T = sum(tokens_per_rank)
    firsts = [sum(tokens_per_rank[:r]) for r in range(R)]
    entry_of_row, token_of_row = [], []
    row_of_entry = [0] * (T * k)
    for i in range(R * cap):
        r, local = divmod(i, cap)
        home, token, slot = (int(v) for v in saved.schedule_rows[r][local])
        real = local < int(saved.expert_offset[r][El]) and home >= 0
        token_of_row.append(firsts[home] + token if real else 0)
        entry_of_row.append(token_of_row[-1] * k + slot if real else T * k)
        if real:
            row_of_entry[entry_of_row[-1]] = i
    group_offset = [int(o) + r * cap for r in range(R) for o in saved.expert_offset[r][:El]]
    group_offset.append(int(saved.expert_offset[-1][El]) + (R - 1) * cap)
    group_rows = [int(c) for r in range(R) for c in saved.expert_rows[r]]
    return entry_of_row, row_of_entry, token_of_row, group_offset, group_rows


@pytest.mark.parametrize("R, T, k, E", [(1, 20, 2, 4), (2, 20, 2, 4), (3, 17, 3, 6), (2, 3, 1, 2), (4, 9, 2, 8)])
def test_saved_schedule_is_its_definition_row_by_row(R, T, k, E):
    """Every field, every row (padding and the unused tails included),
    against a loop over the rows; and the dtypes the grouped kernels take."""
    layer = random_global_layer(T, 64, 64, E, k, 0, seed=R * 100 + T)
    xs, ids, ws, w13s, w2s, sw13, sw2 = split_world(layer, R)
    kept = reference_forward_train(xs, ids, ws, w13s, w2s, sw13, sw2, E)[1:]
    saved = staged_backward.SavedForward(*kept)
    tokens = [t.shape[0] for t in xs]
    s = staged_backward.saved_schedule(saved, tokens, k)
    want = _loop_schedule(saved, tokens, k)
    for name, got, expected in zip(("entry_of_row", "row_of_entry", "token_of_row", "group_offset", "group_rows"),
                                   s, want):
        assert got.tolist() == expected, name
    assert [t.dtype for t in s] == [torch.long] * 3 + [torch.int32] * 2


def test_the_training_op_has_a_fake_kernel_of_the_right_shapes():
    T, H, I, E, k, S = 16, 64, 64, 4, 2, 64
    meta = dict(device="meta")
    x = [torch.empty(T, H, dtype=torch.bfloat16, **meta)]
    ids = [torch.empty(T, k, dtype=torch.int32, **meta)]
    w = [torch.empty(T, k, dtype=torch.float32, **meta)]
    w13 = [torch.empty(E, 2 * I, H, dtype=torch.bfloat16, **meta)]
    w2 = [torch.empty(E, H, I, dtype=torch.bfloat16, **meta)]
    sw13 = torch.empty(2 * S, H, dtype=torch.bfloat16, **meta)
    sw2 = torch.empty(H, S, dtype=torch.bfloat16, **meta)
    out, preact, shared, rows, offsets, schedule = torch.ops.mok.fused_forward_train(
        x, ids, w, w13, w2, sw13, sw2, E, [0] * len(mok.TUNING_OPTIONS))
    capacity = T * k + E * 127
    assert out[0].shape == (T, H)
    assert preact[0].shape == (capacity, 2 * I) and preact[0].dtype == torch.bfloat16
    assert shared[0].shape == (T, 2 * S)
    assert rows[0].shape == (E,) and offsets[0].shape == (E + 1,) and schedule[0].shape == (capacity, 3)


def test_the_module_in_save_mode_trains_to_the_same_gradients():
    from mok.nn import MoE
    grads = {}
    for save in (False, True):
        torch.manual_seed(0)
        moe = MoE(64, 64, 4, 2, shared_intermediate=64, save_activations=save)
        x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1)).bfloat16().requires_grad_()
        with cpu_reference_forward():
            out = moe(x)
            out.float().square().sum().backward()
        grads[save] = [x.grad] + [p.grad for p in moe.parameters()]
    for a, b in zip(grads[False], grads[True]):
        assert a is not None and torch.equal(a, b)


class _RecordingContext:
    """Stands in for autograd's ctx: records what setup_context asks of it."""

    def __init__(self):
        self.materialize_grads = True  # autograd's default

    def set_materialize_grads(self, value):
        self.materialize_grads = value

    def save_for_backward(self, *tensors):
        self.saved = tensors

    def mark_non_differentiable(self, *tensors):
        pass


@pytest.mark.parametrize("keep_preact", [True, False])
def test_outputs_the_loss_does_not_reach_get_no_zero_gradient(keep_preact):
    """The training op's kept outputs (pre-activations, schedule) never reach
    the loss, nor does a rank's out that the loss does not use: autograd must
    hand the backward None for them, not zero tensors of their size, which it
    would allocate and clear before every backward (the pre-activations alone
    are 300 MB on the DeepSeek-V3 slice). Both ops' setup turns that off; the
    backward's handling of None is what the unused-rank case below runs."""
    from mok import autograd
    case = CASES["no shared, top-1, R=2"]
    layer = random_global_layer(case["T"], case["H"], case["I"], case["E"], case["k"], case["S"], seed=3)
    xs, ids, ws, w13s, w2s, _, _ = split_world(layer, case["R"])
    inputs = (xs, ids, ws, w13s, w2s, None, None, case["E"], mok.tuning_list({}), False, keep_preact, 0)
    with cpu_reference_forward():
        output = torch.ops.mok.fused_forward_train(*inputs)
        plain = torch.ops.mok.fused_forward(*inputs[:10])
    ctx = _RecordingContext()
    autograd._setup_fused_forward_train(ctx, inputs, output)
    assert ctx.materialize_grads is False
    ctx = _RecordingContext()
    autograd._setup_fused_forward(ctx, inputs[:10], plain)
    assert ctx.materialize_grads is False

    # A rank whose out the loss does not use: its dout comes as None.
    x = [t.clone().requires_grad_(True) for t in xs]
    with cpu_reference_forward():
        out = mok.fused_forward(x, ids, ws, w13s, w2s, num_experts=case["E"], save_activations=keep_preact)
        (dx0,) = torch.autograd.grad(out[0], [x[0]], torch.ones_like(out[0]))
    assert torch.isfinite(dx0).all() and dx0.abs().sum() > 0
