"""mok.nn: the router's arithmetic against plain loops (CPU), the layer's
parameters and shapes, torch.compile of a model using it (meta tensors), its
backward's plumbing (meta tensors), and on a Hopper GPU its output against an fp32 torch
computation of the same layer."""

import math

import pytest
import torch

import mok
from conftest import has_hopper
from mok.nn import MoE, TopKRouter
from mok.staged_backward import has_kernel_ops
from mok.testing import reference_forward


def _loop_router(x, weight, top_k, scoring, n_group=1, topk_group=1, bias=None, norm=True, scale=1.0,
                 group_score="top2_sum"):
    """The router written out token by token, expert by expert."""
    ids_all, w_all = [], []
    E = weight.shape[0]
    for t in range(x.shape[0]):
        logits = [float(sum(float(x[t, h]) * float(weight[e, h]) for h in range(x.shape[1]))) for e in range(E)]
        if scoring == "softmax":
            m = max(logits)
            ex = [math.exp(v - m) for v in logits]
            scores = [v / sum(ex) for v in ex]
        else:
            scores = [1.0 / (1.0 + math.exp(-v)) for v in logits]
        choice = [s + (float(bias[e]) if bias is not None else 0.0) for e, s in enumerate(scores)]
        eligible = set(range(E))
        if n_group > 1:
            size = E // n_group
            best = 1 if group_score == "max" else 2
            scores_of_group = [sum(sorted(choice[g * size:(g + 1) * size], reverse=True)[:best]) for g in range(n_group)]
            kept = sorted(range(n_group), key=lambda g: -scores_of_group[g])[:topk_group]
            eligible = {e for g in kept for e in range(g * size, (g + 1) * size)}
        ids = sorted(eligible, key=lambda e: -choice[e])[:top_k]
        w = [scores[e] for e in ids]
        if norm:
            w = [v / sum(w) for v in w]
        ids_all.append(ids)
        w_all.append([v * scale for v in w])
    return torch.tensor(ids_all, dtype=torch.int32), torch.tensor(w_all, dtype=torch.float32)


def test_softmax_router_matches_the_loops():
    torch.manual_seed(0)
    router = TopKRouter(16, 8, 2)
    x = torch.randn(5, 16)
    ids, w = router(x)
    want_ids, want_w = _loop_router(x, router.weight.detach(), 2, "softmax")
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.sum(-1), torch.ones(5), rtol=1e-6, atol=1e-6)


def test_sigmoid_router_with_groups_and_a_selection_only_bias_matches_the_loops():
    torch.manual_seed(1)
    router = TopKRouter(16, 16, 4, scoring="sigmoid", n_group=4, topk_group=2, expert_bias=True,
                        routed_scaling_factor=2.5)
    # A bias that pushes choices negative, so masking with 0 would be wrong.
    router.e_score_correction_bias.copy_(torch.linspace(-3.0, 0.5, 16))
    x = torch.randn(7, 16)
    ids, w = router(x)
    want_ids, want_w = _loop_router(x, router.weight.detach(), 4, "sigmoid", 4, 2,
                                    router.e_score_correction_bias, True, 2.5)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)
    # Every chosen expert lies in one of the token's two kept groups.
    assert all(len({int(e) // 4 for e in row}) <= 2 for row in ids)


def test_group_limited_softmax_router_with_the_best_expert_per_group_matches_the_loops():
    torch.manual_seed(4)
    router = TopKRouter(16, 12, 3, n_group=3, topk_group=2, group_score="max", norm_topk_prob=False)
    x = torch.randn(6, 16)
    ids, w = router(x)
    want_ids, want_w = _loop_router(x, router.weight.detach(), 3, "softmax", 3, 2, None, False, 1.0, "max")
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)


def test_bias_changes_the_choice_but_not_the_weights():
    torch.manual_seed(2)
    router = TopKRouter(8, 4, 1, scoring="sigmoid", expert_bias=True, norm_topk_prob=False)
    x = torch.randn(3, 8)
    router.e_score_correction_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 10.0]))
    ids, w = router(x)
    assert ids.flatten().tolist() == [3, 3, 3]
    torch.testing.assert_close(w.flatten(), torch.sigmoid(x @ router.weight.detach().t())[:, 3])


@pytest.mark.parametrize("kwargs, message", [
    (dict(scoring="tanh"), "scoring"),
    (dict(n_group=3), "n_group"),
    (dict(n_group=4, topk_group=5), "topk_group"),
    (dict(n_group=4, topk_group=1), "fewer than top_k"),
    (dict(n_group=2, group_score="mean"), "group_score"),
])
def test_router_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TopKRouter(16, 8, 4, **kwargs)


def test_layer_parameters_are_in_the_kernels_layout():
    moe = MoE(128, 64, 4, 2, shared_intermediate=64, device="meta")
    assert moe.w13.shape == (4, 128, 128) and moe.w2.shape == (4, 128, 64)
    assert moe.shared_w13.shape == (128, 128) and moe.shared_w2.shape == (128, 64)
    assert moe.router.weight.shape == (4, 128)
    assert all(p.dtype == torch.bfloat16 for p in (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2))
    assert MoE(128, 64, 4, 2, device="meta").shared_w13 is None
    with pytest.raises(ValueError, match="intermediate = 96"):
        MoE(128, 96, 4, 2, device="meta")
    with pytest.raises(ValueError, match="dtype"):
        MoE(128, 64, 4, 2, device="meta", dtype=torch.float16)


def test_forward_keeps_the_input_shape_and_compiles_without_a_graph_break():
    moe = MoE(128, 64, 4, 2, shared_intermediate=64, device="meta", ring_slots=2)
    x = torch.empty(2, 16, 128, dtype=torch.bfloat16, device="meta")
    out = moe(x)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(moe, fullgraph=True, backend=backend)
    assert compiled(x).shape == x.shape
    assert len(graphs) == 1


@pytest.mark.skipif(not has_kernel_ops(), reason="libmok_torch.so predates the backward ops")
def test_backward_reaches_every_parameter_and_the_input():
    # Meta tensors: the staged backward's shapes and plumbing (values: test_backward.py on a GPU).
    moe = MoE(128, 64, 4, 2, shared_intermediate=64, device="meta")
    x = torch.empty(8, 128, dtype=torch.bfloat16, device="meta", requires_grad=True)
    moe(x).float().sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for name, p in moe.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype, name


@pytest.mark.skipif(not has_hopper(), reason="needs a Hopper (sm_90) GPU")
def test_layer_matches_an_fp32_torch_computation_on_the_gpu():
    torch.manual_seed(3)
    H, I, E, K, S = 256, 128, 8, 2, 128
    moe = MoE(H, I, E, K, shared_intermediate=S, device="cuda")
    x = (torch.rand(3, 50, H, device="cuda") * 2 - 1).bfloat16()
    with torch.no_grad():
        out = moe(x)
        tokens = x.reshape(-1, H)
        ids, w = moe.router(tokens)
        want = reference_forward(tokens, ids, w, moe.w13, moe.w2, moe.shared_w13, moe.shared_w2)
    err = (out.reshape(-1, H).float() - want).norm() / want.norm()
    assert err < 1e-2, err
    # Bitwise repeatable.
    with torch.no_grad():
        assert torch.equal(moe(x), out)


def test_max_tokens_is_checked_before_any_work():
    moe = MoE(128, 64, 4, 2, device="meta", max_tokens=32)
    assert moe(torch.empty(2, 16, 128, dtype=torch.bfloat16, device="meta")).shape == (2, 16, 128)
    with pytest.raises(ValueError, match="33 tokens, more than this layer's max_tokens = 32"):
        moe(torch.empty(33, 128, dtype=torch.bfloat16, device="meta"))
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="max_tokens"):
            MoE(128, 64, 4, 2, device="meta", max_tokens=bad)


_MAX_TOKENS_CHILD = """
import os, sys, torch, mok
from mok.nn import MoE
assert torch.ops.mok.forward_cache_info()[0] == 0  # a fresh process: an empty op cache
torch.manual_seed(5)
H, I, E, K, S = 256, 128, 8, 2, 128
exact = MoE(H, I, E, K, shared_intermediate=S, device="cuda")
capped = MoE(H, I, E, K, shared_intermediate=S, device="cuda", max_tokens=300)
capped.load_state_dict(exact.state_dict())
# Save mode: the training op's schedule and pre-activations come sized for
# the capacity, and the backward must read only the call's rows of them.
saving = MoE(H, I, E, K, shared_intermediate=S, device="cuda", max_tokens=300, save_activations=True)
saving.load_state_dict(exact.state_dict())
NAMES = ("out", "x.grad", "w13.grad", "w2.grad", "shared_w13.grad", "shared_w2.grad", "router.grad")

def run(layer, x):
    for p in layer.parameters():
        p.grad = None
    x = x.clone().requires_grad_(True)
    out = layer(x)
    out.float().pow(2).sum().backward()
    return [t.detach().clone() for t in (out, x.grad, layer.w13.grad, layer.w2.grad, layer.shared_w13.grad,
                                         layer.shared_w2.grad, layer.router.weight.grad)]

def same(a, b):
    if a.dtype == torch.bfloat16:
        a, b = a.view(torch.int16), b.view(torch.int16)
    return torch.equal(a, b)

xs = [(torch.rand(n, H, device="cuda") * 2 - 1).bfloat16() for n in (300, 77, 1, 256, 129)]
got = []
for x in xs:
    got.append(run(capped, x))
    held = torch.ops.mok.forward_cache_info()[0]
    if held != 1:
        sys.exit("%d objects after a call of %d tokens under max_tokens = 300; expected 1" % (held, x.shape[0]))
for x, mine in zip(xs, got):
    want = run(exact, x)
    for name, a, b in zip(NAMES, mine, want):
        if not same(a, b):
            sys.exit("%s differs from the exact layer's at %d tokens" % (name, x.shape[0]))
    for backward in ("staged", "fused"):  # save mode through either backward (R = 1: the same bits)
        os.environ["MOK_BACKWARD"] = backward
        for name, a, b in zip(NAMES, run(saving, x), want):
            if not same(a, b):
                sys.exit("save mode, %s backward: %s differs from the exact layer's at %d tokens"
                         % (backward, name, x.shape[0]))
    os.environ.pop("MOK_BACKWARD")
held = torch.ops.mok.backward_cache_info()[0]
if held != 1:  # the fused backward's objects: the capacity's, one for every count
    sys.exit("%d fused backward objects for five counts under max_tokens = 300; expected 1" % held)
if torch.ops.mok.forward_cache_info()[0] < 2:
    sys.exit("the exact layer should have made objects of its own")
"""


@pytest.mark.skipif(not has_hopper(), reason="needs a Hopper (sm_90) GPU")
def test_max_tokens_runs_every_count_on_one_workspace_with_the_exact_bits():
    # Counts that change from call to call (as variable sequence lengths
    # make them) under one capacity: one cached object for all of them, and
    # the outputs and gradients of a layer without a capacity, bit for bit.
    # In a child process, whose op cache starts empty.
    import os
    import subprocess
    import sys
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(mok.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]))
    env.pop("MOK_TOKEN_BUCKET", None)
    env.pop("MOK_BACKWARD", None)  # the child sets it where it wants the fused backward
    child = subprocess.run([sys.executable, "-c", _MAX_TOKENS_CHILD], env=env, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, (child.stdout + child.stderr)[-2000:]


def _single_rank_group(backend="gloo"):
    """A process group of this process alone (file store; destroyed by the caller)."""
    import os
    import tempfile

    import torch.distributed as dist
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    return dist.group.WORLD


def test_expert_parallel_layer_holds_its_experts_and_refuses_what_it_cannot_run():
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    group = _single_rank_group()
    try:
        layer = MoE(128, 64, 8, 2, shared_intermediate=64, process_group=group)
        assert layer.w13.shape == (8, 128, 128) and layer.w2.shape == (8, 128, 64)  # E / R = 8 / 1 experts
        with pytest.raises(ValueError, match="save_activations and fp32_main_grad"):
            MoE(128, 64, 8, 2, process_group=group, save_activations=True)
        with pytest.raises(ValueError, match="worlds"):
            MoE(128, 64, 8, 2, process_group=group, worlds=0)
        layer.close()  # no world made yet: nothing to release
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not has_hopper(), reason="needs a Hopper (sm_90) GPU")
def test_expert_parallel_layer_of_one_rank_gives_the_one_gpu_bits():
    """A group of one process: the process world and its expert-parallel
    backward against the one-GPU layer with the same parameters, bitwise, over
    calls whose token count changes (each count gets its world)."""
    import torch.distributed as dist
    group = _single_rank_group()
    try:
        torch.manual_seed(5)
        one = MoE(256, 128, 8, 2, shared_intermediate=128, device="cuda")
        ep = MoE(256, 128, 8, 2, shared_intermediate=128, device="cuda", process_group=group, worlds=2)
        ep.load_state_dict(one.state_dict())
        for tokens in (96, 64, 96, 33):
            x = torch.randn(tokens, 256, device="cuda").bfloat16()
            outs, grads = [], []
            for layer in (one, ep):
                xi = x.clone().requires_grad_(True)
                out = layer(xi)
                outs.append(out)
                params = [xi, layer.w13, layer.w2, layer.shared_w13, layer.shared_w2, layer.router.weight]
                grads.append(torch.autograd.grad(out.float().square().sum(), params))
            assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), tokens
            for name, a, b in zip(("x", "w13", "w2", "shared_w13", "shared_w2", "router"), *grads):
                assert torch.equal(a, b), (tokens, name)
        assert len(ep._worlds) == 2  # three distinct counts, two kept
        ep.close()
    finally:
        dist.destroy_process_group()
