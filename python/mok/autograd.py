"""Autograd for the mok ops.

  fused_forward      the staged backward (mok/staged_backward.py) in recompute
                     mode: the forward saves its inputs only.
  fused_forward_train save mode (mok.fused_forward(..., save_activations=True)):
                     the forward's training kernel also kept its schedule and
                     the gate/up pre-activations, which the backward reads
                     instead of recomputing. The backward is the staged one,
                     or with MOK_BACKWARD=fused on CUDA tensors the fused
                     backward kernel (torch.ops.mok.fused_backward: one
                     persistent kernel, the staged backward's arithmetic).
                     With keep_preact=False the forward kept its schedule
                     only: recompute mode of the fused backward kernel (it
                     recomputes gate/up itself; the same gradient bits as
                     save mode), or, if the backward is the staged one, the
                     staged backward in recompute mode (it recomputes its own
                     schedule too).
  grouped_mm         da = grouped_mm_kn(dout, b), db = weight_grad_mm(dout, a).
  grouped_mm_swiglu, process_world_run, fused_forward_fp8
                     no backward of their own: backward raises a clear error
                     instead of leaving gradients silently None. (The process
                     world's layer, mok.distributed.FusedMoEWorld, has one:
                     mok/ep_backward.py, through an autograd.Function.)

The formulas are registered with torch.library (what torch.compile traces);
in eager mode mok.fused_forward reaches the same setup and backward functions
through mok/eager_autograd.py's autograd.Functions, which skip
torch.library's per-call wrapper (host time only; the same bits).

Recompute mode (save_activations=False, mok.fused_forward's default) with
MOK_BACKWARD=fused, on CUDA tensors, where autograd records the call (grad
mode on, some input requiring grad): mok.fused_forward runs
fused_forward_train(..., keep_preact=False) instead of the plain op (the same
out bits; the forward also keeps its schedule, ~0.44 MB per rank on the
DeepSeek-V3 slice) and the backward is the fused backward kernel in recompute
mode (torch.ops.mok.fused_backward with empty preact lists). Without grad, or
with MOK_BACKWARD unset, "auto" or "staged", recompute mode is unchanged: the
plain forward op and the staged backward.

Weight gradients reach autograd in the weights' dtype (bf16): the kernels
accumulate in fp32 and the staged backward rounds once. For fp32 gradient
accumulation over micro-batches (Megatron's main_grad), hang a float32
`main_grad` of the weight's shape on the weight (mok.nn.MoE(fp32_main_grad=
True) does): mok.fused_forward's backward then adds each weight gradient to
it (weight_grad_mm_acc_: one fp32 addition per element and call) and returns
no .grad for that weight. Double backward (create_graph=True) is not supported and raises.

Gradient accumulation into .grad, in place (the staged backward, one rank):
when a bf16 weight already has a .grad (the second and later micro-batches
of an accumulated step, or a zeroed .grad) and the backward running is one
that will add to it (loss.backward(), not autograd.grad), the weight-gradient
kernel adds its rounded sum to that .grad as it stores each tile and the
backward returns no gradient for the weight: the bits torch's accumulation
gives (bf16 sum rounded, added, rounded again; one exception: an expert that
got no token this call leaves its .grad as it is, where torch's addition of
+0.0 turns a -0.0 into +0.0), without a gradient tensor and torch's second
pass over it (~2 ms a layer of DeepSeek-V3's size). Not done
-- the gradient returned as usual -- when the weight has a tensor hook or a
post-accumulate-grad hook, under torch.compile, for a .grad that is not a
contiguous bf16 tensor of the weight's shape, or with MOK_GRAD_IN_PLACE=0
(read at each backward). A hook on the weight's AccumulateGrad node itself
(Node.register_hook) is not visible from here: it runs, but sees None as
the gradient; set MOK_GRAD_IN_PLACE=0 where such a hook needs it.

On one rank with the staged backward (save or recompute mode), eager mode
records the call as a C++ node instead (mok/eager_autograd.py, node_applies): the same
saved state, needs, main_grad and in-place decisions (plus: a hook on a
weight's AccumulateGrad node keeps torch's accumulation there) and gradient
bits, without Python in the backward.

MOK_BACKWARD (read when the forward runs, which decides what it keeps for the
backward): "auto" or unset, today the staged backward (the faster of the two
on one GPU, docs/perf-notes.md b5); "staged", the staged backward always;
"fused", the fused backward kernel in save mode and in recompute mode, raising
where it cannot run (non-CUDA tensors). The two give the same gradient bits (same
arithmetic per element, same sum orders), with one exception: in a virtual
world of R > 1 ranks the fused backward computes the shared expert's weight
gradients as one share per rank (each rank's tokens, as data parallelism
would) and adds the shares in rank order in fp32, where the staged backward
sums every token at once; the values agree to fp32 rounding, and at R = 1 the
bits are the same. With a main_grad on a shared weight at R > 1, each share is
added to it in turn (R additions per element instead of one).
"""

from __future__ import annotations

import os

import torch

from . import staged_backward

BACKWARD_UNAVAILABLE = (
    "mok: {op} has no backward of its own; {op} has no gradient. Call it on tensors that do not require grad "
    "(detach them, or run it under torch.no_grad()), or train through mok.fused_forward, mok.nn.MoE or "
    "mok.distributed.FusedMoEWorld, which have one.")

FP8_BACKWARD_UNAVAILABLE = (
    "mok: {op} has no backward yet (the FP8 backward is not built; only the bf16 layer trains). Call it on "
    "tensors that do not require grad (detach them, or run it under torch.no_grad()), or train with "
    "mok.fused_forward.")

NO_DOUBLE_BACKWARD = "mok: {op}'s backward has no backward of its own (create_graph=True is not supported)"


def _backward_unavailable(op_name: str):
    def backward(ctx, *grads):
        raise NotImplementedError(BACKWARD_UNAVAILABLE.format(op=op_name))
    return backward


def _fp8_backward_unavailable(op_name: str):
    def backward(ctx, *grads):
        raise NotImplementedError(FP8_BACKWARD_UNAVAILABLE.format(op=op_name))
    return backward


def _save_nothing(ctx, inputs, output):
    """Nothing to save: the backward raises."""


def _refuse_double_backward(op_name: str) -> None:
    # Autograd runs a backward with grad mode off unless create_graph=True;
    # the kernels record no graph, so a second-order gradient would be None.
    if torch.is_grad_enabled():
        raise NotImplementedError(NO_DOUBLE_BACKWARD.format(op=op_name))


def _fit(ctx, grads: tuple) -> tuple:
    """`grads` (one per op argument) cut to what torch expects back. torch 2.11
    drops the last argument (check_errors, or num_groups) twice from
    needs_input_grad for ops taking tensor lists and adds the None back itself;
    so return exactly as many entries as needs_input_grad has."""
    return grads[:len(ctx.needs_input_grad)]


# ---- fused_forward ----------------------------------------------------------
# Arguments: x, expert_ids, weights, w13, w2 (lists, one entry per rank),
# shared_w13, shared_w2, num_experts, tuning, check_errors, token_capacity
# (fused_forward_train: check_errors, keep_preact, token_capacity).

def _main_grads(w13, w2, shared_w13, shared_w2):
    """The fp32 `main_grad` buffers a trainer hung on the weights (one rank:
    the buffer must cover the whole tensor the backward computes)."""
    def main(t):
        m = getattr(t, "main_grad", None) if t is not None else None
        if m is not None and (m.dtype != torch.float32 or m.shape != t.shape or not m.is_contiguous()):
            raise ValueError(f"mok: main_grad of a {tuple(t.shape)} weight must be a contiguous float32 tensor of "
                             f"its shape (got {m.dtype} {tuple(m.shape)})")
        return m
    one = len(w13) == 1
    return staged_backward.MainGrads(main(w13[0]) if one else None, main(w2[0]) if one else None,
                                     main(shared_w13), main(shared_w2))


def _leaf_nodes(ctx) -> list:
    """(leaf, its AccumulateGrad node) for each leaf input of this backward's
    node, read from the node's own edges (ctx.next_functions): the node
    torch.autograd.graph.get_gradient_edge returns, without the view op that
    it records to find it (~35 us a weight on the autograd's device thread,
    docs/perf-notes.md v34)."""
    pairs = []
    for node, _ in getattr(ctx, "next_functions", ()):
        leaf = getattr(node, "variable", None)  # AccumulateGrad's; None for other nodes and absent edges
        if leaf is not None:
            pairs.append((leaf, node))
    return pairs


def _accumulate_grad_node(weight: torch.Tensor, leaf_nodes):
    """weight's AccumulateGrad node: from leaf_nodes (_leaf_nodes) when it is
    there, else through get_gradient_edge."""
    for leaf, node in leaf_nodes:
        if leaf is weight:
            return node
    return torch.autograd.graph.get_gradient_edge(weight).node


def _grad_in_place(weight: torch.Tensor | None, leaf_nodes=list) -> torch.Tensor | None:
    """weight's .grad if this backward may add weight's gradient to it in
    place and return none (see the module docstring), else None. leaf_nodes:
    a function giving _leaf_nodes(ctx) of the backward's node, where the
    weight's node is looked up first (called only for a weight that passes
    every other check)."""
    if weight is None or not weight.is_leaf or not weight.requires_grad or weight.dtype != torch.bfloat16:
        return None
    grad = weight.grad
    if (grad is None or grad.dtype != torch.bfloat16 or grad.shape != weight.shape or grad.device != weight.device
            or grad.layout != torch.strided or not grad.is_contiguous() or grad.requires_grad
            or grad.data_ptr() % 16):
        return None
    if weight._backward_hooks or getattr(weight, "_post_accumulate_grad_hooks", None):
        return None
    try:  # autograd.grad() collects the gradient instead of running the weight's AccumulateGrad
        node = _accumulate_grad_node(weight, leaf_nodes())
        return grad if torch._C._will_engine_execute_node(node) else None
    except RuntimeError:  # "... currently running autograd.grad()": the weight is one of its inputs
        return None


def _with_grads_in_place(main: staged_backward.MainGrads, needs: staged_backward.Needs, w13, w2, shared_w13,
                         shared_w2, ctx=None) -> staged_backward.MainGrads:
    """main, with each needed weight gradient that has no main_grad going to
    the weight's .grad in place where _grad_in_place allows it. ctx: the
    backward's node, whose edges hold the weights' AccumulateGrad nodes."""
    if os.environ.get("MOK_GRAD_IN_PLACE", "1") == "0" or torch.compiler.is_compiling():
        return main
    read = []  # the node's edges, read once, and only if some weight gets that far

    def leaf_nodes():
        if not read:
            read.append(_leaf_nodes(ctx) if ctx is not None else [])
        return read[0]

    fields = []
    for buffer, weight, needed in ((main.w13, w13, needs.w13), (main.w2, w2, needs.w2),
                                   (main.shared_w13, shared_w13, needs.shared_w13),
                                   (main.shared_w2, shared_w2, needs.shared_w2)):
        fields.append(buffer if buffer is not None or not needed else _grad_in_place(weight, leaf_nodes))
    return staged_backward.MainGrads(*fields)


def _setup_fused_forward(ctx, inputs, output, kept=()):
    x, expert_ids, weights, w13, w2, shared_w13, shared_w2, _, tuning = inputs[:9]  # then check_errors (keep_preact)
    # Outputs the loss does not reach get None, not zeros: the training op's
    # kept outputs (non-differentiable) would otherwise each get a zero
    # gradient of their size, the pre-activations' alone [saved rows, 2I] bf16
    # (300 MB on the DeepSeek-V3 slice), allocated and cleared before every
    # backward for nothing. The backwards take None for an unused out.
    ctx.set_materialize_grads(False)
    ctx.world = len(x)
    ctx.main_grads = _main_grads(w13, w2, shared_w13, shared_w2)
    ctx.tuning_is_empty_list = len(tuning) == 0  # its "gradient" must mirror that (see _fit)
    ctx.save_for_backward(*x, *expert_ids, *weights, *w13, *w2, shared_w13, shared_w2, *kept)


def _cat(tensors):
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _split(t, sizes, like, wanted):
    """t split along dim 0 into `sizes`, each in its `like` tensor's dtype, None where not wanted."""
    if t is None:
        return [None] * len(sizes)
    return [p.to(ref.dtype) if want else None for p, ref, want in zip(t.split(sizes), like, wanted)]


def _weight_grad_dtype(weight):
    """bf16 weights get their gradients from the kernel already rounded (one
    rounding of the fp32 sum, no fp32 copy); any other dtype gets fp32, cast by _split."""
    return torch.bfloat16 if weight.dtype == torch.bfloat16 else None


BACKWARD_MODES = ("auto", "fused", "staged")


def backward_path(device: torch.device) -> str:
    """"fused" or "staged": the backward that save mode (and, when "fused",
    recompute mode: fused_recompute) gets for tensors on
    `device` under the current MOK_BACKWARD (see the module docstring). The
    fused backward needs CUDA tensors (a virtual world on one GPU: this
    autograd never sees the process world, whose layer has its own backward,
    mok/ep_backward.py) and a library that registers mok::fused_backward."""
    mode = os.environ.get("MOK_BACKWARD", "").strip().lower() or "auto"
    if mode not in BACKWARD_MODES:
        raise ValueError(f"mok: MOK_BACKWARD = {mode!r}: expected one of {', '.join(BACKWARD_MODES)}")
    # "auto" is the staged backward for now: on one H200 it is the faster of
    # the two (DeepSeek-V3 slice, bench_backward --save: 11.3 ms against the
    # fused kernel's 12.2 ms; docs/perf-notes.md b5), the fused kernel having
    # no inter-GPU traffic to hide there and 8 of its 132 SMs on the dispatch.
    if mode in ("staged", "auto"):
        return "staged"
    runs = device.type == "cuda" and hasattr(torch.ops.mok, "fused_backward")
    if mode == "fused" and not runs:
        from . import LIBRARY_PATH
        raise RuntimeError(f"mok: MOK_BACKWARD=fused, but the fused backward cannot run here: it needs CUDA tensors "
                           f"(got {device}) and a library with the mok::fused_backward op ({LIBRARY_PATH} "
                           f"{'has' if hasattr(torch.ops.mok, 'fused_backward') else 'lacks'} it)")
    return "fused" if runs else "staged"


def records_grad(*groups) -> bool:
    """Whether autograd records a call on these arguments: grad mode on, and
    some tensor of `groups` (lists of tensors, tensors, or None) requires grad."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad
               for group in groups for t in (group if isinstance(group, (list, tuple)) else [group]))


def fused_recompute(x, *differentiable, recorded: bool | None = None) -> bool:
    """Whether mok.fused_forward in recompute mode (save_activations=False)
    runs fused_forward_train(..., keep_preact=False) for the fused backward
    kernel's recompute mode: autograd records the call (records_grad of x and
    `differentiable`, or `recorded` when the caller has it already) and
    backward_path is "fused" (MOK_BACKWARD=fused; CUDA tensors, else it
    raises). Otherwise the plain op and the staged backward. Read when the
    forward runs; under torch.compile, when it is traced."""
    if not (records_grad(x, *differentiable) if recorded is None else recorded):
        return False
    if not isinstance(x, (list, tuple)) or not x or not isinstance(x[0], torch.Tensor):
        return False  # malformed: the plain op names what is wrong
    return backward_path(x[0].device) == "fused"


def _setup_fused_forward_train(ctx, inputs, output):
    # Kept: the pre-activations (preact, shared_preact: a tensor per rank
    # each) and the forward's schedule. For the fused backward, as the
    # training op returned it (the op puts it back into each rank's pass
    # state). For the staged one, turned here into the grouped kernels'
    # Schedule (staged_backward.saved_schedule): building it here rather than
    # in the backward puts its ~25 small launches behind the fused forward on
    # the stream, where the host is far ahead of the GPU, instead of in front
    # of the backward's first kernel.
    #
    # keep_preact=False (recompute mode): preact and shared_preact are empty
    # lists. The fused backward keeps the schedule (its recompute mode); the
    # staged one keeps nothing but the inputs and recomputes everything, as
    # for the plain op.
    x, expert_ids = inputs[0], inputs[1]
    preact, shared_preact = list(output[1]), list(output[2])
    for t in (t for group in output[1:] for t in group):
        ctx.mark_non_differentiable(t)
    ctx.fused = backward_path(x[0].device) == "fused"
    ctx.keep_preact = bool(inputs[10]) if len(inputs) > 10 else True
    ctx.tuning = list(inputs[8])
    ctx.check_errors = bool(inputs[9])
    ctx.token_capacity = int(inputs[11]) if len(inputs) > 11 else 0  # the forward's object: the backward's too
    if ctx.fused:
        _setup_fused_forward(ctx, inputs, output, [t for group in output[1:] for t in group])
        return
    if not ctx.keep_preact:
        _setup_fused_forward(ctx, inputs, output)
        return
    schedule = staged_backward.saved_schedule(staged_backward.SavedForward(*(list(g) for g in output[1:])),
                                              [t.shape[0] for t in x], expert_ids[0].shape[1])
    _setup_fused_forward(ctx, inputs, output, [*preact, *shared_preact, *schedule])


def _operand(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in `dtype`, contiguous, starting on a 16-byte boundary as the kernels
    read it (a view at an odd offset is copied)."""
    t = t.to(dtype).contiguous()
    return t.clone() if (t.storage_offset() * t.element_size()) % 16 else t


def _fused_kernel_backward(ctx, douts):
    """The backward through torch.ops.mok.fused_backward: one pass of the
    fused kernel over every rank, in save mode, or in recompute mode when the
    forward kept no pre-activations (ctx.keep_preact false: empty preact
    lists); the same gradients, dtypes and Nones as the staged backward's
    (_fused_forward_backward). The kernel computes every gradient; those not
    needed are dropped. A weight gradient goes to the weight's main_grad
    (ctx.main_grads) when it has one and is needed."""
    _refuse_double_backward("mok.fused_forward")
    R = ctx.world
    saved = ctx.saved_tensors
    x, _, weights, w13, w2 = (list(saved[i * R:(i + 1) * R]) for i in range(5))
    shared_w13, shared_w2 = saved[5 * R], saved[5 * R + 1]
    kept = list(saved[5 * R + 2:])
    if ctx.keep_preact:
        preact, shared_preact, kept = kept[:R], kept[R:2 * R], kept[2 * R:]
    else:  # recompute mode: the schedule only (empty preact lists select it)
        preact, shared_preact = [], []
    expert_rows, expert_offset, schedule_rows = (kept[i * R:(i + 1) * R] for i in range(3))
    need = ctx.needs_input_grad
    main = ctx.main_grads
    main_w13 = main.w13 if any(need[3]) else None
    main_w2 = main.w2 if any(need[4]) else None
    main_sw13 = main.shared_w13 if need[5] else None
    main_sw2 = main.shared_w2 if need[6] else None
    # An output the loss does not use may come back as None.
    douts = [_operand(torch.zeros_like(t) if d is None else d, t.dtype) for d, t in zip(douts, x)]
    dx, dweights, dw13, dw2, dsw13, dsw2 = torch.ops.mok.fused_backward(
        x, [w.float().contiguous() for w in weights], w13, w2, shared_w13, shared_w2, preact, shared_preact,
        expert_rows, expert_offset, schedule_rows, douts, ctx.tuning, main_w13, main_w2, main_sw13, main_sw2,
        ctx.check_errors, bf16_weight_grads=w13[0].dtype == torch.bfloat16, token_capacity=ctx.token_capacity)
    tokens = [t.shape[0] for t in x]
    experts = [t.shape[0] for t in w13]

    def routed(grad, main_grad, like, wanted):
        # fp32 from the kernel, rounded once to a bf16 weight's dtype (the
        # staged backward's weight_grad_mm(out_dtype=bf16) gives those bits);
        # or already rounded by the kernel (bf16_weight_grads: the same bits).
        return [None] * R if main_grad is not None else _split(grad, experts, like, wanted)

    def shared(grad, main_grad, like, wanted):
        return None if like is None or not wanted or main_grad is not None else grad.to(like.dtype)

    result = (_split(dx, tokens, x, need[0]), [None] * R, _split(dweights, tokens, weights, need[2]),
              routed(dw13, main_w13, w13, need[3]), routed(dw2, main_w2, w2, need[4]),
              shared(dsw13, main_sw13, shared_w13, need[5]), shared(dsw2, main_sw2, shared_w2, need[6]),
              None, [] if ctx.tuning_is_empty_list else None, None, None, None)
    # ..., num_experts, tuning, check_errors, keep_preact (the training op), token_capacity
    return _fit(ctx, result)


def _fused_forward_train_backward(ctx, douts, *unused):
    if ctx.fused:
        return _fused_kernel_backward(ctx, douts)
    if not ctx.keep_preact:  # nothing kept but the inputs: the staged backward recomputes
        return _fused_forward_backward(ctx, douts)
    R = ctx.world
    saved = ctx.saved_tensors  # unpacked once: each access checks and wraps every saved tensor again
    kept = saved[5 * R + 2:]
    preact, shared_preact = list(kept[:R]), list(kept[R:2 * R])
    schedule = staged_backward.Schedule(*kept[2 * R:])
    return _fused_forward_backward(ctx, douts, staged_backward.SavedForward(preact, shared_preact, None, None, None),
                                   schedule, saved)


def _fused_forward_backward(ctx, douts, kept=None, schedule=None, saved=None):
    _refuse_double_backward("mok.fused_forward")
    R = ctx.world
    saved = ctx.saved_tensors if saved is None else saved
    x, expert_ids, weights, w13, w2 = (list(saved[i * R:(i + 1) * R]) for i in range(5))
    shared_w13, shared_w2 = saved[5 * R], saved[5 * R + 1]
    need = ctx.needs_input_grad
    needs = staged_backward.Needs(x=any(need[0]), weights=any(need[2]), w13=any(need[3]), w2=any(need[4]),
                                  shared_w13=bool(need[5]), shared_w2=bool(need[6]))
    # An output the loss does not use may come back as None.
    douts = [torch.zeros_like(t) if d is None else d for d, t in zip(douts, x)]
    # The virtual world's ranks concatenated: global token order, global experts.
    main = ctx.main_grads
    if R == 1:  # (at R > 1 each rank's weights are a slice of the gradient the kernels compute)
        main = _with_grads_in_place(main, needs, w13[0], w2[0], shared_w13, shared_w2, ctx)
    grads = staged_backward.layer_backward(
        _cat(douts), _cat(x), _cat(expert_ids), _cat(weights), _cat(w13), _cat(w2), shared_w13, shared_w2,
        needs=needs, grad_dtype=_weight_grad_dtype(w13[0]), saved=kept, tokens_per_rank=[t.shape[0] for t in x],
        main_grads=main, schedule=schedule)
    tokens = [t.shape[0] for t in x]
    experts = [t.shape[0] for t in w13]
    result = (_split(grads.dx, tokens, x, need[0]), [None] * R, _split(grads.dweights, tokens, weights, need[2]),
              _split(grads.dw13, experts, w13, need[3]), _split(grads.dw2, experts, w2, need[4]),
              None if grads.dshared_w13 is None else grads.dshared_w13.to(shared_w13.dtype),
              None if grads.dshared_w2 is None else grads.dshared_w2.to(shared_w2.dtype),
              None, [] if ctx.tuning_is_empty_list else None, None, None, None)
    # ..., num_experts, tuning, check_errors, keep_preact (the training op), token_capacity
    return _fit(ctx, result)


# ---- grouped_mm -------------------------------------------------------------

def _setup_grouped_mm(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # a, b, group_offset, group_rows


def _grouped_mm_backward(ctx, dout):
    """out[rows of g] = a[rows] b[g]^T: da = dout b[g] (zero on padding rows,
    whose output no row of a reaches), db[g] = dout[rows]^T a[rows]."""
    _refuse_double_backward("mok.grouped_mm")
    a, b, group_offset, group_rows = ctx.saved_tensors
    ops = staged_backward.ops_for(a.device)
    dout = dout.to(a.dtype).contiguous()
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    da = ops.grouped_mm_kn(dout, b, group_offset, group_rows) if need_a else None
    db = (ops.weight_grad_mm(dout, a, group_offset, group_rows, b.shape[0], _weight_grad_dtype(b)).to(b.dtype)
          if need_b else None)
    return _fit(ctx, (da, db, None, None))


def register() -> None:
    """Registers the autograd formulas (once, at import of mok)."""
    torch.library.register_autograd("mok::fused_forward", _fused_forward_backward,
                                    setup_context=_setup_fused_forward)
    torch.library.register_autograd("mok::fused_forward_train", _fused_forward_train_backward,
                                    setup_context=_setup_fused_forward_train)
    torch.library.register_autograd("mok::grouped_mm", _grouped_mm_backward, setup_context=_setup_grouped_mm)
    for name in ("grouped_mm_swiglu", "process_world_run"):
        torch.library.register_autograd("mok::" + name, _backward_unavailable("mok." + name),
                                        setup_context=_save_nothing)
    if hasattr(torch.ops.mok, "fused_forward_fp8"):  # a library built before the op lacks it
        torch.library.register_autograd("mok::fused_forward_fp8", _fp8_backward_unavailable("mok.fused_forward_fp8"),
                                        setup_context=_save_nothing)
