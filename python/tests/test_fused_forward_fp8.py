"""torch.ops.mok.fused_forward_fp8 (mok.fused_forward_fp8): the fused FP8
forward as a torch op. On the CPU: its fake kernel (shapes under
FakeTensorMode, the argument checks, the scales' shapes) and the wrapper's
refusal of unquantized weights. On a Hopper GPU: against the staged FP8
forward (mok/fp8_forward.py, the same recipe by other kernels) and its fp32
reference ops, bitwise repeatable and the same bits over a virtual world of
1 and 2 ranks, outputs poisoned first, and backward refused by name."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
mok = pytest.importorskip("mok")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from conftest import has_hopper  # noqa: E402
from mok.fp8_forward import reference_fp8_ops, staged_fp8_forward  # noqa: E402
from mok.testing import random_global_layer, split_world  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.mok, "fused_forward_fp8"),
                                reason="a library built before the FP8 op")

# H a multiple of 256, I of 128 (whole 128 x 128 scale blocks; the fused FP8 forward's rule).
T, H, I, E, K, S = 192, 256, 128, 8, 2, 128


def _quantized_world(layer, world, device):
    """mok.fused_forward_fp8's arguments for `layer` over `world` ranks: rank
    r's expert weights quantized as mok.quantize_weights gives them."""
    xs, ids, ws, w13, w2, sw13, sw2 = split_world(layer, world, device)
    return xs, ids, ws, [mok.quantize_weights(w) for w in w13], [mok.quantize_weights(w) for w in w2], sw13, sw2


def _fake_args(world=1):
    el, t = E // world, T // world
    f8, u8, bf = torch.float8_e4m3fn, torch.uint8, torch.bfloat16
    xs = [torch.empty(t, H, dtype=bf, device="cuda") for _ in range(world)]
    ids = [torch.empty(t, K, dtype=torch.int32, device="cuda") for _ in range(world)]
    ws = [torch.empty(t, K, dtype=torch.float32, device="cuda") for _ in range(world)]
    w13 = [torch.empty(el, 2 * I, H, dtype=f8, device="cuda") for _ in range(world)]
    w13s = [torch.empty(el, 2 * I // 128, H // 128, dtype=u8, device="cuda") for _ in range(world)]
    w2 = [torch.empty(el, H, I, dtype=f8, device="cuda") for _ in range(world)]
    w2s = [torch.empty(el, H // 128, I // 128, dtype=u8, device="cuda") for _ in range(world)]
    sw13 = torch.empty(2 * S, H, dtype=bf, device="cuda")
    sw2 = torch.empty(H, S, dtype=bf, device="cuda")
    return [xs, ids, ws, w13, w13s, w2, w2s, sw13, sw2, E, mok.tuning_list({}), False]


def test_fake_tensors_get_outputs_of_the_right_shape():
    with FakeTensorMode():
        args = _fake_args(world=2)
        out = torch.ops.mok.fused_forward_fp8(*args)
        assert [(tuple(o.shape), o.dtype, o.device.type) for o in out] == [((T // 2, H), torch.bfloat16, "cuda")] * 2


def test_fake_tensors_reach_the_argument_checks():
    with FakeTensorMode():
        args = _fake_args()
        bad = list(args)
        bad[4] = [args[4][0][:, :1].contiguous()]  # w13 scales with one block row
        with pytest.raises(RuntimeError, match=r"w13_scales\[0\] must be \[E/R, 2I / 128, H / 128\] = \[8, 2, 2\]"):
            torch.ops.mok.fused_forward_fp8(*bad)
        bad = list(args)
        bad[3] = [torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device="cuda")]  # unquantized weights
        with pytest.raises(RuntimeError, match=r"w13\[0\] must be Float8_e4m3fn"):
            torch.ops.mok.fused_forward_fp8(*bad)
        bad = list(args)
        bad[6] = []
        with pytest.raises(RuntimeError, match="w13_scales and w2_scales must each hold 1 tensors"):
            torch.ops.mok.fused_forward_fp8(*bad)


def test_compile_fullgraph_traces_it_without_a_graph_break():
    # Meta tensors stand in for CUDA ones (the Meta kernel runs the same checks).
    f8, u8, bf = torch.float8_e4m3fn, torch.uint8, torch.bfloat16
    x = [torch.empty(T, H, dtype=bf, device="meta")]
    ids = [torch.empty(T, K, dtype=torch.int32, device="meta")]
    ws = [torch.empty(T, K, dtype=torch.float32, device="meta")]
    q13 = [mok.QuantizedWeights(torch.empty(E, 2 * I, H, dtype=f8, device="meta"),
                                torch.empty(E, 2 * I // 128, H // 128, dtype=u8, device="meta"), None, None)]
    q2 = [mok.QuantizedWeights(torch.empty(E, H, I, dtype=f8, device="meta"),
                               torch.empty(E, H // 128, I // 128, dtype=u8, device="meta"), None, None)]
    sw13 = torch.empty(2 * S, H, dtype=bf, device="meta")
    sw2 = torch.empty(H, S, dtype=bf, device="meta")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, ids, ws, q13, q2, sw13, sw2):
        return mok.fused_forward_fp8(x, ids, ws, q13, q2, sw13, sw2, num_experts=E, ring_slots=2)[0] * 2

    out = torch.compile(layer, fullgraph=True, backend=backend)(x, ids, ws, q13, q2, sw13, sw2)
    assert out.shape == (T, H) and out.dtype == bf
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("mok.fused_forward_fp8" in t for t in targets), targets


def test_the_wrapper_asks_for_quantized_weights():
    layer = random_global_layer(T, H, I, E, K, S, seed=3)
    xs, ids, ws, w13, w2, sw13, sw2 = split_world(layer, 1)
    with pytest.raises(TypeError, match="one mok.QuantizedWeights per rank"):
        mok.fused_forward_fp8(xs, ids, ws, w13, w2, sw13, sw2, num_experts=E)


def test_check_errors_refuses_nan_scales_and_values_naming_them():
    layer = random_global_layer(T, H, I, E, K, S, seed=4)
    xs, ids, ws, q13, q2, sw13, sw2 = _quantized_world(layer, 1, "cpu")
    scales = q2[0].scales.clone()
    scales[3, 1, 0] = 255
    with pytest.raises(ValueError, match=r"w2\[0\].scales\[3, 1, 0\] is 255 \(NaN in UE8M0\)"):
        mok.fused_forward_fp8(xs, ids, ws, q13, [q2[0]._replace(scales=scales)], sw13, sw2, num_experts=E,
                              check_errors=True)
    values = q13[0].values.clone()
    values.view(torch.uint8)[5, 7, 9] = 0xFF
    with pytest.raises(ValueError, match=r"w13\[0\].values\[5, 7, 9\] is NaN"):
        mok.fused_forward_fp8(xs, ids, ws, [q13[0]._replace(values=values)], q2, sw13, sw2, num_experts=E,
                              check_errors=True)


def test_calls_autograd_does_not_record_skip_its_python_kernel(monkeypatch):
    """Host time before the launch: a call autograd does not record (no
    input requiring grad, or grad mode off) enters the op below autograd, as
    mok.fused_forward does, instead of through the Python kernel that
    torch.library's registration puts there; a recorded call keeps it (its
    backward refuses by the op's name). Seen from inside the op: whether the
    autograd dispatch keys are excluded when it is reached."""
    below = []

    def op(*args, token_capacity=0):
        below.append(torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.AutogradFunctionality))
        return [torch.empty(0)]

    monkeypatch.setattr(torch.ops.mok, "fused_forward_fp8", op)
    layer = random_global_layer(T, H, I, E, K, S, seed=8)
    xs, ids, ws, q13, q2, sw13, sw2 = _quantized_world(layer, 1, "cpu")
    mok.fused_forward_fp8(xs, ids, ws, q13, q2, sw13, sw2, num_experts=E)
    grad_x = [xs[0].clone().requires_grad_(True)]
    mok.fused_forward_fp8(grad_x, ids, ws, q13, q2, sw13, sw2, num_experts=E)
    with torch.no_grad():
        mok.fused_forward_fp8(grad_x, ids, ws, q13, q2, sw13, sw2, num_experts=E)
    grad_shared = sw13.clone().requires_grad_(True)
    mok.fused_forward_fp8(xs, ids, ws, q13, q2, grad_shared, sw2, num_experts=E)
    assert below == [True, False, True, False]


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


gpu = pytest.mark.skipif(not has_hopper(), reason="needs a Hopper (sm_90) GPU")


@gpu
def test_matches_the_staged_fp8_forward_and_repeats_bitwise_across_world_sizes():
    layer = random_global_layer(T, H, I, E, K, S, seed=31, device="cuda")
    x, ids, w, w13, w2, sw13, sw2 = layer
    q13, q2 = mok.quantize_weights(w13), mok.quantize_weights(w2)
    staged = staged_fp8_forward(x, ids, w, q13, q2, sw13, sw2)
    reference = staged_fp8_forward(x, ids, w, q13, q2, sw13, sw2, ops=reference_fp8_ops())
    outs = {}
    for world in (1, 2):
        args = _quantized_world(layer, world, "cuda")
        torch.cuda.synchronize()
        for _ in range(3):
            out = torch.cat(mok.fused_forward_fp8(*args, num_experts=E, check_errors=True, minibatch_rows=128,
                                                  ring_slots=2))
            assert out.isfinite().all()  # every row written (the op's outputs start uninitialized)
            if world in outs:
                assert torch.equal(out, outs[world]), f"R={world}: not bitwise repeatable"
            outs[world] = out
    assert torch.equal(outs[1], outs[2]), "R=1 and R=2 differ"
    # The same recipe (x per 1 x 128 block, h quantized from fp32, fp32
    # promotion every 128 of K); only the summation order differs, which now
    # and then flips one h value's e4m3 rounding.
    assert _rel(outs[1], staged) < 1e-2
    assert _rel(outs[1], reference) < 1e-2


@gpu
def test_backward_is_refused_by_name():
    layer = random_global_layer(T, H, I, E, K, S, seed=5, device="cuda")
    xs, ids, ws, q13, q2, sw13, sw2 = _quantized_world(layer, 1, "cuda")
    x = xs[0].clone().requires_grad_(True)
    out = mok.fused_forward_fp8([x], ids, ws, q13, q2, sw13, sw2, num_experts=E)[0]
    with pytest.raises(NotImplementedError, match="mok.fused_forward_fp8 has no backward yet"):
        out.float().sum().backward()


@gpu
def test_bad_shapes_are_refused_before_launch():
    layer = random_global_layer(T, H, I, E, K, S, seed=6, device="cuda")
    xs, ids, ws, q13, q2, sw13, sw2 = _quantized_world(layer, 1, "cuda")
    bad = [q13[0]._replace(scales=q13[0].scales[:, :, :1].contiguous())]
    with pytest.raises(RuntimeError, match=r"w13_scales\[0\] must be"):
        mok.fused_forward_fp8(xs, ids, ws, bad, q2, sw13, sw2, num_experts=E)
    with pytest.raises(RuntimeError, match="minibatch_rows = 192"):
        mok.fused_forward_fp8(xs, ids, ws, q13, q2, sw13, sw2, num_experts=E, minibatch_rows=192)
