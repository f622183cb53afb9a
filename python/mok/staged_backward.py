"""The staged backward of the MoE layer: the fused forward's gradients as a
chain of grouped kernels and deterministic torch ops (the fused backward
kernel, mok::FusedBackward / torch.ops.mok.fused_backward, does the same math
in one persistent kernel; MOK_BACKWARD=fused selects it).

Recompute mode: the forward keeps its inputs only; the backward rebuilds the
schedule and the gate/up pre-activations. For one layer over the whole world
(all ranks' tokens concatenated in rank order = global token order, all
experts in global order):

  schedule   (token, slot) entries token-major, stable-sorted by expert id: each
             expert's rows in global token order (the order its weight
             gradients sum in, the same at any world size), no padding
  dout_rows, x_rows = scatter_rows([dout, x])           each token's rows to its k rows, one pass
  preact     = grouped_mm(x_rows, W13)                  [gate | up], recomputed
  d13, w*h, dw = swiglu_backward_mm(dout_rows, W2, preact, w_rows)
  dx_j       = grouped_mm_kn(d13, W13)                  one bf16 row per (token, slot)
  dx         = row_combine(dx_j, dx_shared)             dx_shared + dx_0 + ... + dx_{k-1}: fp32,
                                                        slots in order, one bf16 rounding
  dW13[e]    = weight_grad_mm(d13, x_rows)              fp32
  dW2[e]     = weight_grad_mm(dout_rows, w*h)           fp32
  shared     the same with one group of every token and weight 1

Determinism: the only data-dependent reorderings are a stable sort,
index_select/view and scatter_rows (copies with one writer per row: no
atomics, no index_add_/scatter_add_), and every
sum has a fixed order, so the gradients are bitwise repeatable given
deterministic kernels (mok's are).

Padding: the rows of a group past its real rows (up to its 128-row tile) and
the saved schedule's unused tail belong to no group. Every op here is told
to leave them uninitialised (zero_padding=False: zeros there cost a launch
per output and the padding's bytes), because nothing reads them: the
grouped GEMMs compute a padding row only into an output row they do not
store, the weight gradient clears a group's rows past its end in shared
memory before its last k-block, and the combine and the routing weights'
gradient gather real rows only. The CPU references fill those rows with NaN
instead (mok.testing), so a test on the CPU shows any read of them.

The kernels are injected (BackwardOps), so the same math runs on the CPU with
mok.testing's fp32 torch references of the ops (reference_ops()): that is how
the CPU tests check it against torch autograd.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


class BackwardOps(NamedTuple):
    """The grouped kernels the staged backward calls, with torch.ops.mok's
    signatures (mok/__init__.py documents them)."""
    grouped_mm: Callable          # (a, b [G, N, K], group_offset, group_rows) -> bf16 [M, N]
    grouped_mm_kn: Callable       # (a, b [G, K, N], group_offset, group_rows, *, zero_padding) -> bf16 [M, N]
    swiglu_backward_mm: Callable  # (dout_rows, w2, preact, row_scale, group_offset, group_rows, *, zero_padding)
    #                               -> 3 tensors
    weight_grad_mm: Callable      # (a, b, group_offset, group_rows, num_groups, out_dtype) -> [G, m, n]
    row_combine: Callable         # (rows, row_index int32 [T, k], base | None) -> bf16 [T, width]
    weight_grad_mm_acc_: Callable  # (out fp32 [G, m, n], a, b, group_offset, group_rows): out += the sums
    scatter_rows: Callable        # ([sources [T, width]], row_of_entry [T, k], entry_of_row [M], *, zero_padding)
    #                               -> [[M, width]]


_KERNEL_OP_NAMES = ("grouped_mm", "grouped_mm_kn", "swiglu_backward_mm", "weight_grad_mm", "row_combine",
                    "weight_grad_mm_acc_", "scatter_rows")


def has_kernel_ops() -> bool:
    """Whether the loaded libmok_torch.so registers every op the staged backward needs."""
    return all(hasattr(torch.ops.mok, name) for name in _KERNEL_OP_NAMES)


def kernel_ops() -> BackwardOps:
    """mok's kernels (CUDA tensors; meta tensors reach their shape functions)."""
    if not has_kernel_ops():
        from . import LIBRARY_PATH
        missing = [n for n in _KERNEL_OP_NAMES if not hasattr(torch.ops.mok, n)]
        raise RuntimeError(f"mok: the loaded {LIBRARY_PATH} has no {', '.join(missing)} op (it predates the "
                           "staged backward); rebuild it (scripts/build.sh, or pip install --no-build-isolation .)")
    m = torch.ops.mok
    return BackwardOps(m.grouped_mm, m.grouped_mm_kn, m.swiglu_backward_mm, m.weight_grad_mm, m.row_combine,
                       m.weight_grad_mm_acc_, m.scatter_rows)


def ops_for(device: torch.device) -> BackwardOps:
    """The kernels for CUDA and meta tensors; mok.testing's fp32 torch
    references for CPU tensors (which mok's kernels refuse)."""
    if device.type == "cpu":
        from .testing import reference_ops
        return reference_ops()
    return kernel_ops()


class MainGrads(NamedTuple):
    """Buffers the weight gradients are added to (gradient accumulation over
    micro-batches: each sum added once, in call order) -- fp32 main_grads, or
    bf16 .grads (the sum rounded, then added: weight_grad_mm_acc_) -- None
    where the gradient is returned instead: w13 [E, 2I, H], w2 [E, H, I],
    shared_w13 [2S, H], shared_w2 [H, S]."""
    w13: torch.Tensor | None = None
    w2: torch.Tensor | None = None
    shared_w13: torch.Tensor | None = None
    shared_w2: torch.Tensor | None = None


class Needs(NamedTuple):
    """Which gradients to compute (torch's needs_input_grad)."""
    x: bool = True
    weights: bool = True
    w13: bool = True
    w2: bool = True
    shared_w13: bool = True
    shared_w2: bool = True


class LayerGrads(NamedTuple):
    """The layer's gradients; None where not needed (or no shared expert).
    dx in x's dtype, dweights fp32 [T, k]; the weight gradients in fp32 (the
    kernels' accumulators), or rounded once to layer_backward's grad_dtype."""
    dx: torch.Tensor | None
    dweights: torch.Tensor | None
    dw13: torch.Tensor | None
    dw2: torch.Tensor | None
    dshared_w13: torch.Tensor | None
    dshared_w2: torch.Tensor | None


class Schedule(NamedTuple):
    """Rows of the grouped GEMMs: row i is (token, slot) entry entry_of_row[i]."""
    entry_of_row: torch.Tensor  # int64 [T k]: entry (= token * k + slot) of each row
    row_of_entry: torch.Tensor  # int64 [T k]: its inverse
    token_of_row: torch.Tensor  # int64 [T k]
    group_offset: torch.Tensor  # int32 [E + 1]: first row of each expert
    group_rows: torch.Tensor    # int32 [E]: rows of each expert (no padding)


def routed_schedule(expert_ids: torch.Tensor, num_experts: int) -> Schedule:
    """Each expert's rows in global token order (then slot order), on the ids'
    device, with no host synchronisation. Ids outside [0, E) belong to no
    group (the forward's check_errors reports them)."""
    k = expert_ids.shape[1]
    flat = expert_ids.reshape(-1)
    # Stable: equal ids keep their token-major order. A sort, not a histogram
    # with atomics, so the result is the same every run.
    sorted_ids, entry_of_row = torch.sort(flat, stable=True)
    bounds = torch.arange(num_experts + 1, dtype=flat.dtype, device=flat.device)
    offsets = torch.searchsorted(sorted_ids, bounds)
    row_of_entry = torch.argsort(entry_of_row, stable=True)  # the inverse permutation
    return Schedule(entry_of_row, row_of_entry, torch.div(entry_of_row, k, rounding_mode="floor"),
                    offsets.to(torch.int32), (offsets[1:] - offsets[:-1]).to(torch.int32))


class SavedForward(NamedTuple):
    """What the forward's training mode (save) kept, per rank of the virtual
    world (torch.ops.mok.fused_forward_train's outputs after `out`)."""
    preact: list          # bf16 [saved rows, 2I]: [gate | up] of each schedule row
    shared_preact: list   # bf16 [T_r, 2S]
    expert_rows: list     # int32 [E/R]
    expert_offset: list   # int32 [E/R + 1]: padded starts; the last, the schedule's padded length
    schedule_rows: list   # int32 [saved rows, 3]: home (rank, token, slot); rank -1 for padding


def saved_schedule(saved: SavedForward, tokens_per_rank, top_k: int) -> Schedule:
    """The forward's own schedule (every rank's, concatenated: rank r's rows at
    r * saved rows) as a Schedule of the grouped kernels: its padded groups,
    and for padding rows and the unused tail of each rank's rows, token 0 and
    the dummy entry T k (they belong to no group, so nothing reads what they
    gather). No host synchronisation.

    It runs in the training forward's setup_context, once per recorded call,
    and every op here is a launch the host pays for; so the ops are few
    (scalars where a tensor of them would be one more launch, and nothing for
    what is already in the right form at R = 1), all integer arithmetic."""
    R = len(saved.schedule_rows)
    if _eager_cuda(saved.schedule_rows[0], "staged_schedule"):
        # The same tables from one kernel (include/mok/staged_schedule.hpp);
        # this function's ops below stay the reference, and what is traced.
        entry_of_row, row_of_entry, token_of_row = torch.ops.mok.staged_schedule(
            list(saved.schedule_rows), list(saved.expert_offset), [int(t) for t in tokens_per_rank], top_k)
        return Schedule(entry_of_row, row_of_entry, token_of_row, *_saved_groups(saved))
    cap = saved.schedule_rows[0].shape[0]
    El = saved.expert_rows[0].shape[0]
    device = saved.schedule_rows[0].device
    T = sum(tokens_per_rank)
    rows = (saved.schedule_rows[0] if R == 1 else torch.cat(list(saved.schedule_rows))).long()
    home, token, slot = rows.unbind(1)
    # Rows before each rank's schedule end; the rest of its capacity is unused.
    if R == 1:
        in_schedule = torch.arange(cap, device=device) < saved.expert_offset[0][El]
    else:
        in_schedule = (torch.arange(cap, device=device).unsqueeze(0)
                       < torch.stack([offsets[El] for offsets in saved.expert_offset]).unsqueeze(1)).reshape(-1)
    real = in_schedule & (home >= 0)
    # The home rank's first global token, from Python ints (no torch.tensor of
    # a list: under torch.compile this code is traced with fake tensors).
    global_token = token
    first = 0
    for r, count in enumerate(tokens_per_rank):
        if first > 0:
            global_token = global_token + (home == r).long() * first
        first += int(count)
    token_of_row = torch.where(real, global_token, 0)
    entry_of_row = torch.where(real, token_of_row * top_k + slot, T * top_k)
    # Each real entry has exactly one row. Every other row writes a dummy
    # entry of its own past T k (never read), not the shared dummy T k: in
    # deterministic mode index_put_ sorts its indices and writes each run of
    # equal ones serially, and the padding rows and the capacity's unused
    # tail (thousands of rows) made one such run (0.36 ms a layer at the
    # DeepSeek-V3 size). Zeros first: an entry a bad expert id kept out of
    # the schedule then points at row 0, not at garbage.
    all_rows = torch.arange(R * cap, device=device)
    row_of_entry = torch.zeros(T * top_k + R * cap, dtype=torch.long, device=device)
    row_of_entry.index_put_((torch.where(real, entry_of_row, T * top_k + all_rows),), all_rows)
    return Schedule(entry_of_row, row_of_entry[:T * top_k], token_of_row, *_saved_groups(saved))


def _saved_groups(saved: SavedForward):
    """(group_offset, group_rows) int32 of the saved schedule's padded groups,
    every rank's concatenated (rank r's rows at r * saved rows)."""
    R = len(saved.schedule_rows)
    if R == 1:  # the forward's own offsets and counts, already int32
        return saved.expert_offset[0], saved.expert_rows[0]
    cap = saved.schedule_rows[0].shape[0]
    El = saved.expert_rows[0].shape[0]
    group_offset = torch.cat([offsets[:El] + r * cap for r, offsets in enumerate(saved.expert_offset)]
                             + [saved.expert_offset[-1][El:] + (R - 1) * cap])
    return group_offset.to(torch.int32), torch.cat(list(saved.expert_rows)).to(torch.int32)


def _weight_grads(ops: BackwardOps, pairs, group_offset, group_rows, groups, grad_dtype):
    """For each (needed, a, b, main) of `pairs`: a^T b summed per group -- added
    to `main` (fp32, returned None) when given, else returned."""
    out = []
    for needed, a, b, main in pairs:
        if not needed:
            out.append(None)
        elif main is not None:
            ops.weight_grad_mm_acc_(main.view(groups, main.shape[-2], main.shape[-1]), a, b, group_offset, group_rows)
            out.append(None)
        else:
            out.append(ops.weight_grad_mm(a, b, group_offset, group_rows, groups, grad_dtype))
    return out


def _routed_rows(dout_rows, x_rows, w_rows, w13, w2, group_offset, group_rows, needs: Needs, ops: BackwardOps,
                 grad_dtype, preact: torch.Tensor | None = None, main: MainGrads = MainGrads()):
    """The grouped kernels on rows already in schedule order (each expert's
    rows in global token order): (dx_rows | None, d w per row, dW13 | None,
    dW2 | None). preact None: recompute mode; main: buffers to add the weight
    gradients to instead of returning them."""
    E = w13.shape[0]
    if preact is None:  # recompute mode
        preact = ops.grouped_mm(x_rows, w13, group_offset, group_rows)
    d13, hw, dscale = ops.swiglu_backward_mm(dout_rows, w2, preact, w_rows, group_offset, group_rows,
                                             zero_padding=False)
    dx_rows = ops.grouped_mm_kn(d13, w13, group_offset, group_rows, zero_padding=False) if needs.x else None
    dw13, dw2 = _weight_grads(ops, ((needs.w13, d13, x_rows, main.w13), (needs.w2, dout_rows, hw, main.w2)),
                              group_offset, group_rows, E, grad_dtype)
    return dx_rows, dscale, dw13, dw2


def _routed(dout, x, expert_ids, weights, w13, w2, needs: Needs, ops: BackwardOps, grad_dtype,
            schedule: Schedule | None = None, preact: torch.Tensor | None = None, main: MainGrads = MainGrads()):
    """(slot_rows int32 [T, k] | None, dx_rows bf16 [T k, H] | None, dweights fp32 [T, k] | None,
    dw13, dw2): dx_rows[slot_rows[t, j]] is slot j's part of dx[t]."""
    T, k = expert_ids.shape
    E = w13.shape[0]
    s = routed_schedule(expert_ids, E) if schedule is None else schedule
    # Each token's x and dout rows copied to its k rows in one pass (x's only
    # where a kernel reads them: dW13, or recompute mode's gate/up GEMM).
    if preact is None or needs.w13:
        dout_rows, x_rows = ops.scatter_rows([dout, x], s.row_of_entry.view(T, k), s.entry_of_row,
                                             zero_padding=False)
    else:
        (dout_rows,), x_rows = ops.scatter_rows([dout], s.row_of_entry.view(T, k), s.entry_of_row,
                                                zero_padding=False), None
    # One more weight, for the saved schedule's dummy entry (padding rows).
    flat_weights = torch.cat([weights.reshape(-1).float(), weights.new_zeros(1, dtype=torch.float32)])
    w_rows = flat_weights.index_select(0, s.entry_of_row).contiguous()
    dx_rows, dscale, dw13, dw2 = _routed_rows(dout_rows, x_rows, w_rows, w13, w2, s.group_offset, s.group_rows,
                                              needs, ops, grad_dtype, preact, main)
    slot_rows = s.row_of_entry.view(T, k).to(torch.int32) if needs.x else None
    dweights = dscale.index_select(0, s.row_of_entry).view(T, k) if needs.weights else None
    return slot_rows, dx_rows, dweights, dw13, dw2


def _shared(dout, x, shared_w13, shared_w2, needs: Needs, ops: BackwardOps, grad_dtype,
            preact: torch.Tensor | None = None, main: MainGrads = MainGrads()):
    """(dx_shared bf16 [T, H] | None, dshared_w13, dshared_w2): one group of every token, weight 1."""
    T = x.shape[0]
    # Factory ops, not torch.tensor(list): under torch.compile these must be fake tensors too.
    group_offset = torch.arange(2, dtype=torch.int32, device=x.device) * T  # [0, T]
    group_rows = torch.full((1,), T, dtype=torch.int32, device=x.device)
    w13, w2 = shared_w13.unsqueeze(0), shared_w2.unsqueeze(0)  # one group: [1, 2S, H], [1, H, S]
    if preact is None:  # recompute mode
        preact = ops.grouped_mm(x, w13, group_offset, group_rows)
    d13, h, _ = ops.swiglu_backward_mm(dout, w2, preact, None, group_offset, group_rows, zero_padding=False)
    dx = ops.grouped_mm_kn(d13, w13, group_offset, group_rows, zero_padding=False) if needs.x else None
    dw13, dw2 = _weight_grads(ops, ((needs.shared_w13, d13, x, main.shared_w13),
                                    (needs.shared_w2, dout, h, main.shared_w2)), group_offset, group_rows, 1, grad_dtype)
    return dx, None if dw13 is None else dw13[0], None if dw2 is None else dw2[0]


def layer_backward(dout, x, expert_ids, weights, w13, w2, shared_w13=None, shared_w2=None, *,
                   needs: Needs = Needs(), ops: BackwardOps | None = None,
                   grad_dtype: torch.dtype | None = None, saved: SavedForward | None = None,
                   tokens_per_rank=None, main_grads: MainGrads = MainGrads(),
                   schedule: Schedule | None = None) -> LayerGrads:
    """The layer's gradients given dout = dL/dout [T, H] (bf16 or fp32), for one
    rank holding every token and every expert (global ids index w13 [E, 2I, H]
    and w2 [E, H, I]); shared_w13 [2S, H] and shared_w2 [H, S], or None.
    ops: the kernels (None: ops_for(x.device), and on CUDA tensors in eager
    mode the same chain enqueued from C++, torch.ops.mok.staged_backward:
    the same kernels in the same order, so the same bits, without ~0.5 ms of
    Python between the launches; given: this Python chain). grad_dtype: the weight
    gradients' dtype (None: fp32; bf16: the fp32 sums rounded once, as a bf16
    weight's gradient is). saved: what the forward's training mode kept (save
    mode: its schedule and pre-activations are used, nothing is recomputed),
    with tokens_per_rank the ranks' token counts (x is their concatenation);
    None: recompute mode. main_grads: buffers (fp32, or bf16 .grads) the weight
    gradients are added to instead of being returned (their entries in the
    result are None).
    schedule: saved_schedule(saved, tokens_per_rank, k) when the caller built
    it already (the autograd does, in the forward); saved's schedule lists
    are then not read.
    """
    routed = needs.x or needs.weights or needs.w13 or needs.w2
    shared = shared_w13 is not None and (needs.x or needs.shared_w13 or needs.shared_w2)
    schedule, preact, shared_preact = _from_saved(saved, schedule, routed, shared, tokens_per_rank or [x.shape[0]],
                                                  expert_ids.shape[1])
    if ops is None and _enqueues_from_cpp(x):
        s = schedule
        return LayerGrads(*torch.ops.mok.staged_backward(
            dout, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, preact, shared_preact,
            None if s is None else s.entry_of_row, None if s is None else s.row_of_entry,
            None if s is None else s.group_offset, None if s is None else s.group_rows,
            [int(n) for n in needs], grad_dtype, *main_grads))
    ops = ops_for(x.device) if ops is None else ops
    dout = dout.to(x.dtype).contiguous()
    slot_rows = dx_rows = dweights = dw13 = dw2 = dx_shared = dsw13 = dsw2 = None
    if routed:
        slot_rows, dx_rows, dweights, dw13, dw2 = _routed(dout, x, expert_ids, weights, w13, w2, needs, ops,
                                                          grad_dtype, schedule, preact, main_grads)
    if shared:
        dx_shared, dsw13, dsw2 = _shared(dout, x, shared_w13, shared_w2, needs, ops, grad_dtype, shared_preact,
                                         main_grads)
    dx = None
    if needs.x:
        # The forward's combine order: shared part, then slots 0..k-1, in fp32,
        # one bf16 rounding (one pass over the slot rows).
        dx = ops.row_combine(dx_rows, slot_rows, dx_shared).to(x.dtype)
    return LayerGrads(dx, dweights, dw13, dw2, dsw13, dsw2)


def _eager_cuda(t: torch.Tensor, op_name: str) -> bool:
    """Whether a real CUDA tensor meets eager mode and the loaded library has
    torch.ops.mok.<op_name>: then the C++ path of a step here runs (the same
    kernels or tables as its Python ops). Traced code (torch.compile, fake
    tensors, any dispatch mode) gets the Python ops, which all have shape
    functions."""
    return (t.is_cuda and type(t) is torch.Tensor and hasattr(torch.ops.mok, op_name)
            and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None)


def _enqueues_from_cpp(x: torch.Tensor) -> bool:
    """Whether layer_backward hands its chain to torch.ops.mok.staged_backward."""
    return _eager_cuda(x, "staged_backward")


def _from_saved(saved: SavedForward | None, schedule: Schedule | None, routed: bool, shared: bool,
                tokens_per_rank, top_k: int):
    """(schedule, preact, shared_preact) of save mode, read from `saved` only
    for the parts that run (routed, shared); None for what recompute mode
    (saved None) rebuilds. The schedule: the one given, else saved's."""
    if saved is None:
        return schedule, None, None
    preact = shared_preact = None
    if routed:
        if schedule is None:
            schedule = saved_schedule(saved, tokens_per_rank, top_k)
        preact = _cat(saved.preact)
    if shared:
        shared_preact = _cat(saved.shared_preact)
    return schedule, preact, shared_preact


def _cat(tensors):
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors))


__all__ = ["BackwardOps", "LayerGrads", "MainGrads", "Needs", "SavedForward", "Schedule", "saved_schedule", "has_kernel_ops", "kernel_ops", "layer_backward",
           "ops_for", "routed_schedule"]
