"""Gradient accumulation into a bf16 .grad in place, on a Hopper GPU: the
weight-gradient kernel adding its rounded sum to a bf16 buffer by TMA
(weight_grad_mm_acc_ on bf16) gives the bits of torch adding the bf16
gradient to it; mok.nn.MoE and a transformers model on mok accumulate the
same .grad bits over micro-batches with it as torch's own accumulation
(MOK_GRAD_IN_PLACE=0), in save and recompute mode. The CPU twin (the
decisions, on the reference ops): test_grad_in_place.py."""

import pytest
import torch

from conftest import skip_without_hopper

skip_without_hopper()

import mok  # noqa: E402
import mok.nn  # noqa: E402
import mok.staged_backward  # noqa: E402
from test_backward_gpu import COUNTS, _layout, _rand, _same_bits  # noqa: E402


def test_bf16_accumulate_adds_the_rounded_sum_as_torch_would():
    off, rows, inside = _layout()
    M, m, n = inside.numel(), 192, 320
    a = _rand(M, m, seed=21, inside=inside)  # NaN rows outside every group: never read
    b = _rand(M, n, seed=22, inside=inside)
    g = torch.Generator(device="cuda").manual_seed(23)
    # Old values over many binades, with signed zeros: the additions round in every way.
    start = (torch.randn(len(COUNTS), m, n, device="cuda", generator=g)
             * torch.exp2(torch.randint(-20, 6, (len(COUNTS), m, n), device="cuda", generator=g).float()))
    start[..., ::97] = 0.0
    start[..., 1::97] = -0.0
    start = start.bfloat16()
    grad = mok.weight_grad_mm(a, b, off, rows, len(COUNTS), out_dtype=torch.bfloat16)
    want = start + grad  # what torch's AccumulateGrad computes, but for
    want[1] = start[1]   # the group without rows: no addition (its -0.0 stays; torch's + 0 makes +0.0)
    for _ in range(3):
        acc = start.clone()
        assert mok.weight_grad_mm_acc_(acc, a, b, off, rows) is acc
        assert _same_bits(acc, want)
    with pytest.raises(RuntimeError, match="float32 .a main_grad. or bfloat16"):
        mok.weight_grad_mm_acc_(start.half(), a, b, off, rows)


@pytest.fixture()
def in_place_calls(monkeypatch):
    """The bf16 buffers the staged backward's weight_grad_mm_acc_ added to:
    by the chain enqueued from Python (its op counted) or from C++
    (torch.ops.mok.staged_backward: the bf16 main buffers it was handed for
    gradients it computes, which it adds to as the Python chain does). On
    the Python node: save mode's C++ node (MOK_CPP_AUTOGRAD, set to 0 here)
    calls the op from C++, where this patch does not reach; its in-place
    decisions are test_train_node_gpu.py's."""
    monkeypatch.setenv("MOK_CPP_AUTOGRAD", "0")
    calls = []
    ops = mok.staged_backward.kernel_ops()

    def counting(out, *args):
        if out.dtype == torch.bfloat16:
            calls.append(out.data_ptr())
        return ops.weight_grad_mm_acc_(out, *args)

    from_cpp = torch.ops.mok.staged_backward

    def counting_op(dout, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, *rest):
        needs = mok.staged_backward.Needs(*(bool(n) for n in rest[6]))
        routed = needs.x or needs.weights or needs.w13 or needs.w2
        shared = shared_w13 is not None and (needs.x or needs.shared_w13 or needs.shared_w2)
        for runs, needed, out in zip((routed, routed, shared, shared),
                                     (needs.w13, needs.w2, needs.shared_w13, needs.shared_w2), rest[8:12]):
            if runs and needed and out is not None and out.dtype == torch.bfloat16:
                calls.append(out.data_ptr())
        return from_cpp(dout, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, *rest)

    monkeypatch.setattr(mok.staged_backward, "kernel_ops", lambda: ops._replace(weight_grad_mm_acc_=counting))
    monkeypatch.setattr(torch.ops.mok, "staged_backward", counting_op)
    return calls


def _accumulated_grads(save, micro_batches=3):
    torch.manual_seed(0)
    H, I, E, K, S, T = 512, 256, 8, 2, 256, 300
    moe = mok.nn.MoE(H, I, E, K, shared_intermediate=S, device="cuda", save_activations=save)
    for p in moe.parameters():
        p.grad = None
    for step in range(micro_batches):
        x = torch.randn(T + 37 * step, H, device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(step)).bfloat16()
        moe(x).float().square().mean().backward()
    return moe, [p.grad.clone() for p in (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2)]


@pytest.mark.parametrize("save", [True, False])
def test_moe_accumulates_torchs_bits_in_place(save, monkeypatch, in_place_calls):
    monkeypatch.setenv("MOK_GRAD_IN_PLACE", "0")
    _, want = _accumulated_grads(save)
    assert not in_place_calls
    monkeypatch.setenv("MOK_GRAD_IN_PLACE", "1")
    moe, got = _accumulated_grads(save)
    experts = (moe.w13, moe.w2, moe.shared_w13, moe.shared_w2)
    assert len(in_place_calls) == 8 and set(in_place_calls) == {p.grad.data_ptr() for p in experts}
    for name, g, w in zip(("w13", "w2", "shared_w13", "shared_w2"), got, want):
        assert _same_bits(g, w), name


def test_transformers_experts_accumulate_in_place(monkeypatch, in_place_calls):
    transformers = pytest.importorskip("transformers")
    import mok.hf
    mok.hf.register()
    config = transformers.Qwen3MoeConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                                         moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                                         decoder_sparse_step=1, max_position_embeddings=128)
    ids = [torch.randint(0, 256, (2, 64), device="cuda", generator=torch.Generator(device="cuda").manual_seed(s))
           for s in range(3)]
    grads = []
    for flag in ("0", "1"):
        monkeypatch.setenv("MOK_GRAD_IN_PLACE", flag)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, experts_implementation="mok")
        for module in model.modules():
            if hasattr(module, "gate_up_proj"):
                torch.nn.init.normal_(module.gate_up_proj, std=0.05)
                torch.nn.init.normal_(module.down_proj, std=0.05)
        model = model.to(device="cuda", dtype=torch.bfloat16)
        for chunk in ids:
            model(input_ids=chunk, labels=chunk).loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert len(in_place_calls) == 2 * 2 * 2  # 2 layers x (gate_up, down) x the 2 micro-batches after the first
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert _same_bits(grads[1][name], grads[0][name]), name
