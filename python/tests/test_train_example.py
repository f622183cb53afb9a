"""The training example's helpers on the CPU (examples/train_moe_lm.py): the
mask function that keeps torch's flash kernel usable, the batches, and a step
over several micro-batches against one step over their union. The example's
GPU run itself is measured on the device (docs/perf-notes.md), not here."""
import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_moe_lm.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_moe_lm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.register_attention()
    return module


def tiny_config(attn_implementation):
    config = transformers.Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                         moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                         decoder_sparse_step=1, max_position_embeddings=64, norm_topk_prob=True)
    config._attn_implementation = attn_implementation
    return config


PROBE = "mask_probe"


@pytest.fixture()
def masks_seen(example):
    """An attention implementation that records the mask each attention call
    gets (then runs transformers' sdpa on the CPU), with the example's mask
    function as its mask: what flash_sdpa_attention would be handed."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface
    seen = []

    @torch.compiler.disable
    def record(mask):
        seen.append(mask)

    def probe(module, query, key, value, attention_mask, **kwargs):
        record(attention_mask)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(PROBE, probe)
    AttentionMaskInterface.register(PROBE, example.causal_mask_or_none)
    return seen


def tiny_model(example, attn_implementation, experts_implementation="eager"):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(attn_implementation),
                                                          experts_implementation=experts_implementation)
    gen = torch.Generator().manual_seed(1)
    for module in model.modules():  # from_config leaves the experts' weights uninitialised
        if example.is_experts(module):
            torch.nn.init.normal_(module.gate_up_proj, std=0.1, generator=gen)
            torch.nn.init.normal_(module.down_proj, std=0.1, generator=gen)
    return model


def test_the_training_forward_gets_no_mask_eager_and_compiled(example, masks_seen):
    """The example's batches (no padding, no cache) reach attention with no
    mask -- sdpa's is_causal, which torch's flash kernel takes -- in eager and
    under torch.compile, where transformers' own sdpa mask would build one."""
    model = tiny_model(example, PROBE)
    ids = torch.randint(0, 256, (2, 16))
    eager = model(input_ids=ids, labels=ids).loss
    assert len(masks_seen) == 2 and all(m is None for m in masks_seen)
    masks_seen.clear()
    compiled = torch.compile(model, backend="eager")(input_ids=ids, labels=ids).loss
    assert len(masks_seen) == 2 and all(m is None for m in masks_seen), [type(m) for m in masks_seen]
    torch.testing.assert_close(compiled, eager)


def test_a_padded_batch_gets_a_real_mask(example, masks_seen):
    """A batch with padding is not plain causal: the mask function builds
    transformers' own mask for it (flash_sdpa_attention would then refuse it,
    where a silent None would attend to the padding)."""
    model = tiny_model(example, PROBE)
    ids = torch.randint(0, 256, (2, 16))
    padding = torch.ones(2, 16, dtype=torch.long)
    padding[1, :5] = 0  # left padding on the second sequence
    model(input_ids=ids, attention_mask=padding)
    assert len(masks_seen) == 2 and all(isinstance(m, torch.Tensor) for m in masks_seen)
    assert not masks_seen[0][1, 0, -1, :5].any() and masks_seen[0][0, 0, -1].all()
    assert masks_seen[0].shape == (2, 1, 16, 16)


def test_batches_are_slices_of_the_text_and_repeat_by_seed(example):
    text = torch.randint(0, 256, (1000,))
    first = example.batches(text, steps=3, batch=2, seq=32, seed=7)
    again = example.batches(text, steps=3, batch=2, seq=32, seed=7)
    other = example.batches(text, steps=3, batch=2, seq=32, seed=8)
    assert len(first) == 3 and all(b.shape == (2, 32) for b in first)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    for chunk in first:
        for row in chunk:
            starts = [s for s in range(text.numel() - 31) if torch.equal(text[s:s + 32], row)]
            assert starts, "a batch row is not a slice of the text"


def test_accumulated_step_matches_one_step_over_the_union(example):
    """step() over micro-batches of equal size scales each loss by 1 / count:
    the summed gradients are the union's mean-loss gradient, so one SGD step
    lands on the same parameters (fp32, eager experts and attention)."""
    text = torch.randint(0, 256, (4096,))
    micro = example.batches(text, steps=2, batch=2, seq=16, seed=3)
    params = []
    for chunks in (micro, [torch.cat(micro)]):
        model = tiny_model(example, "eager")
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        loss = example.step(model, opt, chunks)
        # What the step moved each parameter by: minus its summed gradient.
        params.append((loss, [p.detach() - q for p, q in zip(model.parameters(), before)]))
    (loss_a, a), (loss_b, b) = params
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    assert all(d.abs().sum() > 0 for d in a[-4:]), "the step left the last parameters where they were"
    for da, db in zip(a, b):
        torch.testing.assert_close(da, db, rtol=1e-4, atol=1e-6)


def test_default_micro_batches_by_size(example):
    assert example.ACCUM == {"small": 1, "dsv3": 8}
    assert set(example.ACCUM) == set(example.SIZES) == set(example.LR)
