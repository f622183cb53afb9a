"""Random layers for checking a world of ranks against the virtual world: the
whole world's batch and experts, built from a seed on the CPU so that every
process of a world builds the same one; the share of one rank; and the split
of a layer into the per-rank lists that mok.fused_forward takes; and the
layer computed in fp32 torch with the kernel's bf16 rounding points, to check
it against.

Used by python/tests, bench/bench_fused_forward.py and tools/torchrun_forward.py.
"""

from __future__ import annotations

import torch


def random_global_layer(tokens, hidden, intermediate, experts, top_k, shared, seed, device="cpu"):
    """(x, ids, w, w13, w2, sw13, sw2) of the whole world; sw13 and sw2 are
    None when `shared` (the shared expert's width) is 0. Weights are scaled by
    1/sqrt(fan-in) so that activations stay O(1)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    T, H, I, E, K, S = tokens, hidden, intermediate, experts, top_k, shared
    x = (torch.rand(T, H, generator=g) * 2 - 1).bfloat16()
    top = torch.topk(torch.rand(T, E, generator=g), K, dim=1)
    ids = top.indices.int()
    w = torch.softmax(top.values, dim=1).float()
    w13 = ((torch.rand(E, 2 * I, H, generator=g) * 2 - 1) / H ** 0.5).bfloat16()
    w2 = ((torch.rand(E, H, I, generator=g) * 2 - 1) / I ** 0.5).bfloat16()
    sw13 = ((torch.rand(2 * S, H, generator=g) * 2 - 1) / H ** 0.5).bfloat16() if S else None
    sw2 = ((torch.rand(H, S, generator=g) * 2 - 1) / S ** 0.5).bfloat16() if S else None
    layer = (x, ids, w, w13, w2, sw13, sw2)
    return tuple(None if t is None else t.to(device) for t in layer)


def rank_slice(layer, rank, world, device=None):
    """Rank `rank`'s tokens and experts of a global layer (contiguous copies;
    moved to `device` when given), with the shared expert, which every rank
    holds whole."""
    x, ids, w, w13, w2, sw13, sw2 = layer
    t, e = x.shape[0] // world, w13.shape[0] // world

    def move(a):
        return a if device is None or a is None else a.to(device)

    def part(a, n):
        return move(a[rank * n:(rank + 1) * n].contiguous())

    return part(x, t), part(ids, t), part(w, t), part(w13, e), part(w2, e), move(sw13), move(sw2)


def split_world(layer, world, device=None):
    """The per-rank lists (x, expert_ids, weights, w13, w2) of `layer` split
    over a virtual world of `world` ranks, plus the shared expert's
    (shared_w13, shared_w2): the arguments of mok.fused_forward, in order."""
    parts = [rank_slice(layer, r, world, device) for r in range(world)]
    lists = tuple([p[i] for p in parts] for i in range(5))
    return lists + (parts[0][5], parts[0][6])


def reference_forward(x, ids, w, w13, w2, shared_w13=None, shared_w2=None):
    """The layer in fp32 torch, rounding to bf16 where the kernel does (h, each
    expert's y, the shared expert's hidden and output; include/mok/reference.hpp
    lists them): out [T, H] fp32 = shared(x) + sum_j w[:, j] * y_j, for one
    rank holding every expert (global ids index w13 [E, 2I, H] and w2 [E, H, I])."""
    import torch.nn.functional as F

    I = w2.shape[2]
    xf = x.float()
    out = torch.zeros_like(xf)
    for j in range(ids.shape[1]):
        chosen = ids[:, j].long()
        gu = torch.einsum("th,tnh->tn", xf, w13.float()[chosen])
        h = (F.silu(gu[:, :I]) * gu[:, I:]).bfloat16().float()
        y = torch.einsum("ti,thi->th", h, w2.float()[chosen]).bfloat16().float()
        out += w[:, j:j + 1].float() * y
    if shared_w13 is not None:
        S = shared_w2.shape[1]
        s = F.silu(xf @ shared_w13.float()[:S].t()) * (xf @ shared_w13.float()[S:].t())
        out += (s.bfloat16().float() @ shared_w2.float().t()).bfloat16().float()
    return out
