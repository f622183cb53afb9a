"""mok.hf, the transformers experts backend: registration and what it refuses
(CPU, on small models built from configs), and on a Hopper GPU the logits of
small Qwen3-MoE and DeepSeek-V3 models, and the experts' weight gradients,
against transformers' own backends."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import mok  # noqa: E402
import mok.hf  # noqa: E402
from conftest import has_hopper  # noqa: E402
from mok.testing import reference_forward  # noqa: E402


def _qwen3_moe_config(**overrides):
    from transformers import Qwen3MoeConfig
    values = dict(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=256)
    values.update(overrides)
    return Qwen3MoeConfig(**values)


def _deepseek_v3_config(**overrides):
    from transformers import DeepseekV3Config
    values = dict(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=16,
                  num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
                  q_lora_rank=64, kv_lora_rank=64, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32,
                  max_position_embeddings=256)
    values.update(overrides)
    return DeepseekV3Config(**values)


def _experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "down_proj")]


def _model(config, implementation):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, experts_implementation=implementation)


def test_register_adds_the_backend_that_models_then_accept():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    assert mok.hf.register() == "mok"
    assert ALL_EXPERTS_FUNCTIONS["mok"] is mok.hf.experts_forward
    model = _model(_qwen3_moe_config(), "grouped_mm")
    model.set_experts_implementation("mok")
    assert model.get_experts_implementation()[""] == "mok"


def test_register_rejects_unknown_tuning_options_at_once():
    with pytest.raises(TypeError, match="unknown tuning option"):
        mok.hf.register(minibatch_row=64)
    mok.hf.register()  # the settings of a failed call are not kept


def test_swiglu_experts_of_real_models_are_accepted():
    for config in (_qwen3_moe_config(), _deepseek_v3_config()):
        experts = _experts_modules(_model(config, "eager"))
        assert experts
        for e in experts:
            assert mok.hf.module_problems(e) == []


def test_what_mok_cannot_run_is_named():
    from transformers import GptOssConfig, GptOssForCausalLM
    gpt_oss = GptOssForCausalLM(GptOssConfig(vocab_size=256, hidden_size=128, intermediate_size=128,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=32, num_local_experts=4, num_experts_per_tok=2))
    problems = " | ".join(mok.hf.module_problems(_experts_modules(gpt_oss)[0]))
    for expected in ("biases", "interleaved", "transposed", "own gate function"):
        assert expected in problems

    gelu = _experts_modules(_model(_qwen3_moe_config(hidden_act="gelu"), "eager"))[0]
    assert any("not SiLU" in p for p in mok.hf.module_problems(gelu))

    odd = _experts_modules(_model(_qwen3_moe_config(moe_intermediate_size=96), "eager"))[0]
    assert any("multiples of 64" in p for p in mok.hf.module_problems(odd))


def test_a_cpu_model_is_refused_before_any_work():
    mok.hf.register()
    model = _model(_qwen3_moe_config(), "mok").to(torch.bfloat16)
    with pytest.raises(ValueError, match="bf16 on a CUDA device"):
        model(torch.randint(0, 512, (1, 8)))


def test_a_refused_module_raises_with_its_reasons():
    mok.hf.register()
    model = _model(_qwen3_moe_config(hidden_act="gelu"), "mok")
    with pytest.raises(ValueError, match="not SiLU.*another experts_implementation"):
        model(torch.randint(0, 512, (1, 8)))


def _torch_fused_forward(xs, ids, ws, w13s, w2s, shared_w13=None, shared_w2=None, *, num_experts, check_errors,
                         **tuning):
    """mok.fused_forward's contract in torch on one rank (mok.testing's fp32
    reference), checking the argument types the kernel reads."""
    (x,), (ids,), (w,), (w13,), (w2,) = xs, ids, ws, w13s, w2s
    assert shared_w13 is None and shared_w2 is None and w13.shape[0] == num_experts
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and x.dtype == torch.bfloat16
    return [reference_forward(x, ids, w, w13, w2).bfloat16()]


@pytest.mark.parametrize("make_config", [_qwen3_moe_config, _deepseek_v3_config])
def test_the_backend_hands_the_kernel_what_its_contract_says(make_config, monkeypatch):
    # The kernel replaced by its contract in torch (on the CPU): the logits
    # must match transformers' eager experts, so the ids, weights and the
    # gate-then-up layout reach the kernel as it reads them.
    monkeypatch.setattr(mok.hf, "fused_forward", _torch_fused_forward)
    monkeypatch.setattr(mok.hf, "_DEVICE_TYPES", ("cpu",))
    mok.hf.register()
    config = make_config()
    input_ids = torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    logits = {}
    for implementation in ("eager", "mok"):
        model = _model(config, implementation).to(torch.bfloat16).eval()
        for e in _experts_modules(model):  # from_config leaves the experts' weights uninitialised
            torch.nn.init.normal_(e.gate_up_proj, std=e.gate_up_proj.shape[2] ** -0.5,
                                  generator=torch.Generator().manual_seed(4))
            torch.nn.init.normal_(e.down_proj, std=e.down_proj.shape[2] ** -0.5,
                                  generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            logits[implementation] = model(input_ids).logits.float()
    error = float((logits["mok"] - logits["eager"]).norm() / logits["eager"].norm())
    assert error < 2e-2, error


def test_max_tokens_reaches_the_kernel_as_its_token_capacity(monkeypatch):
    seen = []

    def recording(*args, token_capacity=0, **kwargs):
        seen.append(token_capacity)
        return _torch_fused_forward(*args, **kwargs)

    monkeypatch.setattr(mok.hf, "fused_forward", recording)
    monkeypatch.setattr(mok.hf, "_DEVICE_TYPES", ("cpu",))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_tokens"):
            mok.hf.register(max_tokens=bad)
    try:
        mok.hf.register(max_tokens=16)
        config = _qwen3_moe_config()
        model = _model(config, "mok").to(torch.bfloat16).eval()
        with torch.no_grad():
            model(torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3)))
            assert seen and set(seen) == {16}, seen
            with pytest.raises(ValueError, match="17 tokens, more than register\\(max_tokens=16\\)"):
                model(torch.randint(0, config.vocab_size, (1, 17), generator=torch.Generator().manual_seed(3)))
    finally:
        mok.hf.register()  # back to the default settings for the other tests


def test_compile_fullgraph_traces_the_backend_without_a_graph_break():
    mok.hf.register()
    experts = _experts_modules(_model(_qwen3_moe_config(), "mok"))[0].to(device="meta", dtype=torch.bfloat16)
    T, k = 24, 2
    hidden = torch.empty(T, 128, dtype=torch.bfloat16, device="meta")
    ids = torch.empty(T, k, dtype=torch.int64, device="meta")
    weights = torch.empty(T, k, dtype=torch.bfloat16, device="meta")
    explanation = torch._dynamo.explain(experts)(hidden, ids, weights)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(experts, fullgraph=True, backend=backend)(hidden, ids, weights)
    assert out.shape == (T, 128) and out.dtype == torch.bfloat16
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("mok.fused_forward" in t for t in targets), targets


# --- on a Hopper GPU: mok against transformers' own backends ---

def _logits(config, implementation, input_ids):
    model = _model(config, implementation).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        return model(input_ids).logits.float()


@pytest.mark.skipif(not has_hopper(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("make_config", [_qwen3_moe_config, _deepseek_v3_config])
def test_logits_match_transformers_backends_and_repeat_bitwise(make_config):
    mok.hf.register(check_errors=True)
    config = make_config()
    input_ids = torch.randint(0, config.vocab_size, (2, 48), device="cuda",
                              generator=torch.Generator("cuda").manual_seed(1))
    want = _logits(config, "grouped_mm", input_ids)
    eager = _logits(config, "eager", input_ids)
    got = _logits(config, "mok", input_ids)
    assert torch.equal(got, _logits(config, "mok", input_ids)), "two mok runs differ"
    scale = want.norm()
    # bf16 activations between layers: the backends differ by roundings only,
    # and mok is no farther from grouped_mm than eager is (plus slack).
    eager_error = float((eager - want).norm() / scale)
    mok_error = float((got - want).norm() / scale)
    assert mok_error < max(2e-2, 2 * eager_error), (mok_error, eager_error)


def _grads(config, implementation, input_ids):
    model = _model(config, implementation).to(device="cuda", dtype=torch.bfloat16)
    model(input_ids).logits.float().square().mean().backward()
    return {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}


# One MoE layer, after non-MoE layers only: its input, and so its routing, is
# then the same under every backend. (After another MoE layer, one backend's
# roundings can flip a token's top-k choice, which moves that token's rows to
# another expert: the experts' gradients of two backends then differ by 5-10%
# for a reason that is not the backward's.)
@pytest.mark.skipif(not has_hopper(), reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("config", [_qwen3_moe_config(num_hidden_layers=1), _deepseek_v3_config()],
                         ids=["qwen3-moe", "deepseek-v3"])
def test_backward_through_the_backend_matches_grouped_mm(config):
    mok.hf.register(check_errors=True)
    input_ids = torch.randint(0, config.vocab_size, (2, 48), device="cuda",
                              generator=torch.Generator("cuda").manual_seed(2))
    want = _grads(config, "grouped_mm", input_ids)
    got = _grads(config, "mok", input_ids)
    assert set(got) == set(want) and any("experts" in name for name in got)
    for name, g in got.items():
        assert torch.isfinite(g).all(), name
        # Measured on an H200: at most 0.9% for every parameter (bf16 roundings in different places).
        assert float((g - want[name]).norm() / want[name].norm()) < 3e-2, name
