"""The fused backward kernel as a torch op (torch.ops.mok.fused_backward) and
save mode's autograd, which calls it on CUDA tensors.

CPU (meta tensors, no GPU): the op's fake kernel gives outputs of the right
shapes and runs the argument checks; the autograd's choice of backward
(MOK_BACKWARD); the autograd's fused path through the fake kernel (gradients
of the inputs' shapes and dtypes, None where not needed, main_grad); and
torch.compile tracing it. Recompute mode: the training op's keep_preact=False
(empty preact lists, the schedule as before; the old calls unchanged), the
backward op's empty preact lists (save mode's output shapes, the checks that
remain), the forward's choice of op (fake CUDA tensors: the training op only
with MOK_BACKWARD=fused and grad), the autograd's recompute-mode fused path
and its torch.compile trace.

Hopper GPU: the op's gradients equal the staged backward's bit for bit (the
same arithmetic per element by construction: the SwiGLU-backward epilogue,
the weight-gradient tile, the combine order) for a few shapes, with and
without a shared expert, on virtual worlds of 1, 2 and 4 ranks (uneven, one
rank without tokens); at R > 1 the shared expert's weight gradients are the
ranks' shares added in rank order, which the staged backward gives rank by
rank; accumulation into main buffers; the autograd against MOK_BACKWARD=staged;
mok.nn's MoE with fp32 main grads in save mode. Recompute mode: the op with
empty preact lists gives save mode's bits (the training op's keep_preact=False
keeps the same schedule and out); through the autograd, MOK_BACKWARD=fused in
recompute mode gives save mode's bits and the staged backward's.
"""
from __future__ import annotations

import pytest
import torch

from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import mok
import mok.autograd
from conftest import has_hopper
from mok import staged_backward
from mok.staged_backward import MainGrads, Needs, SavedForward
from mok.testing import random_global_layer

HAS_OP = hasattr(torch.ops.mok, "fused_backward")
if not HAS_OP:
    pytest.skip("libmok_torch.so predates the fused backward op", allow_module_level=True)

needs_gpu = pytest.mark.skipif(not has_hopper(), reason="needs a Hopper (sm_90) GPU")

# The GPU tests' device (a name, so that their logic can be run elsewhere).
DEVICE = "cuda"


# ---- helpers ------------------------------------------------------------------

def _tuning(**options):
    return mok.tuning_list(options)


def _empty(*shape, dtype=torch.bfloat16, device="meta", grad=False):
    return torch.empty(*shape, dtype=dtype, device=device, requires_grad=grad)


def _meta_args(tokens, H, I, E, k, S, *, capacity_extra=0):
    """fused_backward's arguments on meta tensors (the training op's saved
    tensors of the shapes it returns, `capacity_extra` more rows)."""
    R = len(tokens)
    El = E // R
    rows = sum(tokens) * k + El * 127 + capacity_extra
    x = [_empty(t, H) for t in tokens]
    w = [_empty(t, k, dtype=torch.float32) for t in tokens]
    w13 = [_empty(El, 2 * I, H) for _ in tokens]
    w2 = [_empty(El, H, I) for _ in tokens]
    sw13 = _empty(2 * S, H) if S else None
    sw2 = _empty(H, S) if S else None
    preact = [_empty(rows, 2 * I) for _ in tokens]
    shared_preact = [_empty(t, 2 * S) for t in tokens]
    expert_rows = [_empty(El, dtype=torch.int32) for _ in tokens]
    expert_offset = [_empty(El + 1, dtype=torch.int32) for _ in tokens]
    schedule_rows = [_empty(rows, 3, dtype=torch.int32) for _ in tokens]
    dout = [_empty(t, H) for t in tokens]
    return [x, w, w13, w2, sw13, sw2, preact, shared_preact, expert_rows, expert_offset, schedule_rows, dout,
            _tuning()]


def _same(a, b):
    """Same shape, dtype and values (NaN differs from everything: an unwritten
    element fails)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


# ---- the op's fake kernel and checks (CPU) --------------------------------------

@pytest.mark.parametrize("tokens,S", [([16], 64), ([16], 0), ([10, 0, 7, 5], 64)])
def test_the_fake_kernel_gives_outputs_of_the_right_shapes(tokens, S):
    H, I, E, k = 128, 64, 8, 3
    T = sum(tokens)
    dx, dw, dw13, dw2, dsw13, dsw2 = torch.ops.mok.fused_backward(*_meta_args(tokens, H, I, E, k, S))
    assert dx.shape == (T, H) and dx.dtype == torch.bfloat16
    assert dw.shape == (T, k) and dw.dtype == torch.float32
    assert dw13.shape == (E, 2 * I, H) and dw2.shape == (E, H, I)
    assert dw13.dtype == dw2.dtype == torch.float32
    if S:
        assert dsw13.shape == (2 * S, H) and dsw2.shape == (H, S)
    else:
        assert dsw13.shape == dsw2.shape == (0,)
    assert dsw13.dtype == dsw2.dtype == torch.float32


def test_outputs_that_go_to_main_buffers_come_back_empty():
    H, I, E, k, S = 128, 64, 4, 2, 64
    args = _meta_args([16], H, I, E, k, S)
    main13 = _empty(E, 2 * I, H, dtype=torch.float32)
    mainsw2 = _empty(H, S, dtype=torch.float32)
    _, _, dw13, dw2, dsw13, dsw2 = torch.ops.mok.fused_backward(*args, main_w13=main13, main_shared_w2=mainsw2)
    assert dw13.shape == (0,) and dsw2.shape == (0,)
    assert dw2.shape == (E, H, I) and dsw13.shape == (2 * S, H)


def test_a_forward_with_a_larger_capacity_is_accepted():
    # MOK_TOKEN_BUCKET: the forward's object was made for more tokens, so it
    # kept more schedule rows than this call's layer needs.
    torch.ops.mok.fused_backward(*_meta_args([16, 9], 128, 64, 4, 2, 64, capacity_extra=300))


def test_a_token_capacity_is_checked():
    # The forward's token_capacity: the object is the capacity's, each count up to it runs on it.
    args = _meta_args([16, 9], 128, 64, 4, 2, 64, capacity_extra=300)
    torch.ops.mok.fused_backward(*args, token_capacity=16)
    with pytest.raises(RuntimeError, match=r"x\[0\] has 16 tokens, more than token_capacity = 15"):
        torch.ops.mok.fused_backward(*args, token_capacity=15)
    with pytest.raises(RuntimeError, match=r"token_capacity = -2 must be >= 0"):
        torch.ops.mok.fused_backward(*args, token_capacity=-2)


def _with(args, index, value):
    args = list(args)
    args[index] = value
    return args


@pytest.mark.parametrize("change,message", [
    (lambda a: _with(a, 11, [_empty(15, 128)]), r"dout\[0\] must be \[T, H\] \(x\[0\]'s shape\) = \[16, 128\]"),
    (lambda a: _with(a, 6, [_empty(40, 128)]), r"preact\[0\] must be \[rows, 2I\] with rows >= 540"),
    (lambda a: _with(a, 10, [_empty(31, 3, dtype=torch.int32)]), r"schedule_rows\[0\] must be \[rows, 3\]"),
    (lambda a: _with(a, 8, [_empty(4, dtype=torch.int64)]), r"expert_rows\[0\] must be Int"),
    (lambda a: _with(a, 1, [_empty(16, 2)]), r"weights\[0\] must be Float"),
    (lambda a: _with(a, 9, []), r"expert_offset must hold 1 tensors, one per rank"),
    (lambda a: _with(a, 12, [0, 0]), r"tuning must hold"),
    (lambda a: _with(a, 5, None), r"give both shared_w13 and shared_w2, or neither"),
])
def test_the_checks_name_what_is_wrong(change, message):
    args = _meta_args([16], 128, 64, 4, 2, 64)  # saved rows: 16 * 2 + 4 * 127 = 540
    with pytest.raises(RuntimeError, match=message):
        torch.ops.mok.fused_backward(*change(args))


def test_main_buffers_are_checked():
    H, I, E, k = 128, 64, 4, 2
    with pytest.raises(RuntimeError, match=r"main_w2 must be \[E, H, I\] = \[4, 128, 64\]"):
        torch.ops.mok.fused_backward(*_meta_args([16], H, I, E, k, 0), main_w2=_empty(4, 64, 128, dtype=torch.float32))
    with pytest.raises(RuntimeError, match=r"main_w13 must be Float"):
        torch.ops.mok.fused_backward(*_meta_args([16], H, I, E, k, 0), main_w13=_empty(4, 2 * I, H))
    with pytest.raises(RuntimeError, match="need a shared expert"):
        torch.ops.mok.fused_backward(*_meta_args([16], H, I, E, k, 0),
                                     main_shared_w2=_empty(H, 64, dtype=torch.float32))


def test_cpu_tensors_are_refused():
    args = _meta_args([16], 128, 64, 4, 2, 0)
    cpu = [[torch.zeros(t.shape, dtype=t.dtype) for t in a] if isinstance(a, list) and a and
           isinstance(a[0], torch.Tensor) else a for a in args]
    with pytest.raises(RuntimeError, match="mok runs on CUDA tensors"):
        torch.ops.mok.fused_backward(*cpu)


def test_the_schema_returns_no_lists():
    # An op that mutates arguments (the main buffers) is functionalized by
    # torch.compile only if it returns plain tensors.
    schema = torch.ops.mok.fused_backward.default._schema
    assert len(schema.returns) == 6 and all(str(r.type) == "Tensor" for r in schema.returns), schema
    assert torch.ops.mok.backward_cache_info()[1] >= 1


# ---- the autograd's choice (CPU) ---------------------------------------------------

def test_mok_backward_chooses_the_backward(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv("MOK_BACKWARD", raising=False)
    assert mok.autograd.backward_path(cuda) == "staged"  # auto: the faster on one GPU today
    assert mok.autograd.backward_path(cpu) == "staged"
    assert mok.autograd.backward_path(torch.device("meta")) == "staged"
    monkeypatch.setenv("MOK_BACKWARD", "staged")
    assert mok.autograd.backward_path(cuda) == "staged"
    monkeypatch.setenv("MOK_BACKWARD", "fused")
    assert mok.autograd.backward_path(cuda) == "fused"
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        mok.autograd.backward_path(cpu)
    monkeypatch.setenv("MOK_BACKWARD", "fast")
    with pytest.raises(ValueError, match="MOK_BACKWARD = 'fast'"):
        mok.autograd.backward_path(cuda)


# ---- the autograd's fused path on meta tensors (CPU) ----------------------------

@pytest.fixture
def fused_on_meta(monkeypatch):
    """The autograd takes the fused path for any device (meta tensors reach
    the op's fake kernel); returns the list of backward calls it made."""
    calls = []
    fused = mok.autograd._fused_kernel_backward

    def counted(ctx, douts):
        calls.append(ctx.world)
        return fused(ctx, douts)
    monkeypatch.setattr(mok.autograd, "backward_path", lambda device: "fused")
    monkeypatch.setattr(mok.autograd, "_fused_kernel_backward", counted)
    return calls


def _meta_layer(tokens, H=128, I=64, E=4, k=2, S=64, grad=True, device="meta"):
    R = len(tokens)
    x = [_empty(t, H, grad=grad, device=device) for t in tokens]
    ids = [_empty(t, k, dtype=torch.int32, device=device) for t in tokens]
    w = [_empty(t, k, dtype=torch.float32, grad=grad, device=device) for t in tokens]
    w13 = [_empty(E // R, 2 * I, H, grad=grad, device=device) for _ in tokens]
    w2 = [_empty(E // R, H, I, grad=grad, device=device) for _ in tokens]
    sw13 = _empty(2 * S, H, grad=grad, device=device) if S else None
    sw2 = _empty(H, S, grad=grad, device=device) if S else None
    return x, ids, w, w13, w2, sw13, sw2


@pytest.mark.parametrize("tokens,S", [([16], 64), ([10, 0], 64), ([7, 9, 3, 5], 0)])
def test_the_fused_path_gives_every_input_a_gradient_of_its_shape(fused_on_meta, tokens, S):
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer(tokens, S=S)
    outs = mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=4, save_activations=True)
    torch.cat(outs).float().sum().backward()
    assert fused_on_meta == [len(tokens)]
    for leaf in x + w + w13 + w2 + ([sw13, sw2] if S else []):
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype


def test_the_fused_path_returns_only_what_is_needed(fused_on_meta):
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer([16], grad=False)
    w2[0].requires_grad_(True)
    sw13.requires_grad_(True)
    out = mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=4, save_activations=True)[0]
    out.float().sum().backward()
    assert fused_on_meta == [1]
    assert w2[0].grad is not None and w2[0].grad.shape == w2[0].shape
    assert sw13.grad is not None and sw13.grad.shape == sw13.shape
    assert x[0].grad is None and w13[0].grad is None and sw2.grad is None


def test_the_fused_path_adds_to_main_grad_instead_of_returning_it(fused_on_meta):
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer([16])
    for p in (w13[0], sw2):
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="meta")
    out = mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=4, save_activations=True)[0]
    out.float().sum().backward()
    assert fused_on_meta == [1]
    assert w13[0].grad is None and sw2.grad is None
    assert w2[0].grad is not None and sw13.grad is not None and x[0].grad is not None


def test_mok_backward_staged_keeps_the_staged_path(monkeypatch):
    calls = []
    monkeypatch.setattr(mok.autograd, "_fused_kernel_backward", lambda ctx, douts: calls.append(1))
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer([16])
    out = mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=4, save_activations=True)[0]
    out.float().sum().backward()  # meta tensors: the staged path
    assert calls == [] and x[0].grad is not None


def test_aot_autograd_traces_the_fused_backward(fused_on_meta):
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = {}

    def backend(gm, example_inputs):
        def keep(kind):
            def compiler(graph, inputs):
                graphs[kind] = graph
                return make_boxed_func(graph.forward)
            return compiler
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("forward"), bw_compiler=keep("backward"))

    x, ids, w, w13, w2, sw13, sw2 = _meta_layer([16, 16])

    def step(*a):
        out = mok.fused_forward(*a, num_experts=4, save_activations=True)
        return torch.cat(out).float().square().sum()
    torch.compile(step, fullgraph=True, backend=backend)(x, ids, w, w13, w2, sw13, sw2).backward()
    for leaf in x + w + w13 + w2 + [sw13, sw2]:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape
    nodes = [n for n in graphs["backward"].graph.nodes if n.op == "call_function"]
    called = {str(n.target) for n in nodes} | {str(a) for n in nodes for a in n.args[:1]}
    assert "mok.fused_backward.default" in called, called
    assert not {"mok.swiglu_backward_mm.default", "mok.grouped_mm_kn.default"} & called, called


# ---- recompute mode on the CPU: the ops' fake kernels, the forward's choice, the autograd --

def _record_fused_backward(monkeypatch):
    """The autograd's fused backward calls: (world size, mode, tensors kept)
    each, mode "save" or "recompute" (the forward kept no pre-activations)."""
    calls = []
    fused = mok.autograd._fused_kernel_backward

    def recorded(ctx, douts):
        calls.append((ctx.world, "save" if ctx.keep_preact else "recompute", len(ctx.saved_tensors)))
        return fused(ctx, douts)
    monkeypatch.setattr(mok.autograd, "_fused_kernel_backward", recorded)
    return calls


@pytest.fixture
def fused_modes(monkeypatch):
    return _record_fused_backward(monkeypatch)


def _kept(R, mode):
    """What the autograd keeps for the fused backward: the inputs (5 lists and
    the shared pair), then the schedule (3 lists), after the pre-activations
    (2 lists) in save mode."""
    return 5 * R + 2 + (5 if mode == "save" else 3) * R


@pytest.mark.parametrize("tokens,S", [([16], 64), ([10, 0], 64), ([7, 9, 3, 5], 0)])
def test_the_training_op_without_preact_keeps_the_schedule_only(tokens, S):
    R, E = len(tokens), 4
    layer = _meta_layer(tokens, E=E, S=S, grad=False)
    old = torch.ops.mok.fused_forward_train(*layer, E, _tuning())  # the old call: keep_preact defaults to True
    assert all(len(group) == R for group in old)
    explicit = torch.ops.mok.fused_forward_train(*layer, E, _tuning(), False, True)
    lean = torch.ops.mok.fused_forward_train(*layer, E, _tuning(), False, keep_preact=False)
    assert len(lean) == 6 and lean[1] == [] and lean[2] == []
    for i in range(6):
        assert [(t.shape, t.dtype) for t in explicit[i]] == [(t.shape, t.dtype) for t in old[i]], i
    for i in (0, 3, 4, 5):  # out and the schedule: as with the pre-activations
        assert len(lean[i]) == R
        assert [(t.shape, t.dtype) for t in lean[i]] == [(t.shape, t.dtype) for t in old[i]], i


def test_the_training_ops_schema_keeps_its_old_calls():
    schema = torch.ops.mok.fused_forward_train.default._schema
    names = [a.name for a in schema.arguments]
    assert names[-4:] == ["tuning", "check_errors", "keep_preact", "token_capacity"], schema
    keep = schema.arguments[-2]
    assert str(keep.type) == "bool" and keep.default_value is True, schema
    assert schema.arguments[-3].default_value is False
    capacity = schema.arguments[-1]
    assert str(capacity.type) == "int" and capacity.default_value == 0, schema
    assert [r.name for r in schema.returns] == ["out", "preact", "shared_preact", "expert_rows", "expert_offset",
                                                "schedule_rows"], schema
    assert all(str(r.type) == "List[Tensor]" for r in schema.returns), schema
    # fused_backward's schema: recompute mode is its empty preact lists; the forward's
    # token_capacity comes last.
    backward = [a.name for a in torch.ops.mok.fused_backward.default._schema.arguments]
    assert backward[6:8] == ["preact", "shared_preact"] and backward[-2:] == ["bf16_weight_grads", "token_capacity"]


def _recompute(args):
    """fused_backward's arguments in recompute mode: empty preact lists."""
    return _with(_with(args, 6, []), 7, [])


@pytest.mark.parametrize("tokens,S", [([16], 64), ([16], 0), ([10, 0, 7, 5], 64)])
def test_the_fake_kernel_in_recompute_mode_gives_save_modes_outputs(tokens, S):
    H, I, E, k = 128, 64, 8, 3
    args = _meta_args(tokens, H, I, E, k, S)
    for options in ({}, {"bf16_weight_grads": True},
                    {"main_w2": _empty(E, H, I, dtype=torch.float32), "bf16_weight_grads": True}):
        save = torch.ops.mok.fused_backward(*args, **options)
        recompute = torch.ops.mok.fused_backward(*_recompute(args), **options)
        assert [(t.shape, t.dtype) for t in recompute] == [(t.shape, t.dtype) for t in save], options


def test_the_backward_op_takes_the_training_ops_outputs_without_preact():
    tokens, H, I, E, k, S = [10, 6], 128, 64, 4, 2, 64
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer(tokens, H=H, I=I, E=E, k=k, S=S, grad=False)
    kept = torch.ops.mok.fused_forward_train(x, ids, w, w13, w2, sw13, sw2, E, _tuning(), keep_preact=False)[1:]
    dx, dw, dw13, dw2, dsw13, dsw2 = torch.ops.mok.fused_backward(x, w, w13, w2, sw13, sw2, *kept, x, _tuning())
    assert dx.shape == (16, H) and dw.shape == (16, k)
    assert dw13.shape == (E, 2 * I, H) and dw2.shape == (E, H, I)
    assert dsw13.shape == (2 * S, H) and dsw2.shape == (H, S)


@pytest.mark.parametrize("change,message", [
    (lambda a: _with(a, 6, []), r"preact and shared_preact must both be empty lists \(recompute mode\) or both "
                                r"hold one tensor per rank \(save mode\); got 0 and 1"),
    (lambda a: _with(a, 7, []), r"must both be empty lists .*; got 1 and 0"),
    # Recompute mode skips the pre-activations' checks only.
    (lambda a: _with(_recompute(a), 10, [_empty(31, 3, dtype=torch.int32)]),
     r"schedule_rows\[0\] must be \[rows, 3\] with rows >= 540"),
    (lambda a: _with(_recompute(a), 11, [_empty(15, 128)]), r"dout\[0\] must be \[T, H\]"),
    (lambda a: _with(_recompute(a), 8, []), r"expert_rows must hold 1 tensors, one per rank"),
])
def test_recompute_mode_keeps_the_other_checks(change, message):
    args = _meta_args([16], 128, 64, 4, 2, 64)  # saved rows: 16 * 2 + 4 * 127 = 540
    with pytest.raises(RuntimeError, match=message):
        torch.ops.mok.fused_backward(*change(args))


class _OpLog(TorchDispatchMode):
    """The mok ops called below autograd, with their last argument."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith("mok."):
            self.ops.append((str(func), args[-1]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode,grad,expected", [
    ("fused", "x", "mok.fused_forward_train.default"),
    ("fused", "w2", "mok.fused_forward_train.default"),
    ("fused", "off", "mok.fused_forward.default"),      # grad mode off
    ("fused", None, "mok.fused_forward.default"),       # nothing requires grad
    (None, "x", "mok.fused_forward.default"),           # MOK_BACKWARD unset: auto, the staged backward
    ("auto", "x", "mok.fused_forward.default"),
    ("staged", "x", "mok.fused_forward.default"),
])
def test_recompute_mode_keeps_the_schedule_only_for_the_fused_backward(monkeypatch, mode, grad, expected):
    # Fake CUDA tensors (what torch.compile sees; no GPU needed) reach the
    # real backward_path and the ops' fake kernels.
    if mode is None:
        monkeypatch.delenv("MOK_BACKWARD", raising=False)
    else:
        monkeypatch.setenv("MOK_BACKWARD", mode)
    E = 4
    with FakeTensorMode():
        x, ids, w, w13, w2, sw13, sw2 = _meta_layer([10, 6], E=E, grad=False, device="cuda")
        if grad in ("x", "off"):
            x[0].requires_grad_()
        elif grad == "w2":
            w2[1].requires_grad_()
        with _OpLog() as log, torch.set_grad_enabled(grad != "off"):
            out = mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=E)
    assert [op for op, _ in log.ops] == [expected]
    assert [tuple(o.shape) for o in out] == [(10, 128), (6, 128)]
    if expected == "mok.fused_forward_train.default":
        assert log.ops[0][1] is False  # keep_preact
        ctx = out[0].grad_fn
        assert ctx.keep_preact is False and ctx.fused
        assert len(ctx.saved_tensors) == _kept(2, "recompute")


def test_recompute_mode_with_mok_backward_fused_refuses_cpu_tensors(monkeypatch):
    monkeypatch.setenv("MOK_BACKWARD", "fused")
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer([16], grad=False, device="cpu")
    x[0].requires_grad_()
    with pytest.raises(RuntimeError, match="MOK_BACKWARD=fused, but the fused backward cannot run here"):
        mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=4)
    with torch.no_grad():  # no backward to run: the plain op, which refuses CPU tensors itself
        with pytest.raises(RuntimeError, match="mok runs on CUDA tensors"):
            mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=4)


@pytest.mark.parametrize("tokens,S", [([16], 64), ([10, 0], 64), ([7, 9, 3, 5], 0)])
@pytest.mark.parametrize("save", [False, True])
def test_the_fused_path_in_either_mode_gives_every_input_a_gradient_of_its_shape(fused_on_meta, fused_modes,
                                                                                   tokens, S, save):
    R = len(tokens)
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer(tokens, S=S)
    outs = mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=4, save_activations=save)
    torch.cat(outs).float().sum().backward()
    mode = "save" if save else "recompute"
    assert fused_modes == [(R, mode, _kept(R, mode))]
    for leaf in x + w + w13 + w2 + ([sw13, sw2] if S else []):
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype


def test_the_fused_path_in_recompute_mode_returns_only_what_is_needed(fused_on_meta, fused_modes):
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer([16], grad=False)
    w2[0].requires_grad_(True)
    sw13.requires_grad_(True)
    sw2.main_grad = torch.zeros(sw2.shape, dtype=torch.float32, device="meta")
    sw2.requires_grad_(True)
    mok.fused_forward(x, ids, w, w13, w2, sw13, sw2, num_experts=4)[0].float().sum().backward()
    assert fused_modes == [(1, "recompute", _kept(1, "recompute"))]
    assert w2[0].grad is not None and w2[0].grad.shape == w2[0].shape
    assert sw13.grad is not None and sw13.grad.shape == sw13.shape
    assert x[0].grad is None and w13[0].grad is None and sw2.grad is None  # sw2's went to its main_grad


def test_the_training_op_without_preact_falls_back_to_the_staged_recompute(monkeypatch):
    # Called directly with keep_preact=False while the backward is the staged
    # one: nothing was kept to read, so the staged backward recomputes.
    monkeypatch.setenv("MOK_BACKWARD", "staged")
    calls = _record_fused_backward(monkeypatch)
    x, ids, w, w13, w2, sw13, sw2 = _meta_layer([10, 6])
    out = torch.ops.mok.fused_forward_train(x, ids, w, w13, w2, sw13, sw2, 4, _tuning(), keep_preact=False)[0]
    torch.cat(out).float().sum().backward()
    assert calls == []
    for leaf in x + w + w13 + w2 + [sw13, sw2]:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape


def test_aot_autograd_traces_the_fused_backward_in_recompute_mode(fused_on_meta, fused_modes):
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = {}

    def backend(gm, example_inputs):
        def keep(kind):
            def compiler(graph, inputs):
                graphs[kind] = graph
                return make_boxed_func(graph.forward)
            return compiler
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("forward"), bw_compiler=keep("backward"))

    x, ids, w, w13, w2, sw13, sw2 = _meta_layer([16, 16])

    def step(*a):
        out = mok.fused_forward(*a, num_experts=4)  # recompute mode
        return torch.cat(out).float().square().sum()
    torch.compile(step, fullgraph=True, backend=backend)(x, ids, w, w13, w2, sw13, sw2).backward()
    for leaf in x + w + w13 + w2 + [sw13, sw2]:
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape
    assert [mode for _, mode, _ in fused_modes] == ["recompute"]

    def calls(graph):
        nodes = [n for n in graph.graph.nodes if n.op == "call_function"]
        return nodes, {str(n.target) for n in nodes} | {str(a) for n in nodes for a in n.args[:1]}
    forward_nodes, forward = calls(graphs["forward"])
    train = [n for n in forward_nodes if str(n.target) == "mok.fused_forward_train.default"]
    assert len(train) == 1 and "mok.fused_forward.default" not in forward, forward
    assert train[0].args[10:] == (False,) or train[0].kwargs.get("keep_preact") is False, train[0]
    _, backward = calls(graphs["backward"])
    assert "mok.fused_backward.default" in backward, backward
    assert not {"mok.swiglu_backward_mm.default", "mok.grouped_mm_kn.default", "mok.grouped_mm.default"} & backward


# ---- on a GPU: against the staged backward ------------------------------------

SHAPES = {
    "shared": dict(T=256, H=256, I=128, E=8, k=2, S=128),
    "top-3, no shared": dict(T=200, H=128, I=192, E=8, k=3, S=0),
}


def _splits(T):
    """Token counts of worlds of 1, 2 and 4 ranks: uneven, one rank without tokens."""
    return {1: [T], 2: [T * 3 // 8, T - T * 3 // 8], 4: [T // 3, 0, T // 4, T - T // 3 - T // 4]}


def _world(layer, tokens):
    """The layer split into per-rank lists (contiguous copies) for `tokens`."""
    x, ids, w, w13, w2, sw13, sw2 = layer
    R = len(tokens)
    El = w13.shape[0] // R

    def rows(t):
        return [p.contiguous() for p in t.split(tokens)]

    def experts(t):
        return [t[r * El:(r + 1) * El].contiguous() for r in range(R)]
    return rows(x), rows(ids), rows(w), experts(w13), experts(w2), sw13, sw2


def _dout(T, H, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(T, H, generator=g) * 2 - 1).bfloat16().to(DEVICE)


def _problem(shape, R, seed=31):
    s = SHAPES[shape]
    tokens = _splits(s["T"])[R]
    layer = random_global_layer(s["T"], s["H"], s["I"], s["E"], s["k"], s["S"], seed=seed, device=DEVICE)
    world = _world(layer, tokens)
    kept = torch.ops.mok.fused_forward_train(*world, s["E"], _tuning(), True)[1:]
    dout = _dout(s["T"], s["H"], seed + 1)
    return s, tokens, layer, world, kept, dout


def _fused(world, kept, dout, tokens, **main):
    xs, _, ws, w13s, w2s, sw13, sw2 = world
    douts = [p.contiguous() for p in dout.split(tokens)]
    return torch.ops.mok.fused_backward(xs, ws, w13s, w2s, sw13, sw2, *kept, douts, _tuning(), check_errors=True,
                                        **main)


def _staged(layer, kept, dout, tokens, main_grads=MainGrads()):
    x, ids, w, w13, w2, sw13, sw2 = layer
    return staged_backward.layer_backward(dout, x, ids, w, w13, w2, sw13, sw2, saved=SavedForward(*kept),
                                          tokens_per_rank=tokens, main_grads=main_grads)


def _staged_shares(world, kept, dout, tokens):
    """The shared expert's weight gradients of each rank's own tokens, by the
    staged backward: [(dW13, dW2)] in rank order."""
    xs, ids, ws, w13s, w2s, sw13, sw2 = world
    only_shared = Needs(x=False, weights=False, w13=False, w2=False)
    shares = []
    for r, d in enumerate(dout.split(tokens)):
        g = staged_backward.layer_backward(d.contiguous(), xs[r], ids[r], ws[r], w13s[r], w2s[r], sw13, sw2,
                                           needs=only_shared, saved=SavedForward(None, [kept[1][r]], None, None, None),
                                           tokens_per_rank=[tokens[r]])
        shares.append((g.dshared_w13, g.dshared_w2))
    return shares


def _in_rank_order(parts, start=None):
    """start + parts[0] + parts[1] + ..., fp32 additions in that order (the op's)."""
    total = parts[0] if start is None else start + parts[0]
    for p in parts[1:]:
        total = total + p
    return total


@needs_gpu
@pytest.mark.parametrize("R", [1, 2, 4])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_fused_backward_gives_the_staged_backwards_bits(shape, R):
    s, tokens, layer, world, kept, dout = _problem(shape, R)
    got = _fused(world, kept, dout, tokens)
    want = _staged(layer, kept, dout, tokens)
    for name, a, b in zip(("dx", "dweights", "dw13", "dw2"), got[:4], want[:4]):
        assert _same(a, b), f"{name}: differs from the staged backward by {(a.float() - b.float()).abs().max()}"
    if not s["S"]:
        assert got[4].shape == got[5].shape == (0,)
        return
    shares = _staged_shares(world, kept, dout, tokens)
    for i, name in ((4, "dshared_w13"), (5, "dshared_w2")):
        assert _same(got[i], _in_rank_order([p[i - 4] for p in shares])), name
        if R == 1:
            assert _same(got[i], want[i]), name
        else:  # one sum over every token: the same to fp32 rounding
            assert _rel(got[i], want[i]) < 1e-5, name
    # Repeatable: the same bits from the cached object.
    again = _fused(world, kept, dout, tokens)
    assert all(_same(a, b) for a, b in zip(got, again))


@needs_gpu
@pytest.mark.parametrize("R", [1, 2])
def test_main_buffers_get_the_gradients_added_once(R):
    s, tokens, layer, world, kept, dout = _problem("shared", R, seed=37)
    g = torch.Generator(device=DEVICE).manual_seed(5)
    E, I, H, S = s["E"], s["I"], s["H"], s["S"]
    start = [torch.randn(*shape, device=DEVICE, generator=g) * 1e-2
             for shape in ((E, 2 * I, H), (E, H, I), (2 * S, H), (H, S))]
    fresh = _fused(world, kept, dout, tokens)
    main = [t.clone() for t in start]
    got = _fused(world, kept, dout, tokens, main_w13=main[0], main_w2=main[1], main_shared_w13=main[2],
                 main_shared_w2=main[3])
    assert all(t.shape == (0,) for t in got[2:])
    assert _same(got[0], fresh[0]) and _same(got[1], fresh[1])
    # The routed ones: one addition to the old value (the staged backward's
    # weight_grad_mm_acc_ gives the same bits).
    staged_main = [t.clone() for t in start]
    _staged(layer, kept, dout, tokens, MainGrads(*staged_main))
    assert _same(main[0], start[0] + fresh[2]) and _same(main[0], staged_main[0])
    assert _same(main[1], start[1] + fresh[3]) and _same(main[1], staged_main[1])
    # The shared ones: each rank's share added in rank order.
    shares = _staged_shares(world, kept, dout, tokens)
    for i in (2, 3):
        assert _same(main[i], _in_rank_order([p[i - 2] for p in shares], start[i]))
        if R == 1:
            assert _same(main[i], staged_main[i])


@needs_gpu
def test_with_some_main_buffers_the_others_are_returned():
    _, tokens, _, world, kept, dout = _problem("shared", 1, seed=41)
    fresh = _fused(world, kept, dout, tokens)
    main13 = torch.zeros_like(fresh[2])
    got = _fused(world, kept, dout, tokens, main_w13=main13)
    assert got[2].shape == (0,) and _same(main13, fresh[2])
    for a, b in zip(got[3:], fresh[3:]):  # accumulated onto zeros: the same values
        assert _same(a, b)


def _real_rows(expert_rows, expert_offset):
    """Which schedule rows hold a (token, slot): each expert's first
    expert_rows[e] rows from expert_offset[e]; padding and the tail hold no data."""
    real = torch.zeros(int(expert_offset[-1]), dtype=torch.bool)
    for e in range(expert_rows.numel()):
        first = int(expert_offset[e])
        real[first:first + int(expert_rows[e])] = True
    return real


@needs_gpu
@pytest.mark.parametrize("R", [1, 2])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_op_with_empty_preact_lists_gives_save_modes_bits(shape, R):
    # Recompute mode of the op: the training op's keep_preact=False keeps the
    # same out and schedule without the pre-activations, and the backward with
    # empty preact lists recomputes gate/up in the kernel: save mode's bits.
    s, tokens, layer, world, kept, dout = _problem(shape, R, seed=53)
    lean = torch.ops.mok.fused_forward_train(*world, s["E"], _tuning(), True, keep_preact=False)
    assert lean[1] == [] and lean[2] == []
    save_out = torch.ops.mok.fused_forward_train(*world, s["E"], _tuning(), True)[0]
    for r in range(R):
        assert _same(lean[0][r], save_out[r]), f"out[{r}]"
        assert _same(lean[3][r], kept[2][r]) and _same(lean[4][r], kept[3][r]), f"expert_rows/offset[{r}]"
        real = _real_rows(kept[2][r].cpu(), kept[3][r].cpu())
        assert _same(lean[5][r][:real.numel()][real.to(DEVICE)], kept[4][r][:real.numel()][real.to(DEVICE)]), r
    save = _fused(world, kept, dout, tokens)
    recompute = _fused(world, lean[1:], dout, tokens)
    for name, a, b in zip(NAMES, recompute, save):
        assert _same(a, b), f"{name}: recompute mode differs from save mode by {(a.float() - b.float()).abs().max()}"
    # Save mode's own schedule, without its pre-activations: the same.
    again = _fused(world, [[], []] + list(kept[2:]), dout, tokens)
    assert all(_same(a, b) for a, b in zip(again, save))
    # Both modes' objects of this layer are in the cache (two entries).
    assert torch.ops.mok.backward_cache_info()[0] >= 2
    # The kernel's bf16 weight gradients (R = 1, or no shared expert) and main buffers: the same too.
    bf16_save = _fused(world, kept, dout, tokens, bf16_weight_grads=True)
    bf16_recompute = _fused(world, lean[1:], dout, tokens, bf16_weight_grads=True)
    assert all(_same(a, b) for a, b in zip(bf16_recompute, bf16_save))
    mains = {}
    for mode, k in (("save", kept), ("recompute", lean[1:])):
        g = torch.Generator(device=DEVICE).manual_seed(59)
        mains[mode] = [torch.randn(*t.shape, device=DEVICE, generator=g) for t in save[2:] if t.numel()]
        named = dict(zip(("main_w13", "main_w2", "main_shared_w13", "main_shared_w2"), mains[mode]))
        _fused(world, k, dout, tokens, **named)
    assert all(_same(a, b) for a, b in zip(mains["recompute"], mains["save"]))


# ---- on a GPU: the autograd -------------------------------------------------

NAMES = ("dx", "dweights", "dw13", "dw2", "dshared_w13", "dshared_w2")


def _autograd_grads(shape, R, monkeypatch, mode, seed=43, save=True):
    monkeypatch.setenv("MOK_BACKWARD", mode)
    s = SHAPES[shape]
    tokens = _splits(s["T"])[R]
    layer = random_global_layer(s["T"], s["H"], s["I"], s["E"], s["k"], s["S"], seed=seed, device=DEVICE)
    xs, ids, ws, w13s, w2s, sw13, sw2 = _world(layer, tokens)
    for t in xs + ws + w13s + w2s:
        t.requires_grad_()
    shared = [t.clone().requires_grad_() for t in (sw13, sw2)] if sw13 is not None else [None, None]
    outs = mok.fused_forward(xs, ids, ws, w13s, w2s, *shared, num_experts=s["E"], check_errors=True,
                             save_activations=save)
    torch.cat(outs).backward(_dout(s["T"], s["H"], seed + 1))
    for t in xs + ws + w13s + w2s + [t for t in shared if t is not None]:
        assert t.grad is not None and t.grad.dtype == t.dtype and t.grad.shape == t.shape
    return tuple(torch.cat([t.grad for t in group]) for group in (xs, ws, w13s, w2s)) + tuple(
        None if t is None else t.grad for t in shared)


@needs_gpu
@pytest.mark.parametrize("R", [1, 2, 4])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_save_mode_autograd_runs_the_fused_backward_with_the_staged_bits(shape, R, monkeypatch, fused_calls):
    fused = _autograd_grads(shape, R, monkeypatch, "fused")
    assert fused_calls == [R]
    staged = _autograd_grads(shape, R, monkeypatch, "staged")
    assert fused_calls == [R], "MOK_BACKWARD=staged ran the fused backward"
    for name, a, b in zip(NAMES, fused, staged):
        if b is None:
            assert a is None, name
        elif name.startswith("dshared") and R > 1:  # the ranks' shares, summed: fp32 rounding apart
            assert _rel(a, b) < 5e-3, name
        else:
            assert _same(a, b), name


@pytest.fixture
def fused_calls(monkeypatch):
    """The fused backward calls of the autograd (the world size of each)."""
    calls = []
    fused = mok.autograd._fused_kernel_backward

    def counted(ctx, douts):
        calls.append(ctx.world)
        return fused(ctx, douts)
    monkeypatch.setattr(mok.autograd, "_fused_kernel_backward", counted)
    return calls


@needs_gpu
def test_the_module_in_save_mode_accumulates_main_grads_as_the_staged_backward(monkeypatch, fused_calls):
    from mok.nn import MoE
    results = {}
    for mode in ("fused", "staged"):
        monkeypatch.setenv("MOK_BACKWARD", mode)
        torch.manual_seed(0)
        moe = MoE(128, 64, 8, 2, shared_intermediate=64, device=DEVICE, save_activations=True, fp32_main_grad=True)
        x = (torch.rand(2, 50, 128, generator=torch.Generator().manual_seed(1)) * 2 - 1).bfloat16().to(DEVICE)
        x.requires_grad_()
        for step in range(2):  # two micro-batches into the same main_grad
            moe(x * (1 + step)).float().square().sum().backward()
        experts = (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2)
        assert all(p.grad is None for p in experts)
        results[mode] = [p.main_grad for p in experts] + [moe.router.weight.grad, x.grad]
    assert fused_calls == [1, 1]
    for a, b in zip(results["fused"], results["staged"]):
        assert _same(a, b)


@needs_gpu
def test_the_autograd_returns_only_what_is_needed(monkeypatch, fused_calls):
    s = SHAPES["shared"]
    layer = random_global_layer(s["T"], s["H"], s["I"], s["E"], s["k"], s["S"], seed=47, device=DEVICE)
    x, ids, w, w13, w2, sw13, sw2 = layer
    grads = {}
    for mode in ("fused", "staged"):
        monkeypatch.setenv("MOK_BACKWARD", mode)
        leaf = w2.clone().requires_grad_()
        out = mok.fused_forward([x], [ids], [w], [w13], [leaf], sw13, sw2, num_experts=s["E"],
                                save_activations=True)[0]
        out.backward(_dout(s["T"], s["H"], 48))
        grads[mode] = leaf.grad
    assert fused_calls == [1]
    assert _same(grads["fused"], grads["staged"])


@needs_gpu
@pytest.mark.parametrize("R", [1, 2])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_recompute_mode_autograd_runs_the_fused_backward_with_save_modes_bits(shape, R, monkeypatch, fused_modes):
    # MOK_BACKWARD=fused, save_activations=False: the forward keeps the
    # schedule only and the fused backward recomputes gate/up. The same bits
    # as the fused backward in save mode, and as the staged backward in
    # recompute mode (but the shared expert's weight gradients at R > 1: the
    # fused backward adds the ranks' shares, fp32 rounding apart).
    recompute = _autograd_grads(shape, R, monkeypatch, "fused", save=False)
    assert fused_modes == [(R, "recompute", _kept(R, "recompute"))]
    save = _autograd_grads(shape, R, monkeypatch, "fused", save=True)
    assert fused_modes[1:] == [(R, "save", _kept(R, "save"))]
    staged = _autograd_grads(shape, R, monkeypatch, "staged", save=False)
    assert len(fused_modes) == 2, "MOK_BACKWARD=staged ran the fused backward"
    for name, a, b, c in zip(NAMES, recompute, save, staged):
        if b is None:
            assert a is None and c is None, name
            continue
        assert _same(a, b), f"{name}: recompute mode differs from save mode"
        if name.startswith("dshared") and R > 1:
            assert _rel(a, c) < 5e-3, name
        else:
            assert _same(a, c), f"{name}: differs from the staged backward in recompute mode"


@needs_gpu
def test_the_module_in_recompute_mode_accumulates_main_grads_as_the_staged_backward(monkeypatch, fused_modes):
    from mok.nn import MoE
    results = {}
    for mode in ("fused", "staged"):
        monkeypatch.setenv("MOK_BACKWARD", mode)
        torch.manual_seed(0)
        moe = MoE(128, 64, 8, 2, shared_intermediate=64, device=DEVICE, fp32_main_grad=True)
        x = (torch.rand(2, 50, 128, generator=torch.Generator().manual_seed(1)) * 2 - 1).bfloat16().to(DEVICE)
        x.requires_grad_()
        for step in range(2):  # two micro-batches into the same main_grad
            moe(x * (1 + step)).float().square().sum().backward()
        experts = (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2)
        assert all(p.grad is None for p in experts)
        results[mode] = [p.main_grad for p in experts] + [moe.router.weight.grad, x.grad]
    assert [mode for _, mode, _ in fused_modes] == ["recompute", "recompute"]
    for a, b in zip(results["fused"], results["staged"]):
        assert _same(a, b)
