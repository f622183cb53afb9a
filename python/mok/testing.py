"""Random layers for checking a world of ranks against the virtual world: the
whole world's batch and experts, built from a seed on the CPU so that every
process of a world builds the same one; the share of one rank; and the split
of a layer into the per-rank lists that mok.fused_forward takes; and the
layer computed in fp32 torch with the kernel's bf16 rounding points, to check
it against.

Also: fp32 torch references of the backward's ops (reference_ops(), for the
staged backward on the CPU), autograd of reference_forward
(reference_layer_grads), and cpu_reference_forward(), which lets
mok.fused_forward's autograd run on CPU tensors.

Used by python/tests, bench/bench_fused_forward.py and tools/torchrun_forward.py.
"""

from __future__ import annotations

import contextlib

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


# ---- reference ops of the backward's building blocks ----------------------
# Plain fp32 torch, any device, with the signatures of torch.ops.mok's ops and
# the kernels' rounding points: fp32 products and sums, one bf16 rounding per
# bf16 output. Rows outside every group are zeros. The group tables are read on
# the host (the kernels never read them there). reference_ops() bundles them
# for mok.staged_backward, which runs its math on them on the CPU.

def _group_spans(group_offset, group_rows):
    """[(first, end)] of each group's real rows."""
    offsets, rows = group_offset.tolist(), group_rows.tolist()
    return [(offsets[g], offsets[g] + rows[g]) for g in range(len(rows))]


def reference_grouped_mm(a, b, group_offset, group_rows):
    """mok.grouped_mm: out[rows of g] = a[rows] @ b[g]^T, b [G, N, K]; bf16 [M, N]."""
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16, device=a.device)
    for g, (first, end) in enumerate(_group_spans(group_offset, group_rows)):
        out[first:end] = (a[first:end].float() @ b[g].float().t()).bfloat16()
    return out


def _padding_fill(zero_padding: bool) -> float:
    """What a reference op writes on rows no group owns: zeros, or, where the
    kernel leaves them uninitialised (zero_padding=False), NaN -- so that a
    caller that reads them after all (a padding row in a sum, a gather that
    picks one) shows it in its result instead of passing on the zeros the
    kernel never promised."""
    return 0.0 if zero_padding else float("nan")


def reference_grouped_mm_kn(a, b, group_offset, group_rows, *, zero_padding=True):
    """mok.grouped_mm_kn: out[rows of g] = a[rows] @ b[g], b [G, K, N]; bf16 [M, N]."""
    out = torch.full((a.shape[0], b.shape[2]), _padding_fill(zero_padding), dtype=torch.bfloat16, device=a.device)
    for g, (first, end) in enumerate(_group_spans(group_offset, group_rows)):
        out[first:end] = (a[first:end].float() @ b[g].float()).bfloat16()
    return out


def reference_swiglu_backward_mm(dout_rows, w2, preact, row_scale, group_offset, group_rows, *,
                                 zero_padding=True, swap_gate_up=False):
    """mok.swiglu_backward_mm: (d13 [M, 2I] bf16, scaled_act [M, I] bf16,
    row_scale_grad [M] fp32) from acc = dout_rows @ w2[g] (w2 [G, H, I]) and the
    saved [gate | up] (include/mok/grouped_gemm.hpp, kSwiGLUBackward).
    swap_gate_up reads up as gate and gate as up: a mutant for tests."""
    M, I = dout_rows.shape[0], w2.shape[2]
    fill = _padding_fill(zero_padding)
    d13 = torch.full((M, 2 * I), fill, dtype=torch.bfloat16, device=dout_rows.device)
    scaled_act = torch.full((M, I), fill, dtype=torch.bfloat16, device=dout_rows.device)
    row_scale_grad = torch.zeros(M, dtype=torch.float32, device=dout_rows.device)
    for g, (first, end) in enumerate(_group_spans(group_offset, group_rows)):
        acc = dout_rows[first:end].float() @ w2[g].float()
        gate, up = preact[first:end, :I].float(), preact[first:end, I:].float()
        if swap_gate_up:
            gate, up = up, gate
        w = 1.0 if row_scale is None else row_scale[first:end].float().unsqueeze(1)
        s = 1.0 / (1.0 + torch.exp(-gate))
        h = gate * s * up
        dh = w * acc
        d13[first:end] = torch.cat([dh * up * s * (1 + gate * (1 - s)), dh * gate * s], dim=1).bfloat16()
        scaled_act[first:end] = (w * h).bfloat16()
        row_scale_grad[first:end] = (acc * h).sum(dim=1)
    return d13, scaled_act, row_scale_grad


def reference_weight_grad_mm(a, b, group_offset, group_rows, num_groups, out_dtype=None):
    """mok.weight_grad_mm: out[g] = sum over group g's rows of a[r]^T b[r]; fp32 [G, m, n]
    (out_dtype: that sum rounded once to it)."""
    out = torch.zeros(num_groups, a.shape[1], b.shape[1], dtype=torch.float32, device=a.device)
    reference_weight_grad_mm_acc_(out, a, b, group_offset, group_rows)
    return out if out_dtype is None else out.to(out_dtype)


def reference_weight_grad_mm_acc_(out, a, b, group_offset, group_rows):
    """mok.weight_grad_mm_acc_: out[g] += sum over group g's rows of a[r]^T b[r],
    in place; a bf16 out gets the sum rounded to bf16 first, as torch adds a
    bf16 gradient to a bf16 .grad (an empty group adds nothing)."""
    for g, (first, end) in enumerate(_group_spans(group_offset, group_rows)):
        if end > first:
            out[g] += (a[first:end].float().t() @ b[first:end].float()).to(out.dtype)


def reference_row_combine(rows, row_index, base):
    """mok.row_combine: out[t] = bf16(base[t] + rows[row_index[t, 0]] + ...), fp32 sums
    in slot order, negative indices adding nothing; bf16 [T, width]."""
    T, width = row_index.shape[0], rows.shape[1]
    acc = torch.zeros(T, width, dtype=torch.float32, device=rows.device)
    if base is not None:
        acc = acc + base.float()
    for j in range(row_index.shape[1]):
        idx = row_index[:, j].long()
        picked = rows.index_select(0, idx.clamp_min(0)).float() if rows.shape[0] else torch.zeros_like(acc)
        acc = torch.where((idx >= 0).unsqueeze(1), acc + picked, acc)
    return acc.to(rows.dtype)


def reference_scatter_rows(sources, row_of_entry, entry_of_row, *, zero_padding=True):
    """mok.scatter_rows: for each source [T, width], out [M, width] with row r
    = source[e // k] where entry e (row_of_entry [T, k] flattened) and row r
    name each other (row_of_entry[e] == r, entry_of_row[r] == e), else zeros
    (NaN with zero_padding=False: _padding_fill)."""
    k = row_of_entry.shape[1]
    M = entry_of_row.shape[0]
    rows = row_of_entry.reshape(-1).long()
    entries = torch.arange(rows.numel(), device=rows.device)
    in_range = (rows >= 0) & (rows < M)
    rows, entries = rows[in_range], entries[in_range]
    agree = entry_of_row.long()[rows] == entries
    rows, entries = rows[agree], entries[agree]
    out = [src.new_full((M, src.shape[1]), _padding_fill(zero_padding)) for src in sources]
    for o, src in zip(out, sources):
        o[rows] = src[entries // k]
    return out


def reference_ops(**swiglu_options):
    """The reference ops as a mok.staged_backward.BackwardOps (keyword options
    go to reference_swiglu_backward_mm: swap_gate_up=True is a mutant)."""
    import functools

    from .staged_backward import BackwardOps

    swiglu = reference_swiglu_backward_mm
    if swiglu_options:
        swiglu = functools.partial(reference_swiglu_backward_mm, **swiglu_options)
    return BackwardOps(grouped_mm=reference_grouped_mm, grouped_mm_kn=reference_grouped_mm_kn,
                       swiglu_backward_mm=swiglu, weight_grad_mm=reference_weight_grad_mm,
                       row_combine=reference_row_combine, weight_grad_mm_acc_=reference_weight_grad_mm_acc_,
                       scatter_rows=reference_scatter_rows)


def reference_layer_grads(x, ids, w, w13, w2, shared_w13, shared_w2, dout):
    """torch autograd of reference_forward on fp32 copies of the inputs:
    (dx, dweights, dw13, dw2, dshared_w13, dshared_w2), fp32, the last two None
    without a shared expert. The forward's bf16 roundings pass gradients
    through unchanged, so this is the exact gradient of the rounded layer."""
    shared = shared_w13 is not None
    leaves = [t.detach().float().requires_grad_() for t in (x, w, w13, w2)]
    leaves += [t.detach().float().requires_grad_() for t in (shared_w13, shared_w2)] if shared else [None, None]
    with torch.enable_grad():
        out = reference_forward(leaves[0], ids, *leaves[1:])
        out.backward(dout.float())
    return tuple(None if t is None else t.grad for t in leaves)


def reference_forward_train(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tile_rows=128,
                            garbage=True):
    """What torch.ops.mok.fused_forward_train returns, in fp32 torch (per-rank
    lists as its arguments): the output, and per rank the schedule the kernel
    builds -- its local experts in order, each expert's (token, slot) entries
    in global token order, padded to `tile_rows` -- with the [gate | up]
    pre-activations of each schedule row (reference_grouped_mm: the kernel's
    rounding), the shared expert's by token, and the schedule tables.
    garbage=True fills what the kernel leaves unwritten (padding rows, the tail
    past the schedule) with NaN and nonsense, so a reader of it shows."""
    R, k = len(x), expert_ids[0].shape[1]
    El = num_experts // R
    T = sum(t.shape[0] for t in x)
    cap = T * k + El * (tile_rows - 1)
    I = w2[0].shape[2]
    all_x, all_ids = torch.cat(list(x)), torch.cat(list(expert_ids)).long()
    home_of = torch.cat([torch.full((t.shape[0],), r, dtype=torch.long) for r, t in enumerate(x)])
    local_of = torch.cat([torch.arange(t.shape[0]) for t in x])
    out = reference_forward(all_x, all_ids, torch.cat(list(weights)), torch.cat(list(w13)), torch.cat(list(w2)),
                            shared_w13, shared_w2).bfloat16()
    outs = [part.clone() for part in out.split([t.shape[0] for t in x])]
    kept = ([], [], [], [], [])
    g = torch.Generator().manual_seed(7)
    for r in range(R):
        rows = torch.randint(0, 1000, (cap, 3), generator=g, dtype=torch.int32) if garbage else \
            torch.full((cap, 3), -1, dtype=torch.int32)
        counts, offsets, at = [], [0], 0
        for e in range(r * El, (r + 1) * El):
            tokens, slots = (all_ids == e).nonzero(as_tuple=True)  # row-major: global token order
            n = tokens.numel()
            rows[at:at + n, 0] = home_of[tokens].int()
            rows[at:at + n, 1] = local_of[tokens].int()
            rows[at:at + n, 2] = slots.int()
            padded = (n + tile_rows - 1) // tile_rows * tile_rows
            rows[at + n:at + padded] = -1
            counts.append(n)
            at += padded
            offsets.append(at)
        expert_rows, expert_offset = torch.tensor(counts, dtype=torch.int32), torch.tensor(offsets, dtype=torch.int32)
        real = torch.arange(cap) < at
        real &= rows[:, 0] >= 0
        tokens_of_rows = torch.where(real, sum((rows[:, 0].long() == h).long() * sum(t.shape[0] for t in x[:h])
                                               for h in range(R)) + rows[:, 1].long(), 0)
        preact = reference_grouped_mm(all_x[tokens_of_rows], w13[r], expert_offset, expert_rows)
        if garbage:
            preact[~real] = float("nan")
        S = 0 if shared_w13 is None else shared_w2.shape[1]
        shared = torch.full((x[r].shape[0], 2 * S), float("nan"), dtype=torch.bfloat16)
        if S:
            shared = reference_grouped_mm(x[r], shared_w13.unsqueeze(0), torch.tensor([0, x[r].shape[0]]),
                                          torch.tensor([x[r].shape[0]]))
        for lst, t in zip(kept, (preact, shared, expert_rows, expert_offset, rows)):
            lst.append(t)
    del I
    return (outs,) + kept


@contextlib.contextmanager
def cpu_reference_forward():
    """Within it, mok::fused_forward's CPU kernel (which refuses) is replaced
    by reference_forward (rounded to bf16, split per rank), so that the op's
    autograd -- the staged backward on the reference ops -- runs on CPU
    tensors. The refusing kernel is back on exit. A token_capacity is checked
    as the op checks it and changes nothing else (the training stand-in's
    schedule is sized for the call's own counts, as an exact object's is).
    """
    import warnings

    def check_capacity(x, token_capacity):
        if token_capacity < 0 or (token_capacity > 0 and any(t.shape[0] > token_capacity for t in x)):
            raise RuntimeError(f"token_capacity = {token_capacity}: every rank's count must be at most it "
                               f"(got {[t.shape[0] for t in x]})")

    def forward(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning, check_errors=False,
                token_capacity=0):
        check_capacity(x, token_capacity)
        out = reference_forward(torch.cat(x), torch.cat(expert_ids), torch.cat(weights), torch.cat(w13),
                                torch.cat(w2), shared_w13, shared_w2).bfloat16()
        return [part.clone() for part in out.split([t.shape[0] for t in x])]

    library = torch.library.Library("mok", "IMPL")
    try:
        with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            library.impl("fused_forward", forward, "CPU")

            def train(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning,
                      check_errors=False, keep_preact=True, token_capacity=0):
                check_capacity(x, token_capacity)
                out, preact, shared_preact, *schedule = reference_forward_train(
                    x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts)
                if not keep_preact:  # the op's keep_preact=False: empty lists
                    preact, shared_preact = [], []
                return out, preact, shared_preact, *schedule
            library.impl("fused_forward_train", train, "CPU")
        yield
    finally:
        library._destroy()  # how torch.library._scoped_library unregisters
