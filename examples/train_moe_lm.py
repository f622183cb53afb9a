"""Train a small language model whose feed-forward block is mok's MoE layer.

The data is a synthetic Markov chain over a vocabulary (each token has a few
likely successors), so the best achievable loss -- the chain's entropy rate --
is known and printed. The model: token embedding -> RMSNorm -> MoE (mok.nn.MoE,
with a shared expert) + residual -> RMSNorm -> vocabulary head; every
parameter bf16. Forward: mok's fused megakernel; backward: mok's staged
backward (python/mok/staged_backward.py), through plain torch autograd.

--compare trains a second copy with the same initial weights and batches
whose experts run in plain torch (a per-expert loop; the same router), and
prints both losses side by side: the two curves should stay close.

usage: python3 examples/train_moe_lm.py [--steps 300] [--compare]
(one Hopper GPU; from a source tree, build first: scripts/build.sh)
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mok  # noqa: E402
from mok.nn import MoE  # noqa: E402


class MarkovChain:
    """Token t is followed by one of `fanout` successors with fixed probabilities."""

    def __init__(self, vocab: int, fanout: int, seed: int, device):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.succ = torch.randint(0, vocab, (vocab, fanout), generator=g).to(device)
        self.prob = torch.softmax(torch.randn(vocab, fanout, generator=g) * 1.5, dim=1).to(device)
        # Entropy rate under the stationary distribution (power iteration).
        P = torch.zeros(vocab, vocab, device=device)
        P.scatter_add_(1, self.succ, self.prob)
        pi = torch.full((vocab,), 1.0 / vocab, device=device)
        for _ in range(200):
            pi = pi @ P
        ent = -(self.prob * self.prob.log()).sum(1)
        self.entropy = float((pi * ent).sum())

    def batch(self, batch: int, length: int, g: torch.Generator):
        seq = torch.empty(batch, length + 1, dtype=torch.long, device=self.succ.device)
        seq[:, 0] = torch.randint(0, self.succ.shape[0], (batch,), device=seq.device, generator=g)
        for i in range(length):
            pick = torch.multinomial(self.prob[seq[:, i]], 1, generator=g).squeeze(1)
            seq[:, i + 1] = self.succ[seq[:, i], pick]
        return seq[:, :-1], seq[:, 1:]


class TorchExperts(torch.nn.Module):
    """The MoE's experts in plain torch (same parameters, same router): the
    comparison backend."""

    def __init__(self, moe: MoE):
        super().__init__()
        self.moe = moe

    def forward(self, x):
        m = self.moe
        tokens = x.reshape(-1, m.hidden)
        ids, w = m.router(tokens)
        out = torch.zeros(tokens.shape, dtype=torch.float32, device=x.device)
        I = m.intermediate
        for e in range(m.num_experts):
            t, j = (ids == e).nonzero(as_tuple=True)
            if t.numel() == 0:
                continue
            gu = tokens[t] @ m.w13[e].t()
            y = (F.silu(gu[:, :I]) * gu[:, I:]) @ m.w2[e].t()
            out = out.index_add(0, t, w[t, j].unsqueeze(1) * y.float())
        if m.shared_w13 is not None:
            S = m.shared_w2.shape[1]
            gu = tokens @ m.shared_w13.t()
            out = out + ((F.silu(gu[:, :S]) * gu[:, S:]) @ m.shared_w2.t()).float()
        return out.to(x.dtype).view(x.shape)


class TinyMoELM(torch.nn.Module):
    def __init__(self, vocab, hidden, intermediate, experts, top_k, shared, device):
        super().__init__()
        kw = dict(device=device, dtype=torch.bfloat16)
        self.embed = torch.nn.Embedding(vocab, hidden, **kw)
        self.norm1 = torch.nn.RMSNorm(hidden, **kw)
        self.moe = MoE(hidden, intermediate, experts, top_k, shared_intermediate=shared, device=device)
        self.norm2 = torch.nn.RMSNorm(hidden, **kw)
        self.head = torch.nn.Linear(hidden, vocab, bias=False, **kw)
        self.ffn = self.moe  # replaced by TorchExperts in the comparison copy

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.ffn(self.norm1(h))
        return self.head(self.norm2(h)).float()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--compare", action="store_true", help="also train a plain-torch copy")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA (Hopper) GPU")
    device = torch.device("cuda")
    torch.manual_seed(0)
    chain = MarkovChain(args.vocab, fanout=4, seed=1, device=device)
    model = TinyMoELM(args.vocab, hidden=512, intermediate=256, experts=16, top_k=4, shared=256, device=device)
    models = {"mok": model}
    if args.compare:
        twin = copy.deepcopy(model)
        twin.ffn = TorchExperts(twin.moe)
        models["torch"] = twin
    opts = {name: torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.0) for name, m in models.items()}
    g = torch.Generator(device=device).manual_seed(2)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.2f} M parameters; {args.batch * args.length} tokens per step; "
          f"chain entropy rate {chain.entropy:.3f} nats (the best loss); uniform {math.log(args.vocab):.3f}",
          flush=True)
    start = time.time()
    first = {}
    for step in range(1, args.steps + 1):
        inputs, targets = chain.batch(args.batch, args.length, g)
        losses = {}
        for name, m in models.items():
            loss = F.cross_entropy(m(inputs).view(-1, args.vocab), targets.reshape(-1))
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            opts[name].step()
            losses[name] = loss.item()
            first.setdefault(name, losses[name])
        if step == 1 or step % 25 == 0 or step == args.steps:
            shown = "  ".join(f"{name} loss {v:.4f}" for name, v in losses.items())
            print(f"step {step:5d}/{args.steps}  {shown}  ({time.time() - start:.1f} s)", flush=True)
    for name in models:
        print(f"{name}: loss {first[name]:.3f} -> {losses[name]:.3f} (entropy rate {chain.entropy:.3f})")
    grads_ok = all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.moe.parameters())
    print(f"every MoE parameter got a finite gradient: {grads_ok}")


if __name__ == "__main__":
    main()
