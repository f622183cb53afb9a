"""mok's ops under torch.use_deterministic_algorithms(True), on a Hopper GPU.

In that mode torch fills every new tensor with NaN before use
(torch.utils.deterministic.fill_uninitialized_memory, on by default). mok's
ops allocate their outputs below that fill, since their kernels write every
element, and clear the padding rows they would otherwise leave unwritten, so
that every byte they return is still repeatable (python/csrc/op_outputs.hpp).
Checked here: in that mode no op launches a fill kernel more than it does
outside it; real rows keep their bits and padding rows are zeros, even in a
block that held 0xFF bytes; and the staged backward gives the same gradients'
bits in the mode (with and without the fill) as outside it."""

import contextlib
from collections import Counter

import pytest
import torch
import torch.utils.deterministic  # noqa: F401  (the fill's switch; not imported by torch itself)

from conftest import skip_without_hopper

skip_without_hopper()

import mok  # noqa: E402
from mok.staged_backward import has_kernel_ops  # noqa: E402
from mok.testing import random_global_layer  # noqa: E402
from test_backward_gpu import (COUNTS, _fused_grads, _layout, _poisoned_block, _rand, _same_bits,  # noqa: E402
                               _untouched)

if not has_kernel_ops():
    pytest.skip("libmok_torch.so predates the backward ops", allow_module_level=True)


@contextlib.contextmanager
def deterministic(fill=True):
    """torch's deterministic mode with its fill of new tensors on or off; the previous settings after."""
    was = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
           torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = fill
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
        torch.utils.deterministic.fill_uninitialized_memory = was[2]


def _fill_kernels(fn):
    """The fill kernels (torch's FillFunctor) fn launches, by name, from a profile."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted(e.name for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA and "FillFunctor" in e.name)


def _operands():
    off, rows, inside = _layout()
    G, M, K, N, H, I = len(COUNTS), inside.numel(), 192, 320, 320, 192
    g = torch.Generator(device="cuda").manual_seed(41)
    T, k, pad = 100, 4, 77
    row_of_entry = torch.randperm(T * k + pad, device="cuda", generator=g)[:T * k]
    entry_of_row = torch.full((T * k + pad,), T * k, dtype=torch.long, device="cuda")
    entry_of_row[row_of_entry] = torch.arange(T * k, device="cuda")
    return dict(
        off=off, rows=rows, inside=inside, G=G,
        a=_rand(M, K, seed=42, inside=inside),
        b_nk=_rand(G, N, K, seed=43, scale=2 / K ** 0.5),
        w13=_rand(G, 2 * N, K, seed=44, scale=2 / K ** 0.5),
        b_kn=_rand(G, K, N, seed=45, scale=2 / K ** 0.5),
        dout=_rand(M, H, seed=46, inside=inside),
        w2=_rand(G, H, I, seed=47, scale=2 / H ** 0.5),
        preact=_rand(M, 2 * I, seed=48, scale=3.0, inside=inside),
        scale=torch.rand(M, device="cuda", generator=g),
        b_rows=_rand(M, N, seed=49, inside=inside),
        x=torch.randn(T, 512, device="cuda", generator=g).bfloat16(),
        row_of_entry=row_of_entry.view(T, k), entry_of_row=entry_of_row,
        slot_rows=torch.randint(0, M, (T, k), device="cuda", generator=g, dtype=torch.int32),
        combine_rows=torch.randn(M, 512, device="cuda", generator=g).bfloat16(),
        base=torch.randn(T, 512, device="cuda", generator=g).bfloat16(),
    )


# Each op as the staged backward and the forward call it; (name, fn(operands)).
OPS = [
    ("grouped_mm", lambda o: mok.grouped_mm(o["a"], o["b_nk"], o["off"], o["rows"])),
    ("grouped_mm_swiglu", lambda o: mok.grouped_mm_swiglu(o["a"], o["w13"], o["off"], o["rows"])),
    ("grouped_mm_kn", lambda o: mok.grouped_mm_kn(o["a"], o["b_kn"], o["off"], o["rows"])),
    ("grouped_mm_kn zero_padding=False",
     lambda o: mok.grouped_mm_kn(o["a"], o["b_kn"], o["off"], o["rows"], zero_padding=False)),
    ("swiglu_backward_mm", lambda o: mok.swiglu_backward_mm(o["dout"], o["w2"], o["preact"], o["scale"], o["off"],
                                                            o["rows"])),
    ("swiglu_backward_mm zero_padding=False",
     lambda o: mok.swiglu_backward_mm(o["dout"], o["w2"], o["preact"], o["scale"], o["off"], o["rows"],
                                      zero_padding=False)),
    ("weight_grad_mm fp32", lambda o: mok.weight_grad_mm(o["a"], o["b_rows"], o["off"], o["rows"], o["G"])),
    ("weight_grad_mm bf16", lambda o: mok.weight_grad_mm(o["a"], o["b_rows"], o["off"], o["rows"], o["G"],
                                                         out_dtype=torch.bfloat16)),
    ("row_combine", lambda o: mok.row_combine(o["combine_rows"], o["slot_rows"], o["base"])),
    ("scatter_rows", lambda o: mok.scatter_rows([o["x"]], o["row_of_entry"], o["entry_of_row"])),
    ("scatter_rows zero_padding=False",
     lambda o: mok.scatter_rows([o["x"]], o["row_of_entry"], o["entry_of_row"], zero_padding=False)),
]


@pytest.mark.parametrize("name, op", OPS, ids=[name for name, _ in OPS])
def test_an_op_launches_no_fill_of_its_outputs_in_deterministic_mode(name, op):
    o = _operands()
    outside = _fill_kernels(lambda: op(o))
    with deterministic():
        inside = _fill_kernels(lambda: op(o))
    # Before its outputs skipped torch's fill, every output added one here.
    assert inside == outside, name


def test_the_fused_forward_launches_no_fill_of_its_outputs_in_deterministic_mode():
    layer = random_global_layer(256, 256, 128, 8, 2, 128, seed=50, device="cuda")
    x, ids, w, w13, w2, sw13, sw2 = layer
    args = ([x], [ids], [w], [w13], [w2], sw13, sw2, 8, mok.tuning_list({}), False)
    for op in (torch.ops.mok.fused_forward, torch.ops.mok.fused_forward_train):
        outside = _fill_kernels(lambda: op(*args))
        with deterministic():
            inside = _fill_kernels(lambda: op(*args))
        extra = Counter(inside) - Counter(outside)
        if op is torch.ops.mok.fused_forward:
            assert not extra, extra
        else:
            # The one fill left: the pass state's bytes (a small scratch the
            # schedule is copied out of, whose tail past the schedule's end
            # the pass never writes), which keeps that tail repeatable.
            assert sum(extra.values()) == 1 and "unsigned char" in next(iter(extra)), extra


def test_padding_rows_are_zeros_in_deterministic_mode_and_real_rows_keep_their_bits():
    o = _operands()
    inside = o["inside"]
    M = inside.numel()
    cases = [  # (name, fn, index of the output, its shape and dtype, rows the op writes)
        ("grouped_mm", lambda: mok.grouped_mm(o["a"], o["b_nk"], o["off"], o["rows"]), None,
         (M, o["b_nk"].shape[1]), inside),
        ("grouped_mm_kn", lambda: mok.grouped_mm_kn(o["a"], o["b_kn"], o["off"], o["rows"], zero_padding=False),
         None, (M, o["b_kn"].shape[2]), inside),
        ("swiglu_backward_mm d13", lambda: mok.swiglu_backward_mm(o["dout"], o["w2"], o["preact"], o["scale"],
                                                                  o["off"], o["rows"], zero_padding=False),
         0, (M, 2 * o["w2"].shape[2]), inside),
        ("scatter_rows", lambda: mok.scatter_rows([o["x"]], o["row_of_entry"], o["entry_of_row"],
                                                  zero_padding=False),
         0, (o["entry_of_row"].numel(), o["x"].shape[1]), o["entry_of_row"] < o["row_of_entry"].numel()),
    ]
    for name, fn, index, shape, written in cases:
        plain = fn()
        plain = plain if index is None else plain[index]
        address = _poisoned_block(shape, torch.bfloat16)
        with deterministic():
            got = fn()
        got = got if index is None else got[index]
        assert got.data_ptr() == address, name  # the allocator gave the poisoned block back
        assert _same_bits(got[written], plain[written]), name
        assert not got[~written].any(), name  # zeros, not the block's 0xFF (nor torch's NaN)
        # Outside the mode the padding stays as it was (the staged backward's saving).
        address = _poisoned_block(shape, torch.bfloat16)
        again = fn()
        again = again if index is None else again[index]
        assert again.data_ptr() == address and _untouched(again, ~written), name


def test_the_saved_pre_activations_padding_is_zeros_in_deterministic_mode():
    T, H, I, E, k = 256, 256, 128, 8, 2  # ~64 rows an expert: every group padded
    layer = random_global_layer(T, H, I, E, k, 128, seed=51, device="cuda")
    x, ids, w, w13, w2, sw13, sw2 = layer
    args = ([x], [ids], [w], [w13], [w2], sw13, sw2, E, mok.tuning_list({}), True)
    plain = torch.ops.mok.fused_forward_train(*args)
    with deterministic():
        got = torch.ops.mok.fused_forward_train(*args)
    preact, rows, offsets = got[1][0], got[3][0].tolist(), got[4][0].tolist()
    written = torch.zeros(preact.shape[0], dtype=torch.bool, device="cuda")
    for g in range(E):
        written[offsets[g]:offsets[g] + rows[g]] = True
    assert (~written).any()  # the test needs padding
    assert not preact[~written].any()
    assert _same_bits(preact[written], plain[1][0][written])
    end = offsets[-1]  # schedule rows past it hold no data (the op's doc)
    for i, (a, b) in enumerate(zip(got, plain)):
        if i == 5:
            a, b = [a[0][:end]], [b[0][:end]]
        if i != 1:
            assert all(_same_bits(p, q) for p, q in zip(a, b)), i


@pytest.mark.parametrize("save", [True, False])
def test_the_staged_backward_gives_the_same_bits_in_deterministic_mode(save):
    T, H, I, E, k = 256, 256, 128, 8, 2
    layer = random_global_layer(T, H, I, E, k, 128, seed=52, device="cuda")
    dout = _rand(T, H, seed=53)
    outside = _fused_grads(layer, 1, dout, save=save)
    for fill in (True, False):
        with deterministic(fill):
            got = _fused_grads(layer, 1, dout, save=save)
        for a, b in zip(outside, got):
            assert (a is None and b is None) or _same_bits(a, b), f"fill={fill}"
