"""The torch ops' one error convention (python/csrc/op_errors.hpp), on the
CPU: every bad argument raises RuntimeError naming it, before any work, and
no op returns an empty list in its place. Meta tensors reach the same checks
as CUDA ones (the Meta kernels share them), so no GPU is needed."""

import pytest
import torch

import mok

H, I, E, K, T = 128, 64, 4, 2, 16


def _layer(device="meta", shared=True):
    x = torch.empty(T, H, dtype=torch.bfloat16, device=device)
    ids = torch.empty(T, K, dtype=torch.int32, device=device)
    w = torch.empty(T, K, dtype=torch.float32, device=device)
    w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=device)
    w2 = torch.empty(E, H, I, dtype=torch.bfloat16, device=device)
    sw13 = torch.empty(2 * I, H, dtype=torch.bfloat16, device=device) if shared else None
    sw2 = torch.empty(H, I, dtype=torch.bfloat16, device=device) if shared else None
    return x, ids, w, w13, w2, sw13, sw2


def _forward(x, ids, w, w13, w2, sw13, sw2, **kw):
    kw.setdefault("num_experts", E)
    return mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, **kw)


def test_the_ostream_probe_formats_an_integer_inside_the_library():
    # The operation that once crashed torch's process (op_errors.hpp); a crash
    # here means the libstdc++ fault is back on this machine.
    assert torch.ops.mok.format_probe(-1234567890123) == "-1234567890123"


def test_good_arguments_pass_the_checks():
    out = _forward(*_layer())
    assert len(out) == 1 and out[0].shape == (T, H) and out[0].dtype == torch.bfloat16


@pytest.mark.parametrize("position, bad, message", [
    (0, lambda t: t.float(), r"x\[0\] must be BFloat16 \(got Float\)"),
    (1, lambda t: t.long(), r"expert_ids\[0\] must be Int \(got Long\)"),
    (2, lambda t: t.double(), r"weights\[0\] must be Float \(got Double\)"),
    (3, lambda t: t[:2], r"w13\[0\] must be \[E/R, 2I, H\] = \[4, 128, 128\] \(got \[2, 128, 128\]\)"),
    (4, lambda t: t[:, :, :32], r"w2\[0\] must be contiguous"),
    (0, lambda t: t.t().contiguous().t(), r"x\[0\] must be contiguous"),
    (2, lambda t: t[:3], r"weights\[0\] must be \[T, k\] = \[16, 2\] \(got \[3, 2\]\)"),
    (5, lambda t: t[:64], r"shared_w13 must be \[2S, H\] = \[128, 128\] \(got \[64, 128\]\)"),
    (1, lambda t: t.unsqueeze(0), r"expert_ids\[0\] must have 2 dimensions \(got shape \[1, 16, 2\]\)"),
])
def test_a_bad_tensor_is_named(position, bad, message):
    layer = list(_layer())
    layer[position] = bad(layer[position])
    with pytest.raises(RuntimeError, match=message):
        _forward(*layer)


def test_a_token_capacity_is_checked_and_sizes_the_training_ops_outputs():
    import os
    if os.environ.get("MOK_TOKEN_BUCKET"):
        pytest.skip("MOK_TOKEN_BUCKET is set here: it sizes the capacity-less calls too")
    layer = _layer()
    assert _forward(*layer, token_capacity=T)[0].shape == (T, H)
    assert _forward(*layer, token_capacity=4 * T)[0].shape == (T, H)
    with pytest.raises(RuntimeError, match=r"x\[0\] has 16 tokens, more than token_capacity = 15"):
        _forward(*layer, token_capacity=T - 1)
    with pytest.raises(RuntimeError, match=r"token_capacity = -1 must be >= 0"):
        _forward(*layer, token_capacity=-1)
    # The training op keeps the schedule rows of the object it runs on: the
    # capacity's, as if the call had brought that many tokens.
    x, ids, w, w13, w2, sw13, sw2 = layer
    args = ([x], [ids], [w], [w13], [w2], sw13, sw2, E, mok.tuning_list({}))
    capped = torch.ops.mok.fused_forward_train(*args, token_capacity=4 * T)
    big = [torch.empty(4 * T, *t.shape[1:], dtype=t.dtype, device=t.device) for t in (x, ids, w)]
    full = torch.ops.mok.fused_forward_train([big[0]], [big[1]], [big[2]], *args[3:])
    assert capped[0][0].shape == (T, H)
    assert capped[1][0].shape == full[1][0].shape and capped[5][0].shape == full[5][0].shape
    assert capped[1][0].shape[0] > torch.ops.mok.fused_forward_train(*args)[1][0].shape[0]


def test_tensors_on_different_devices_are_refused():
    x, ids, w, w13, w2, sw13, sw2 = _layer()
    with pytest.raises(RuntimeError, match=r"weights\[0\] is on cpu; the op runs on meta"):
        _forward(x, ids, torch.empty(T, K), w13, w2, sw13, sw2)


def test_cpu_tensors_are_refused_by_name():
    with pytest.raises(RuntimeError, match=r"x\[0\] is on cpu; mok runs on CUDA tensors"):
        _forward(*_layer("cpu"))
    a = torch.empty(64, 128, dtype=torch.bfloat16)
    b = torch.empty(1, 128, 128, dtype=torch.bfloat16)
    off, rows = mok.layout_from_counts([64])
    with pytest.raises(RuntimeError, match="a is on cpu; mok runs on CUDA tensors"):
        mok.grouped_mm(a, b, off, rows)


def test_shared_expert_needs_both_halves():
    x, ids, w, w13, w2, sw13, _ = _layer()
    with pytest.raises(RuntimeError, match="give both shared_w13 and shared_w2, or neither"):
        _forward(x, ids, w, w13, w2, sw13, None)


def test_lists_must_have_one_tensor_per_rank():
    x, ids, w, w13, w2, sw13, sw2 = _layer()
    with pytest.raises(RuntimeError, match="must each hold 2 tensors"):
        mok.fused_forward([x, x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E)
    with pytest.raises(RuntimeError, match="x must hold one tensor per rank"):
        mok.fused_forward([], [], [], [], [], sw13, sw2, num_experts=E)


@pytest.mark.parametrize("option", ["minibatch_rows", "ring_slots", "lookahead", "ctas_per_rank",
                                    "comm_ctas_per_rank"])
def test_an_option_that_does_not_fit_an_int_is_refused_not_wrapped(option):
    with pytest.raises(RuntimeError, match=option + " = 4294969344 is out of range"):
        _forward(*_layer(), **{option: 2**32 + 2048})


def test_num_experts_must_fit_an_int_and_divide_by_the_world():
    with pytest.raises(RuntimeError, match="num_experts = 3 must be a positive multiple of the world size R = 2"):
        x, ids, w, w13, w2, sw13, sw2 = _layer()
        mok.fused_forward([x, x], [ids, ids], [w, w], [w13, w13], [w2, w2], sw13, sw2, num_experts=3)
    with pytest.raises(RuntimeError, match="num_experts = 8589934592 is out of range"):
        _forward(*_layer(), num_experts=2**33)


def test_an_unknown_tuning_option_is_a_type_error():
    with pytest.raises(TypeError, match="unknown tuning option.*ring_slot\\b"):
        _forward(*_layer(), ring_slot=2)


def test_the_op_checks_the_length_of_its_tuning_list():
    x, ids, w, w13, w2, sw13, sw2 = _layer()
    with pytest.raises(RuntimeError, match="tuning must hold 5 values"):
        torch.ops.mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, E, [0, 0], False)


def test_grouped_mm_checks_name_the_argument():
    a = torch.empty(64, 128, dtype=torch.bfloat16, device="meta")
    b = torch.empty(2, 192, 128, dtype=torch.bfloat16, device="meta")
    off = torch.empty(3, dtype=torch.int32, device="meta")
    rows = torch.empty(2, dtype=torch.int32, device="meta")
    assert mok.grouped_mm(a, b, off, rows).shape == (64, 192)
    assert mok.grouped_mm_swiglu(a, b, off, rows).shape == (64, 96)
    with pytest.raises(RuntimeError, match="K differs"):
        mok.grouped_mm(a[:, :64].contiguous(), b, off, rows)
    with pytest.raises(RuntimeError, match=r"group_offset must have G \+ 1 = 3 entries \(got 2\)"):
        mok.grouped_mm(a, b, off[:2], rows)
    with pytest.raises(RuntimeError, match="group_rows must be Int"):
        mok.grouped_mm(a, b, off, rows.long())
    with pytest.raises(RuntimeError, match=r"w13 must be \[G, 2N, K\]"):
        mok.grouped_mm_swiglu(a, b[:, :191].contiguous(), off, rows)
