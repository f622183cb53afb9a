"""Train a transformers MoE causal LM on text, with transformers' "grouped_mm"
experts and with mok's, in one script, and compare.

The model is a Qwen3-MoE built from a config (random weights, nothing
downloaded), byte-level (vocabulary 256), trained on this repository's own
docs and sources. Three runs on the same batches from the same initial
weights: grouped_mm, mok, and mok again (the two mok runs must give bitwise
identical losses). mok's experts: the fused forward megakernel and, for now,
the staged backward (python/mok/staged_backward.py).

Reported: a progress bar per run, tokens/s (after warm-up steps), the loss
curves side by side, the largest gap between mok's and grouped_mm's loss, and
a PNG of the curves (matplotlib, when installed).

  python3 examples/train_moe_lm.py                 # small: H 1024, I 512, 32 experts, top-8, 2 layers
  python3 examples/train_moe_lm.py --size dsv3     # DeepSeek-V3's per-GPU MoE size: H 7168, I 2048, 32 experts, top-8

Needs one Hopper GPU and transformers (from a source tree: scripts/build.sh first).
Attention runs in transformers' "eager" implementation and torch in
deterministic mode (warn only), so that the whole step -- not only mok -- is
repeatable.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before CUDA starts

import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import mok  # noqa: E402,F401
import mok.hf  # noqa: E402

SIZES = {  # hidden, moe intermediate, experts, top-k, layers, heads
    "small": (1024, 512, 32, 8, 2, 8),
    "dsv3": (7168, 2048, 32, 8, 2, 56),
}


def corpus(device) -> torch.Tensor:
    """This repository's docs and sources as one byte stream."""
    files = sorted(p for pattern in ("*.md", "docs/*.md", "src/**/*.c*", "src/**/*.hpp", "python/mok/*.py")
                   for p in ROOT.glob(pattern) if p.is_file())
    data = b"\n".join(p.read_bytes() for p in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device=device, dtype=torch.long)


def batches(text: torch.Tensor, steps: int, batch: int, seq: int, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    starts = torch.randint(0, text.numel() - seq, (steps, batch), generator=g)
    offsets = torch.arange(seq)
    return [text[(s[:, None] + offsets).to(text.device)] for s in starts]


def build_model(size: str, implementation: str, device):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    hidden, inter, experts, top_k, layers, heads = SIZES[size]
    config = Qwen3MoeConfig(vocab_size=256, hidden_size=hidden, intermediate_size=4 * inter,
                            moe_intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=max(1, heads // 8), head_dim=128, num_experts=experts,
                            num_experts_per_tok=top_k, decoder_sparse_step=1, max_position_embeddings=4096,
                            norm_topk_prob=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, experts_implementation=implementation,
                                             attn_implementation="eager")
    gen = torch.Generator().manual_seed(1)
    for module in model.modules():  # from_config leaves the experts' weights uninitialised
        if hasattr(module, "gate_up_proj") and hasattr(module, "down_proj"):
            torch.nn.init.normal_(module.gate_up_proj, std=hidden ** -0.5, generator=gen)
            torch.nn.init.normal_(module.down_proj, std=inter ** -0.5, generator=gen)
    return model.to(device=device, dtype=torch.bfloat16)


def train(name, model, data, lr, warmup):
    try:
        from tqdm import tqdm
    except ImportError:
        def tqdm(it, **_):
            return it
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, tokens, start = [], 0, None
    bar = tqdm(data, desc=f"{name:>10}", unit="step", dynamic_ncols=True)
    for step, chunk in enumerate(bar):
        if step == warmup:
            torch.cuda.synchronize()
            start, tokens = time.perf_counter(), 0
        out = model(input_ids=chunk, labels=chunk)  # the model shifts the labels itself
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
        tokens += chunk.numel()
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    torch.cuda.synchronize()
    rate = tokens / (time.perf_counter() - start) if start is not None else float("nan")
    return losses, rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=5, help="steps not counted in tokens/s")
    parser.add_argument("--plot", default="train_moe_lm.png", help="PNG of the loss curves ('' for none)")
    parser.add_argument("--baseline", choices=("grouped_mm", "eager"), default="grouped_mm",
                        help="transformers' experts implementation to compare with")
    parser.add_argument("--mode", choices=("save", "recompute"), default="save",
                        help="mok's backward mode: the forward keeps gate/up (save) or the backward recomputes them")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA (Hopper) GPU")
    device = torch.device("cuda")
    # Ops without a deterministic CUDA kernel warn (and would show up as two
    # mok runs that differ) instead of stopping the comparison.
    torch.use_deterministic_algorithms(True, warn_only=True)
    mok.hf.register(save_activations=args.mode == "save")
    text = corpus(device)
    data = batches(text, args.steps, args.batch, args.seq, seed=2)
    print(f"corpus: {text.numel() / 1e6:.2f} MB of this repository's text; {args.batch * args.seq} tokens per "
          f"step; size {args.size}: hidden {SIZES[args.size][0]}, MoE intermediate {SIZES[args.size][1]}, "
          f"{SIZES[args.size][2]} experts, top-{SIZES[args.size][3]}, {SIZES[args.size][4]} layers; mok's backward "
          f"in {args.mode} mode", flush=True)
    runs = {}
    base = args.baseline
    for name, implementation in ((base, base), ("mok", "mok"), ("mok again", "mok")):
        model = build_model(args.size, implementation, device)
        runs[name] = train(name, model, data, args.lr, args.warmup)
        del model
        torch.cuda.empty_cache()

    (ref, ref_rate), (mine, mine_rate), (again, _) = runs[base], runs["mok"], runs["mok again"]
    gap = max(abs(a - b) for a, b in zip(mine, ref))
    late = [a - b for a, b in zip(mine[len(mine) // 4:], ref[len(ref) // 4:])]
    print(f"\ntokens/s per GPU: {base} {ref_rate:,.0f}, mok {mine_rate:,.0f} ({mine_rate / ref_rate:.2f}x)")
    print(f"loss: {base} {ref[0]:.4f} -> {ref[-1]:.4f}, mok {mine[0]:.4f} -> {mine[-1]:.4f}; largest gap between "
          f"the curves {gap:.4f}; mean of mok - {base} over the last 3/4 of the steps {sum(late) / len(late):+.4f}")
    print(f"two mok runs, same seed: {'bitwise identical' if mine == again else 'DIFFERENT'} losses")
    for step in sorted({0, len(ref) // 4, len(ref) // 2, 3 * len(ref) // 4, len(ref) - 1}):
        print(f"  step {step:5d}: {base} {ref[step]:.4f}  mok {mine[step]:.4f}")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot")
            return
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(ref, label=f"{base} ({ref_rate:,.0f} tok/s)")
        ax.plot(mine, label=f"mok ({mine_rate:,.0f} tok/s)", linestyle="--")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats / byte)")
        ax.set_title(f"Qwen3-MoE ({args.size}) on this repository's text")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
