"""Fake (meta) kernels and torch.compile, on the CPU: every op computes its
output shapes from its input shapes alone, so torch.compile(fullgraph=True)
traces a function that calls them with no graph break, and AOTAutograd traces
the staged backward. Meta tensors stand in for CUDA ones (the Meta kernels run
the same argument checks)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mok
from mok.staged_backward import has_kernel_ops

H, I, E, K = 128, 64, 4, 2


def _layer(T, world=1, device="meta"):
    t, el = T // world, E // world
    xs = [torch.empty(t, H, dtype=torch.bfloat16, device=device) for _ in range(world)]
    ids = [torch.empty(t, K, dtype=torch.int32, device=device) for _ in range(world)]
    ws = [torch.empty(t, K, dtype=torch.float32, device=device) for _ in range(world)]
    w13 = [torch.empty(el, 2 * I, H, dtype=torch.bfloat16, device=device) for _ in range(world)]
    w2 = [torch.empty(el, H, I, dtype=torch.bfloat16, device=device) for _ in range(world)]
    sw13 = torch.empty(2 * I, H, dtype=torch.bfloat16, device=device)
    sw2 = torch.empty(H, I, dtype=torch.bfloat16, device=device)
    return xs, ids, ws, w13, w2, sw13, sw2


def test_fake_cuda_tensors_get_outputs_of_the_right_shape():
    # What torch.compile sees: fake tensors on a CUDA device (no GPU needed).
    with FakeTensorMode():
        xs, ids, ws, w13, w2, sw13, sw2 = _layer(64, world=2, device="cuda")
        xs = [torch.empty(n, H, dtype=torch.bfloat16, device="cuda") for n in (40, 24)]
        ids = [torch.empty(n, K, dtype=torch.int32, device="cuda") for n in (40, 24)]
        ws = [torch.empty(n, K, dtype=torch.float32, device="cuda") for n in (40, 24)]
        out = mok.fused_forward(xs, ids, ws, w13, w2, sw13, sw2, num_experts=E)
        assert [(tuple(o.shape), o.device.type) for o in out] == [((40, H), "cuda"), ((24, H), "cuda")]


def test_fake_tensors_reach_the_argument_checks():
    with FakeTensorMode():
        xs, ids, ws, w13, w2, sw13, sw2 = _layer(64, device="cuda")
        with pytest.raises(RuntimeError, match=r"w13\[0\] must be \[E/R, 2I, H\] = \[4, 128, 128\] "
                                               r"\(got \[4, 64, 128\]\)"):
            mok.fused_forward(xs, ids, ws, [w13[0][:, :64].contiguous()], w2, sw13, sw2, num_experts=E)


def _moe(xs, ids, ws, w13, w2, sw13, sw2):
    out = mok.fused_forward(xs, ids, ws, w13, w2, sw13, sw2, num_experts=E, ring_slots=2)
    return torch.cat(out) * 2


def test_compile_fullgraph_traces_fused_forward_without_a_graph_break():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(_moe, fullgraph=True, backend=backend)
    out = compiled(*_layer(64))
    assert out.shape == (64, H) and out.dtype == torch.bfloat16
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("mok.fused_forward" in t for t in targets), targets


def test_explain_finds_no_graph_break():
    explanation = torch._dynamo.explain(_moe)(*_layer(32, world=2))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compile_with_aot_autograd_traces_the_grouped_gemm():
    def gemm(a, b, off, rows):
        return mok.grouped_mm_swiglu(a, b, off, rows) + 1

    a = torch.empty(64, 128, dtype=torch.bfloat16, device="meta")
    b = torch.empty(2, 192, 128, dtype=torch.bfloat16, device="meta")
    off = torch.empty(3, dtype=torch.int32, device="meta")
    rows = torch.empty(2, dtype=torch.int32, device="meta")
    out = torch.compile(gemm, fullgraph=True, backend="aot_eager")(a, b, off, rows)
    assert out.shape == (64, 96)


def _capturing_backend(graphs: dict):
    """A torch.compile backend running AOTAutograd that keeps the forward and
    backward graphs it compiles in graphs["forward"] / graphs["backward"]."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    def backend(gm, example_inputs):
        def keep(kind):
            def compiler(graph, inputs):
                graphs[kind] = graph
                return make_boxed_func(graph.forward)
            return compiler
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    return backend


@pytest.mark.skipif(not has_kernel_ops(), reason="libmok_torch.so predates the backward ops")
def test_aot_autograd_traces_the_staged_backward_into_one_graph():
    graphs = {}
    backend = _capturing_backend(graphs)

    xs, ids, ws, w13, w2, sw13, sw2 = _layer(32, world=2)
    leaves = xs + ws + w13 + w2 + [sw13, sw2]
    for t in leaves:
        t.requires_grad_()
    loss = torch.compile(lambda *a: _moe(*a).float().square().sum(), fullgraph=True, backend=backend)(
        xs, ids, ws, w13, w2, sw13, sw2)
    loss.backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in leaves)
    targets = {str(n.target) for n in graphs["backward"].graph.nodes if n.op == "call_function"}
    assert {"mok.grouped_mm.default", "mok.swiglu_backward_mm.default", "mok.grouped_mm_kn.default",
            "mok.weight_grad_mm.default"} <= targets, targets


def test_the_schemas_are_static():
    # No op may return a list whose length depends on data (the old error
    # convention returned [] on failure).
    for name in ("fused_forward", "grouped_mm", "grouped_mm_swiglu", "process_world_run"):
        schema = getattr(torch.ops.mok, name).default._schema
        assert len(schema.returns) == 1, (name, schema)


@pytest.mark.skipif(not hasattr(torch.ops.mok, "fused_forward_train"), reason="libmok_torch.so predates save mode")
def test_aot_autograd_traces_save_mode_without_the_recompute():
    graphs = {}
    backend = _capturing_backend(graphs)

    xs, ids, ws, w13, w2, sw13, sw2 = _layer(32, world=2)
    leaves = xs + ws + w13 + w2 + [sw13, sw2]
    for t in leaves:
        t.requires_grad_()

    def step(*a):
        out = mok.fused_forward(*a, num_experts=E, save_activations=True)
        return torch.cat(out).float().square().sum()
    loss = torch.compile(step, fullgraph=True, backend=backend)(xs, ids, ws, w13, w2, sw13, sw2)
    loss.backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in leaves)
    forward_targets = {str(n.target) for n in graphs["forward"].graph.nodes if n.op == "call_function"}
    backward_targets = {str(n.target) for n in graphs["backward"].graph.nodes if n.op == "call_function"}
    assert "mok.fused_forward_train.default" in forward_targets, forward_targets
    # Save mode: the backward reads the kept gate/up; no grouped_mm recomputes it.
    assert "mok.grouped_mm.default" not in backward_targets, backward_targets
    assert {"mok.swiglu_backward_mm.default", "mok.grouped_mm_kn.default", "mok.weight_grad_mm.default",
            "mok.row_combine.default", "mok.scatter_rows.default"} <= backward_targets, backward_targets
