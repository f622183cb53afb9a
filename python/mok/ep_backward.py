"""The staged backward over an expert-parallel process group: one process per
rank, each with its own tokens and its own E / R experts (mok.distributed's
process world), rows moved with all_to_all.

Per rank r, given dout for its tokens:

  1. its (token, slot) entries, stably sorted by the rank owning their
     expert, go to those owners with their x and dout rows, routing weight
     and (local expert, token, slot);
  2. each owner receives rows from ranks 0, 1, ... in that order, so a stable
     sort by local expert puts each expert's rows in global token order --
     the order the virtual world's backward sums them in, hence the same
     weight-gradient bits at any R -- and runs the grouped kernels on them
     (mok.staged_backward's routed part, recompute mode);
  3. the dx rows and d w values go back the way they came; the home rank sums
     dx = shared part + slots 0..k-1 (row_combine) and places d w.

The shared expert's backward is local (its weight gradients are this rank's
part; a data-parallel framework reduces them). Every rank must call it, in
the same order relative to other collectives, with the same `needs`. Row
counts are exchanged first (one small all_to_all, read on the host to size
the row exchanges).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .staged_backward import BackwardOps, LayerGrads, Needs, _routed_rows, _shared, ops_for


def _exchange(t: torch.Tensor, send_counts, recv_counts, group) -> torch.Tensor:
    """Rows of t (grouped by destination rank, send_counts[s] rows for rank s)
    to their ranks; returns the rows received, grouped by source rank. bf16
    rows travel as int32 pairs (the same bits; gloo moves neither bf16 nor
    int16), so their width must be even (H is a multiple of 64)."""
    if dist.get_world_size(group) == 1:
        return t
    bf16 = t.dtype == torch.bfloat16
    wire = t.contiguous().view(torch.int32) if bf16 else t.contiguous()
    staged = wire.is_cuda and dist.get_backend(group) == "gloo"  # gloo moves CPU tensors only
    if staged:
        wire = wire.cpu()
    out = wire.new_empty((sum(recv_counts),) + tuple(wire.shape[1:]))
    dist.all_to_all_single(out, wire, recv_counts, send_counts, group=group)
    if staged:
        out = out.to(t.device)
    return out.view(torch.bfloat16) if bf16 else out


def layer_backward_ep(dout, x, expert_ids, weights, w13, w2, shared_w13=None, shared_w2=None, *, group,
                      needs: Needs = Needs(), ops: BackwardOps | None = None,
                      grad_dtype: torch.dtype | None = None) -> LayerGrads:
    """This rank's gradients: dx [T_r, H], dweights [T_r, k], dW13 / dW2 of its
    experts [E/R, ...], and its part of the shared expert's weight gradients.
    x [T_r, H], expert_ids [T_r, k] (global ids), weights [T_r, k]; w13
    [E/R, 2I, H] and w2 [E/R, H, I] this rank's experts (expert e lives on
    rank e // (E/R))."""
    ops = ops_for(x.device) if ops is None else ops
    R, rank = dist.get_world_size(group), dist.get_rank(group)
    T, k = expert_ids.shape
    El = w13.shape[0]
    H = x.shape[1]
    dout = dout.to(x.dtype).contiguous()
    routed = needs.x or needs.weights or needs.w13 or needs.w2
    dx_rows_home = dscale_home = row_of_entry = dw13 = dw2 = None
    if routed:
        # 1. Entries to their experts' owners.
        ids = expert_ids.reshape(-1).long()
        owner = torch.div(ids, El, rounding_mode="floor")
        order = torch.sort(owner, stable=True).indices  # send order: by owner, entry order within
        send_counts = torch.bincount(owner, minlength=R).tolist()
        recv_counts = _exchange(torch.tensor(send_counts, dtype=torch.int64, device=x.device), [1] * R, [1] * R,
                                group).tolist()
        token = torch.div(order, k, rounding_mode="floor")
        local = ids.index_select(0, order) - owner.index_select(0, order) * El
        meta = torch.stack([local, torch.full_like(local, rank), token, order - token * k], 1)
        got_x = _exchange(x.index_select(0, token), send_counts, recv_counts, group)
        got_dout = _exchange(dout.index_select(0, token), send_counts, recv_counts, group)
        got_w = _exchange(weights.reshape(-1).float().index_select(0, order), send_counts, recv_counts, group)
        got_meta = _exchange(meta, send_counts, recv_counts, group)
        # 2. Each local expert's rows in global token order (ranks arrive in order).
        row_order = torch.sort(got_meta[:, 0], stable=True).indices
        counts = torch.bincount(got_meta[:, 0], minlength=El)
        group_offset = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
        dx_rows, dscale, dw13, dw2 = _routed_rows(
            got_dout.index_select(0, row_order), got_x.index_select(0, row_order), got_w.index_select(0, row_order),
            w13, w2, group_offset, counts.to(torch.int32), needs, ops, grad_dtype)
        # 3. Back to the home ranks, in the order they were sent.
        back = torch.argsort(row_order)  # row of the sorted layout -> received position
        if needs.x:
            dx_rows_home = _exchange(dx_rows.index_select(0, back), recv_counts, send_counts, group)
        if needs.weights:
            dscale_home = _exchange(dscale.index_select(0, back), recv_counts, send_counts, group)
        row_of_entry = torch.argsort(order)  # entry -> its position in the send order
    dx_shared = dsw13 = dsw2 = None
    if shared_w13 is not None and (needs.x or needs.shared_w13 or needs.shared_w2):
        dx_shared, dsw13, dsw2 = _shared(dout, x, shared_w13, shared_w2, needs, ops, grad_dtype)
    dx = dweights = None
    if needs.x:
        if dx_rows_home is None:  # no routed part needed: the shared expert alone
            dx_rows_home = x.new_zeros(0, H)
            row_of_entry = torch.full((T * k,), -1, dtype=torch.long, device=x.device)
        dx = ops.row_combine(dx_rows_home, row_of_entry.view(T, k).to(torch.int32), dx_shared).to(x.dtype)
    if needs.weights:
        dweights = dscale_home.index_select(0, row_of_entry).view(T, k)
    return LayerGrads(dx, dweights, dw13, dw2, dsw13, dsw2)


__all__ = ["layer_backward_ep"]
