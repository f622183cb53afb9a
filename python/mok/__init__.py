"""mok: deterministic MoE kernels for Hopper, as PyTorch custom ops.

Importing this package loads libmok_torch.so (mok/_library.py says where it
is looked for), which registers:

  torch.ops.mok.grouped_mm(a, b, group_offset, group_rows) -> out
      a [M, K] bf16, b [G, N, K] bf16 (nn.Linear layout), group_offset int32
      [G + 1] (padded start rows), group_rows int32 [G] (real rows); all on one
      CUDA device. out [M, N] bf16; rows of a group past its real rows (the
      padding) are left unwritten (uninitialised memory).
  torch.ops.mok.grouped_mm_swiglu(a, w13, group_offset, group_rows) -> out
      w13 [G, 2N, K]: rows [0, N) gate, [N, 2N) up. out [M, N] =
      silu(a @ gate^T) * (a @ up^T), fp32 math, one bf16 rounding.
  torch.ops.mok.fused_forward(x, expert_ids, weights, w13, w2, shared_w13,
                              shared_w2, num_experts, tuning, check_errors,
                              token_capacity=0) -> out
      The fused MoE forward over a virtual world of R = len(x) ranks on one
      GPU; see fused_forward() below.
  torch.ops.mok.fused_forward_fp8(x, expert_ids, weights, w13, w13_scales, w2,
                                  w2_scales, shared_w13, shared_w2, num_experts,
                                  tuning, check_errors, token_capacity=0) -> out
      The fused FP8 forward (block-scaled e4m3 routed experts: values
      float8_e4m3fn and UE8M0 scales uint8 from mok.quantize_weights; x,
      the shared expert and out bf16); see fused_forward_fp8() below. No
      backward (it raises).
  torch.ops.mok.fused_forward_train(...same as fused_forward up to check_errors...,
                                    keep_preact=True, token_capacity=0)
      -> (out, preact, shared_preact, expert_rows, expert_offset, schedule_rows)
      The same forward in training mode: also keeps, per rank, the gate/up
      pre-activations and the schedule (python/csrc/fused_forward_train_ops.cpp).
      keep_preact=False: the schedule only; preact and shared_preact are then
      empty lists (what fused_backward's recompute mode takes).
  torch.ops.mok.fused_backward(x, weights, w13, w2, shared_w13, shared_w2,
                               preact, shared_preact, expert_rows, expert_offset,
                               schedule_rows, dout, tuning, main_w13=None, main_w2=None,
                               main_shared_w13=None, main_shared_w2=None, check_errors=False,
                               bf16_weight_grads=False, token_capacity=0)
      -> (dx, dweights, dw13, dw2, dshared_w13, dshared_w2)
      The fused backward kernel over the same virtual world: the
      forward's inputs (per-rank lists, as fused_forward takes them), what
      fused_forward_train kept (its outputs after out, unchanged: preact and
      shared_preact empty lists, from keep_preact=False, select recompute
      mode, which recomputes gate/up and gives save mode's bits), dout[r]
      bf16 [T_r, H], the forward's tuning list and its token_capacity. Returns single tensors,
      the ranks in order: dx bf16 [T, H] and dweights fp32 [T, k] (T = sum
      of T_r), dw13 fp32 [E, 2I, H] and dw2 fp32 [E, H, I] (rank r's experts
      at [r E/R, (r+1) E/R)), dshared_w13 fp32 [2S, H] and dshared_w2 fp32
      [H, S]: the ranks' shares added in rank order. Each main_* (fp32, the weight gradient's shape: [E, 2I, H],
      [E, H, I], [2S, H], [H, S]) given gets its gradient added in place, and
      that output is an empty [0] tensor (as are the shared ones without a
      shared expert); the others are still returned. bf16_weight_grads: the
      weight gradients come back bf16, each fp32 sum rounded once by the
      kernel (the bits of rounding the fp32 outputs), wherever the kernel
      writes all of them itself (no main_* given; R = 1 or no shared expert),
      fp32 otherwise. mok.fused_forward's
      autograd calls it with MOK_BACKWARD=fused, in save and recompute mode
      (mok/autograd.py). torch.ops.mok.backward_cache_info()
      -> [objects held, capacity] of its cache of FusedBackward objects (one
      per layer shape, tuning and mode).

The backward's building blocks (the staged backward, mok/staged_backward.py,
chains them; rows outside every group come back as zeros, or with
zero_padding=False, where an op takes it, uninitialised: for a caller that
never reads them, as the staged backward, which saves their writes. Under
torch.use_deterministic_algorithms(True) with
torch.utils.deterministic.fill_uninitialized_memory on (torch's default),
those rows, and the forward GEMMs' padding rows, are zeros instead, so that
every byte an op returns is repeatable; every other output element is
written by the kernels, so mok's outputs skip that mode's NaN fill of new
tensors, which cost a DeepSeek-V3-size layer's backward ~1.4 ms):

  torch.ops.mok.grouped_mm_kn(a, b, group_offset, group_rows, *, zero_padding=True) -> out
      b [G, K, N] (the weights transposed): out[rows of g] = a[rows] @ b[g].
  torch.ops.mok.swiglu_backward_mm(dout_rows, w2, preact, row_scale,
                                   group_offset, group_rows, *, zero_padding=True)
      -> (d13, scaled_act, row_scale_grad)
      The data gradient through the down projection and SwiGLU.
  torch.ops.mok.weight_grad_mm(a, b, group_offset, group_rows, num_groups, out_dtype=None) -> out
  torch.ops.mok.weight_grad_mm_acc_(out, a, b, group_offset, group_rows)
      out[g] (+)= sum over group g's rows of a[r]^T b[r], fp32 (or bf16).
  torch.ops.mok.row_combine(rows, row_index, base) -> out
      out[t] = base[t] + the token's slot rows, fp32 in slot order, one rounding.
  torch.ops.mok.scatter_rows(sources, row_of_entry, entry_of_row, *, zero_padding=True) -> outs
      outs[s][r] = sources[s][e // k] for the entry e that claims row r, else 0.
  torch.ops.mok.grouped_mm_fp8(a, a_scales, b, b_scales, group_offset, group_rows) -> out
  torch.ops.mok.staged_schedule(schedule_rows, expert_offset, tokens_per_rank, top_k)
      -> (entry_of_row, row_of_entry, token_of_row)
      The staged backward's row tables from fused_forward_train's kept schedule
      in one kernel (staged_backward.saved_schedule's first three fields).
  torch.ops.mok.staged_backward(dout, x, expert_ids, weights, w13, w2, shared_w13,
                                shared_w2, preact, shared_preact, entry_of_row,
                                row_of_entry, group_offset, group_rows, needs,
                                grad_dtype, main_w13, main_w2, main_shared_w13,
                                main_shared_w2) -> (dx, dweights, dw13, dw2,
                                                    dshared_w13, dshared_w2)
      staged_backward.layer_backward's chain of the ops above, enqueued from
      C++ (the same kernels in the same order, so the same bits); a gradient
      not needed, or added to its main_* buffer, comes back as None. CUDA
      tensors in eager mode only: it has no fake kernel, and traced code
      gets layer_backward's Python chain.

Every op raises RuntimeError on bad input, before any work, naming the
argument; each but staged_backward has a fake (meta) kernel, so
torch.compile(fullgraph=True) traces it. Backward (mok/autograd.py): fused_forward and grouped_mm have one
(fused_forward with MOK_BACKWARD=fused on CUDA: the fused backward kernel;
otherwise staged: separate kernels); grouped_mm_swiglu's and
fused_forward_fp8's backward raise. K
and N must be multiples of 64.
"""

from __future__ import annotations

import torch

from . import _library

LIBRARY_PATH = _library.load()  # where libmok_torch.so was found

from . import autograd as _autograd  # noqa: E402
from . import eager_autograd as _eager_autograd  # noqa: E402
from .options import TUNING_OPTIONS, tuning_list  # noqa: E402

_autograd.register()


def grouped_mm(a: torch.Tensor, b: torch.Tensor, group_offset: torch.Tensor,
               group_rows: torch.Tensor) -> torch.Tensor:
    """out[rows of group g] = a[rows] @ b[g]^T (see module docstring)."""
    return torch.ops.mok.grouped_mm(a, b, group_offset, group_rows)


def grouped_mm_swiglu(a: torch.Tensor, w13: torch.Tensor, group_offset: torch.Tensor,
                      group_rows: torch.Tensor) -> torch.Tensor:
    """out = silu(a @ gate^T) * (a @ up^T) per group, fused (see module docstring)."""
    return torch.ops.mok.grouped_mm_swiglu(a, w13, group_offset, group_rows)


def grouped_mm_kn(a: torch.Tensor, b: torch.Tensor, group_offset: torch.Tensor,
                  group_rows: torch.Tensor, *, zero_padding: bool = True) -> torch.Tensor:
    """out[rows of group g] = a[rows] @ b[g] with b [G, K, N] (K-by-N weights,
    e.g. an nn.Linear weight [N_out, N_in] read as [K = N_out, N = N_in]: the
    data gradient dx = dy @ W). a [M, K] bf16; out [M, N] bf16, fp32
    accumulation, one rounding; rows outside every group are zeros
    (zero_padding=False: uninitialised, and not written)."""
    return torch.ops.mok.grouped_mm_kn(a, b, group_offset, group_rows, zero_padding=zero_padding)


def swiglu_backward_mm(dout_rows: torch.Tensor, w2: torch.Tensor, preact: torch.Tensor,
                       row_scale: torch.Tensor | None, group_offset: torch.Tensor, group_rows: torch.Tensor, *,
                       zero_padding: bool = True):
    """The data gradient through an expert's down projection and SwiGLU, per row.

    dout_rows [M, H] bf16 (dL/dy of each row), w2 [G, H, I] bf16 (the down
    projection as nn.Linear stores it), preact [M, 2I] bf16 (the forward's
    [gate | up] of each row), row_scale [M] fp32 (each row's routing weight) or
    None (1). With acc = dout_rows[r] @ w2[g] (fp32), w = row_scale[r],
    s = sigmoid(gate), h = gate * s * up, dh = w * acc, returns
      d13            [M, 2I] bf16  [dh * up * s * (1 + gate (1 - s)) | dh * gate * s]
      scaled_act     [M, I]  bf16  w * h  (what dW2 = dout^T (w h) needs)
      row_scale_grad [M]     fp32  <acc, h> = dL/dw of the row
    Rows outside every group are zeros (zero_padding=False: d13's and
    scaled_act's are uninitialised; row_scale_grad's stay zeros)."""
    return torch.ops.mok.swiglu_backward_mm(dout_rows, w2, preact, row_scale, group_offset, group_rows,
                                            zero_padding=zero_padding)


def weight_grad_mm(a: torch.Tensor, b: torch.Tensor, group_offset: torch.Tensor, group_rows: torch.Tensor,
                   num_groups: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[g] = sum over group g's rows r of a[r]^T b[r] (a [M, m], b [M, n]
    bf16): fp32 [G, m, n], each element one fp32 sum over the group's rows in
    order (same bits wherever the group sits); a group without rows gets zeros.
    out_dtype=torch.bfloat16: that fp32 sum rounded once, written as bf16 (a
    bf16 weight's gradient, without an fp32 tensor and a conversion).
    E.g. dW2[e] = weight_grad_mm(dy_rows, h_rows, ...)."""
    return torch.ops.mok.weight_grad_mm(a, b, group_offset, group_rows, num_groups, out_dtype)


def grouped_mm_fp8(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                   group_offset: torch.Tensor, group_rows: torch.Tensor) -> torch.Tensor:
    """Block-scaled FP8 grouped GEMM: out[rows of g] = A[rows] . B[g]^T in bf16,
    with A = a * 2^(a_scales - 127) per 1 x 128 block (a float8_e4m3fn [M, K],
    a_scales uint8 [M, K / 128]: mok.quant.quantize_rows) and B likewise per
    128 x 128 block (b [G, N, K], b_scales [G, N / 128, K / 128]:
    mok.quantize_weights). Each 128 of K is summed by the tensor cores and
    added to an fp32 accumulator with its scales; K and N multiples of 128."""
    return torch.ops.mok.grouped_mm_fp8(a, a_scales, b, b_scales, group_offset, group_rows)


def grouped_mm_fp8_swiglu(a: torch.Tensor, a_scales: torch.Tensor, w13: torch.Tensor, w13_scales: torch.Tensor,
                          group_offset: torch.Tensor, group_rows: torch.Tensor) -> torch.Tensor:
    """grouped_mm_fp8 with the SwiGLU epilogue: w13 [G, 2I, K] float8 (gate rows,
    then up rows; scales [G, 2I / 128, K / 128] from mok.quantize_weights),
    out [M, I] bf16 = silu(gate) * up from the fp32 accumulators (I a multiple
    of 64)."""
    return torch.ops.mok.grouped_mm_fp8_swiglu(a, a_scales, w13, w13_scales, group_offset, group_rows)


def row_combine(rows: torch.Tensor, row_index: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = bf16(base[t] + rows[row_index[t, 0]] + ... + rows[row_index[t, k-1]]):
    rows bf16 [N, width] (width % 8 == 0), row_index int32 [T, k] (< 0: adds
    nothing), base bf16 [T, width] or None; fp32 sums in slot order, one
    rounding, no atomics (the backward's dx = dx_shared + sum of its slots)."""
    return torch.ops.mok.row_combine(rows, row_index, base)


def scatter_rows(sources: list[torch.Tensor], row_of_entry: torch.Tensor,
                 entry_of_row: torch.Tensor, *, zero_padding: bool = True) -> list[torch.Tensor]:
    """Each token's row of every source copied to the rows its entries were
    scheduled to: sources bf16 [T, width] (1 to 4, width % 8 == 0),
    row_of_entry int64 [T, k] (the row of entry t k + j), entry_of_row int64
    [M] (the entry each row holds) -> one bf16 [M, width] per source, row r =
    source[e // k] when both indices agree on r and e, zeros otherwise
    (padding rows; inconsistent or out-of-range indices claim nothing; with
    zero_padding=False those rows are uninitialised, and not written). Reads
    each source row once (a row gather reads it k times); one writer per row,
    so the same bytes every run."""
    return torch.ops.mok.scatter_rows(sources, row_of_entry, entry_of_row, zero_padding=zero_padding)


def weight_grad_mm_acc_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, group_offset: torch.Tensor,
                        group_rows: torch.Tensor) -> torch.Tensor:
    """out[g] += sum over group g's rows of a[r]^T b[r], in place: gradient
    accumulation over micro-batches. out fp32 [G, m, n] (a main_grad): the
    new sum added once to the old value; or bf16 (a bf16 weight's .grad): the
    sum rounded to bf16, then added and rounded again -- the bits torch's own
    accumulation of the returned gradient gives, without its pass over the
    gradient (the TMA unit adds each tile as it is stored). Returns out."""
    torch.ops.mok.weight_grad_mm_acc_(out, a, b, group_offset, group_rows)
    return out


def fused_forward(x, expert_ids, weights, w13, w2, shared_w13=None, shared_w2=None, *,
                  num_experts: int, check_errors: bool = False, save_activations: bool = False,
                  token_capacity: int = 0, **tuning):
    """The fused MoE layer forward (one persistent kernel).

    Lists hold one tensor per rank of a virtual world on one GPU (R = len(x)):
    x[r] [T_r, H] bf16, expert_ids[r] [T_r, k] int32 (global ids),
    weights[r] [T_r, k] fp32, w13[r] [E/R, 2I, H] bf16 (gate rows, then up),
    w2[r] [E/R, H, I] bf16; shared_w13 [2S, H] and shared_w2 [H, S] bf16, or
    None. Every tensor contiguous, the bf16 ones 16-byte aligned. Returns
    [out[r] [T_r, H] bf16]. Results are bitwise identical for any R,
    minibatch, ring size or SM split. check_errors=True synchronises and
    raises on a stalled pass or a bad expert id (rank, token, slot named).

    token_capacity > 0: every rank's token count may be anything up to it
    (a RuntimeError above it), and every call runs on the one workspace made
    for that many tokens per rank: counts that change from call to call
    (variable batch or sequence length) allocate nothing and never
    synchronise the host; the outputs are the bits of an exact-size call.
    (The staged backward allocates through torch's caching allocator; the
    fused backward kernel, MOK_BACKWARD=fused, runs on one object made for
    the capacity too.)
    0 (default): one workspace per distinct set of counts (cached, see
    below).

    Backward: the staged backward (mok/staged_backward.py: grouped kernels
    and deterministic torch ops, bitwise repeatable) gives gradients for x,
    weights, w13, w2 and the shared expert, in their dtypes. By default
    (recompute mode) the forward keeps only its inputs and the backward
    recomputes gate/up; save_activations=True runs the forward's training
    kernel, which also keeps its schedule and the gate/up pre-activations
    (saved rows x 2I bf16 per rank, mok.FusedForward's saved_rows()), and the
    backward reads them instead (save mode: the same gradient bits, one GEMM
    fewer).

    MOK_BACKWARD=fused (unset or "auto": the staged backward, the faster on
    one GPU today) makes the backward on CUDA the fused backward kernel
    (torch.ops.mok.fused_backward, one persistent kernel) in either mode: in
    save mode it reads what the training kernel kept; in recompute mode,
    where autograd records the call, the forward runs the training kernel
    with keep_preact=False instead of the plain op (the same out; it keeps
    the schedule only) and the kernel recomputes gate/up itself (recompute
    mode: save mode's bits). Its bits are the staged backward's, except the
    shared expert's weight gradients at R > 1, which it sums per rank and
    then over ranks in rank order (mok/autograd.py says more).

    Keyword tuning options (mok.TUNING_OPTIONS, 0 or absent = the library's
    default): minibatch_rows, ring_slots, lookahead, ctas_per_rank,
    comm_ctas_per_rank; FusedForwardOptions in include/mok/fused_forward.hpp
    says what each does. With none given, an entry of the tuning cache for
    this layer and GPU is used when one exists (python -m mok.tune stores
    them; mok/tuning_source.py says when the cache is read;
    mok.tuning_sources(...) says where each option of a call comes from). One FusedForward object (workspace and all) is
    cached per layer shape, device and tuning; the least recently used of
    more than torch.ops.mok.forward_cache_info()[1] is freed.
    """
    tuning_list(tuning)  # unknown names raise TypeError before any lookup
    options, _ = _resolve_tuning(x, expert_ids, w13, w2, shared_w2, num_experts, tuning, token_capacity)
    args = (list(x), list(expert_ids), list(weights), list(w13), list(w2), shared_w13, shared_w2, num_experts,
            tuning_list(options), check_errors)
    # Recorded by autograd in eager mode: the same ops and formulas without
    # torch.library's per-call wrapper (mok/eager_autograd.py says why).
    recorded = _autograd.records_grad(x, weights, w13, w2, shared_w13, shared_w2)
    eager = _eager_autograd.applies(*args[:7], recorded=recorded)
    if save_activations:
        if eager:
            if _eager_autograd.node_applies(args[0]):  # one rank, the staged backward: a C++ node
                return _eager_autograd.fused_forward_train_node(*args, True, token_capacity)
            return _eager_autograd.fused_forward_train_out(*args, True, token_capacity)
        return torch.ops.mok.fused_forward_train(*args, token_capacity=token_capacity)[0]
    if _autograd.fused_recompute(x, weights, w13, w2, shared_w13, shared_w2, recorded=recorded):
        # Recompute mode of the fused backward kernel: the schedule only.
        if eager:
            return _eager_autograd.fused_forward_train_out(*args, False, token_capacity)
        return torch.ops.mok.fused_forward_train(*args, keep_preact=False, token_capacity=token_capacity)[0]
    if eager:
        if _eager_autograd.node_applies(args[0]):
            return _eager_autograd.fused_forward_train_node(*args, False, token_capacity)
        return _eager_autograd.fused_forward(*args, token_capacity)
    if not recorded:
        with _eager_autograd.below_autograd():
            return torch.ops.mok.fused_forward(*args, token_capacity=token_capacity)
    return torch.ops.mok.fused_forward(*args, token_capacity=token_capacity)


def fused_forward_fp8(x, expert_ids, weights, w13, w2, shared_w13=None, shared_w2=None, *,
                      num_experts: int, check_errors: bool = False, token_capacity: int = 0, **tuning):
    """The fused FP8 MoE layer forward (one persistent kernel; issue 16's
    recipe): mok.fused_forward's arguments, with the routed experts' weights
    block-scaled FP8 -- w13[r] and w2[r] are mok.QuantizedWeights of rank r's
    [E/R, 2I, H] and [E/R, H, I] weights (mok.quantize_weights: e4m3 values,
    one UE8M0 scale per 128 x 128 block). x, the shared expert and the output
    stay bf16: the kernel quantizes each x row as it pulls it (1 x 128 blocks)
    and h in the gate/up epilogue, and accumulates in fp32, promoting every
    128 of K. H must be a multiple of 256 and I of 128. Results are bitwise
    identical for any R, minibatch, ring size or SM split; token_capacity as
    mok.fused_forward's. Forward only:
    backward raises (no FP8 backward yet). Keyword tuning options as
    mok.fused_forward's; with none given, the tuning cache's FP8 entry for
    this layer and GPU (`mok_cli tune --fp8` stores them) when one exists;
    minibatch_rows must be a multiple of 128. check_errors=True also
    checks the weights' bytes first (a pass over them, and a synchronisation):
    a NaN e4m3 value or a scale byte of 255 (NaN in UE8M0), which
    mok.quantize_weights never writes, raises ValueError naming the rank and
    the element; unchecked, they reach the outputs as NaN or infinity."""
    w13, w2 = list(w13), list(w2)
    for name, q in (("w13", w13), ("w2", w2)):
        if not all(isinstance(part, QuantizedWeights) for part in q):
            raise TypeError(f"mok.fused_forward_fp8: {name} must hold one mok.QuantizedWeights per rank "
                            f"(mok.quantize_weights of that rank's weights)")
        if check_errors:
            for r, part in enumerate(q):
                _check_fp8_weight_bytes(part, f"{name}[{r}]")
    tuning_list(tuning)  # unknown names raise TypeError before any lookup
    w13_values, w2_values = [q.values for q in w13], [q.values for q in w2]
    options, _ = _resolve_tuning(x, expert_ids, w13_values, w2_values, shared_w2, num_experts, tuning,
                                 token_capacity, precision="fp8")
    args = (list(x), list(expert_ids), list(weights), w13_values, [q.scales for q in w13], w2_values,
            [q.scales for q in w2], shared_w13, shared_w2, num_experts, tuning_list(options), check_errors)
    if not _autograd.records_grad(args[0], args[2], args[3], args[5], shared_w13, shared_w2):
        # As mok.fused_forward's: a call autograd does not record enters
        # below autograd itself, skipping the Python kernel that
        # torch.library's registration puts there (host time before the
        # launch; docs/perf-notes.md v17, v26). Recorded calls keep it: its
        # backward names this op when it refuses.
        with _eager_autograd.below_autograd():
            return torch.ops.mok.fused_forward_fp8(*args, token_capacity=token_capacity)
    return torch.ops.mok.fused_forward_fp8(*args, token_capacity=token_capacity)


def _check_fp8_weight_bytes(q, name):
    """Raises ValueError on a NaN e4m3 value (0x7F / 0xFF) or a NaN scale
    byte (255) of one rank's quantized weights."""
    if q.scales.dtype == torch.uint8:
        bad = torch.nonzero(q.scales == 255)
        if bad.numel():
            raise ValueError(f"mok.fused_forward_fp8: {name}.scales{bad[0].tolist()} is 255 (NaN in UE8M0); "
                             f"scales are bytes e + 127 of powers of two 2^e, as mok.quantize_weights writes them")
    if q.values.dtype == torch.float8_e4m3fn:
        bad = torch.nonzero((q.values.view(torch.uint8) & 0x7F) == 0x7F)
        if bad.numel():
            raise ValueError(f"mok.fused_forward_fp8: {name}.values{bad[0].tolist()} is NaN")


def _resolve_tuning(x, expert_ids, w13, w2, shared_w2, num_experts, tuning, token_capacity=0, precision="bf16"):
    from . import tuning_source
    try:
        # With a capacity, the object is made (and tuned) for it.
        layer = dict(hidden=x[0].shape[-1], intermediate=w2[0].shape[-1], experts=num_experts,
                     top_k=expert_ids[0].shape[-1], shared=0 if shared_w2 is None else shared_w2.shape[-1],
                     tokens_per_rank=token_capacity if token_capacity > 0 else max(t.shape[0] for t in x),
                     world=len(x), device=x[0].device)
    except (IndexError, AttributeError, TypeError):
        layer = None  # malformed arguments: no cache lookup; the op names what is wrong
    if layer is None:
        return tuning_source.resolve(tuning, hidden=0, intermediate=0, experts=0, top_k=0, shared=0,
                                     tokens_per_rank=0, world=0, device=None)
    return tuning_source.resolve(tuning, **layer, precision=precision)


def tuning_sources(x, expert_ids, w13, w2, shared_w2=None, *, num_experts: int, token_capacity: int = 0,
                   fp8: bool = False, **tuning) -> dict:
    """For a call of mok.fused_forward (fp8=True: mok.fused_forward_fp8, whose
    w13 / w2 are then mok.QuantizedWeights) with these arguments: each tuning
    option's value (0 = the library's default or rule) and where it comes from
    ("caller", "cache" or "default")."""
    if fp8:
        w13, w2 = [q.values for q in w13], [q.values for q in w2]
    options, sources = _resolve_tuning(x, expert_ids, w13, w2, shared_w2, num_experts, tuning, token_capacity,
                                       precision="fp8" if fp8 else "bf16")
    return {name: (options.get(name, 0), sources[name]) for name in TUNING_OPTIONS}


def layout_from_counts(counts, tile_rows: int = 1, device=None):
    """(group_offset, group_rows) int32 tensors for groups of `counts` rows,
    each padded to a multiple of `tile_rows` (1 = contiguous, no padding)."""
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + (int(c) + tile_rows - 1) // tile_rows * tile_rows)
    return (torch.tensor(offsets, dtype=torch.int32, device=device),
            torch.tensor([int(c) for c in counts], dtype=torch.int32, device=device))


__all__ = ["TUNING_OPTIONS", "tuning_sources", "fused_forward", "fused_forward_fp8", "grouped_mm", "grouped_mm_fp8", "grouped_mm_fp8_swiglu", "grouped_mm_kn",
           "grouped_mm_swiglu", "quantize_rows", "quantize_weights",
           "layout_from_counts", "row_combine", "scatter_rows", "swiglu_backward_mm", "weight_grad_mm", "weight_grad_mm_acc_"]

from . import nn  # noqa: E402,F401  (mok.nn: the MoE layer; imports fused_forward above)
from .quant import QuantizedWeights, quantize_rows, quantize_weights  # noqa: E402,F401  (block-scaled FP8)
