"""Train a transformers MoE causal LM on text, with transformers' "grouped_mm"
experts and with mok's, in one script, and compare.

The model is a Qwen3-MoE built from a config (random weights, nothing
downloaded), byte-level (vocabulary 256), trained on this repository's own
docs and sources. Three runs on the same batches from the same initial
weights and with the same settings: grouped_mm, mok, and mok again (the two
mok runs must give bitwise identical losses). mok's experts: the fused forward
megakernel and the backward that mok.hf's autograd runs (the staged backward
by default; MOK_BACKWARD=fused for the fused backward kernel).

The rest of the step is set up the way a training stack runs it, identically
for both backends:
  - attention: transformers' "sdpa" implementation pinned to torch's flash
    kernel, whose backward runs in torch's strict deterministic mode (see
    flash_sdpa_attention below for why that is needed); --attn eager for
    transformers' eager attention;
  - optimizer: torch.optim.AdamW with fused=True (one multi-tensor CUDA kernel,
    elementwise and so deterministic); --optim foreach for torch's default;
  - torch in deterministic mode (warn only) and deterministic cuBLAS, so that
    the whole step -- not only mok -- is repeatable;
  - each step's loss read once the next step is queued (the progress bar
    shows it a step late), so the GPU's queue never empties between steps.

Reported: the configuration, a progress bar per run, tokens/s (after warm-up
steps), the loss curves side by side, the largest gap between mok's and
grouped_mm's loss, and a PNG of the curves (matplotlib, when installed). With
--profile, after the timed steps, a few more steps per backend measure the MoE
experts' share of a step (CUDA events at the experts modules' forward and
backward hooks) and list the top kernels (torch.profiler).

  python3 examples/train_moe_lm.py                 # small: H 1024, I 512, 32 experts, top-8, 2 layers
  python3 examples/train_moe_lm.py --size dsv3     # DeepSeek-V3's per-GPU MoE size: H 7168, I 2048, 32 experts, top-8
  python3 examples/train_moe_lm.py --size dsv3 --steps 12 --warmup 4 --profile
  python3 examples/train_moe_lm.py --size dsv3 --accum 1   # AdamW after every micro-batch
  python3 examples/train_moe_lm.py --size dsv3 --compile   # both models under torch.compile

A step is one optimizer step over --accum micro-batches of --batch x --seq
tokens, their gradients summed before AdamW, as large-scale trainers do. By
default (ACCUM below) one micro-batch at the small size, and 8 at the dsv3
size, about what a GPU processed per optimizer step in DeepSeek-V3's own
training; AdamW, memory-bound over every parameter, takes ~15 ms, a fifth of
a one-micro-batch step at that size (--accum 1). From the second micro-batch
on, torch adds each gradient to .grad (a pass over every parameter's
gradient), except where mok's backward adds its expert weights' gradients to
.grad itself as its kernel stores them (mok/autograd.py: the same bits);
grouped_mm's go through torch's addition.

Needs one Hopper GPU and transformers (from a source tree: scripts/build.sh first).
"""
from __future__ import annotations

import argparse
import contextlib
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
# AdamW's default learning rate by size. There is no warm-up: at the dsv3
# size 3e-4 sent the loss from 6.8 to ~29 nats a byte at the first step and
# left it at ~22 after 8; 5e-5 took it to 3.66 in 16 steps, after a bump to
# ~8 in the first few (docs/perf-notes.md v21).
LR = {"small": 3e-4, "dsv3": 5e-5}
# Micro-batches per optimizer step by size. At the dsv3 size a micro-batch is
# 4096 tokens, and DeepSeek-V3's own training stepped its optimizer once per
# 15,360 sequences of 4,096 tokens over 2,048 GPUs: ~30,700 tokens a GPU even
# before pipeline parallelism multiplies the tokens each stage sees per step.
# So 8 micro-batches (32,768 tokens) is the real ratio of layer work to
# optimizer work, and still on the optimizer-heavy side; AdamW at every
# micro-batch (--accum 1) would update ~3 B parameters every 4,096 tokens.
ACCUM = {"small": 1, "dsv3": 8}

# The name under which flash_sdpa_attention is registered with transformers
# (without "flash" in it: transformers would take the name for a flash-attn kernel).
FLASH_SDPA = "sdpa_deterministic"
ATTENTION = {  # --attn -> (transformers attn_implementation, what the header says)
    "sdpa": (FLASH_SDPA, "sdpa (torch flash kernel, deterministic backward)"),
    "eager": ("eager", "eager"),
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


# --- attention: sdpa with a deterministic backward ---------------------------
#
# Under torch.use_deterministic_algorithms(True, warn_only=True) -- the mode
# this example runs in, because transformers' grouped_mm experts call
# torch.histc on CUDA, which has no deterministic kernel and would raise in
# strict mode -- none of sdpa's fused CUDA backends has a deterministic
# backward (torch's aten/src/ATen/native/transformers/cuda/
# attention_backward.cu): the flash backward passes deterministic=true to the
# FlashAttention-2 kernels only in strict mode (warn_only=False); with
# warn_only=True it warns once and accumulates dQ with atomic adds across key
# blocks, so dQ's fp32 sums, and the bf16 gradients rounded from them, change
# from run to run. The memory-efficient backward likewise keeps its split-key
# accumulation unless strict. cuDNN's backward has no deterministic switch in
# torch: it warns in warn-only mode, and strict mode leaves cuDNN out of the
# selection (cuda/sdp_utils.cpp, check_cudnn_deterministic) -- which matters
# here, since on sm90 with cuDNN > 9.15 recent torch tries cuDNN before flash.
# Only the math backend is deterministic in warn-only mode, and it
# materialises the attention matrix as eager does.
#
# So flash_sdpa_attention runs transformers' own sdpa function with the
# backends limited to flash (torch.nn.attention.sdpa_kernel: an error instead
# of a silent switch to another backend), and runs that function's backward --
# only that -- in strict deterministic mode, where the flash backward takes
# FlashAttention-2's deterministic path (dQ accumulated per fixed split, the
# splits summed in a fixed order; the GQA dK/dV sums over query heads are
# plain reductions). The flash forward has no atomics. The rest of the step
# stays in warn-only mode, the same for both backends, and the "two mok runs,
# bitwise identical" check covers attention too: a non-deterministic kernel
# anywhere in the step would, in all likelihood, show up as two loss curves
# that differ.


@contextlib.contextmanager
def strict_determinism():
    """torch.use_deterministic_algorithms(True) (errors, not warnings) inside; the previous mode after."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


class _StrictBackward(torch.autograd.Function):
    """fn(*tensors), with the backward of fn's own graph run under strict_determinism().

    The forward records fn's graph from detached copies of the inputs; the
    backward differentiates that graph with torch.autograd.grad inside the
    strict window, so no other op of the step runs in it.
    """

    @staticmethod
    def forward(ctx, fn, *tensors):
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
        with torch.enable_grad():
            out = fn(*leaves)
        ctx.graph = (leaves, out)
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        leaves, out = ctx.graph
        del ctx.graph
        wanted = [t for t in leaves if t.requires_grad]
        with strict_determinism():
            grads = iter(torch.autograd.grad(out, wanted, grad))
        return (None, *(next(grads) if t.requires_grad else None for t in leaves))


def flash_sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention on torch's flash kernel, with a deterministic backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def run(q, k, v):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return sdpa_attention_forward(module, q, k, v, attention_mask, **kwargs)[0]

    if not torch.is_grad_enabled() or not any(t.requires_grad for t in (query, key, value)):
        return run(query, key, value), None
    return _strict_backward_apply(run, query, key, value), None


# torch.compile (--compile) runs this part eagerly, a graph break at each
# attention: Dynamo would trace _StrictBackward's forward without the graph
# its backward differentiates.
@torch.compiler.disable
def _strict_backward_apply(fn, *tensors):
    return _StrictBackward.apply(fn, *tensors)


def causal_mask_or_none(*args, **kwargs):
    """sdpa's mask for flash_sdpa_attention: None (sdpa's is_causal) for a plain
    causal mask without padding, sdpa_mask's mask otherwise.

    transformers' sdpa_mask returns None in that case too, but not while
    torch.compile traces the model (it cannot tell there that the mask is
    plain causal, and builds it); a built mask keeps torch's flash kernel
    out, which flash_sdpa_attention pins. The batches here have no padding
    and no cache, so the conditions below hold at every call, compiled or not.
    """
    from transformers.masking_utils import causal_mask_function, sdpa_mask
    q_length = kwargs.get("q_length")
    if q_length is None and kwargs.get("cache_position") is not None:  # transformers before q_length
        q_length = kwargs["cache_position"].shape[0]
    plain_causal = (not args and kwargs.get("attention_mask") is None and kwargs.get("local_size") is None
                    and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
                    and kwargs.get("allow_is_causal_skip", True) and not kwargs.get("q_offset", 0)
                    and not kwargs.get("kv_offset", 0) and q_length is not None
                    and q_length == kwargs.get("kv_length"))
    return None if plain_causal else sdpa_mask(*args, **kwargs)


def register_attention() -> None:
    """Registers flash_sdpa_attention with transformers, with causal_mask_or_none for its mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(FLASH_SDPA, flash_sdpa_attention)
    AttentionMaskInterface.register(FLASH_SDPA, causal_mask_or_none)


# --- model, step, training ---------------------------------------------------

def is_experts(module: torch.nn.Module) -> bool:
    return hasattr(module, "gate_up_proj") and hasattr(module, "down_proj")


def build_model(size: str, implementation: str, attention: str, device):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    hidden, inter, experts, top_k, layers, heads = SIZES[size]
    config = Qwen3MoeConfig(vocab_size=256, hidden_size=hidden, intermediate_size=4 * inter,
                            moe_intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=max(1, heads // 8), head_dim=128, num_experts=experts,
                            num_experts_per_tok=top_k, decoder_sparse_step=1, max_position_embeddings=4096,
                            norm_topk_prob=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, experts_implementation=implementation,
                                             attn_implementation=ATTENTION[attention][0])
    gen = torch.Generator().manual_seed(1)
    for module in model.modules():  # from_config leaves the experts' weights uninitialised
        if is_experts(module):
            torch.nn.init.normal_(module.gate_up_proj, std=hidden ** -0.5, generator=gen)
            torch.nn.init.normal_(module.down_proj, std=inter ** -0.5, generator=gen)
    return model.to(device=device, dtype=torch.bfloat16)


def make_optimizer(model, lr: float, kind: str):
    """AdamW, fused (one multi-tensor kernel for all parameters) or foreach (torch's default on CUDA)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=kind == "fused",
                             foreach=kind == "foreach")


def step(model, opt, micro) -> torch.Tensor:
    """One optimizer step over the micro-batches `micro`: each one's forward and
    backward (its loss scaled by 1 / len(micro), the gradients summed in the
    parameters' .grad), then the optimizer; returns their mean loss."""
    opt.zero_grad(set_to_none=True)
    total = None
    for chunk in micro:
        loss = model(input_ids=chunk, labels=chunk).loss  # the model shifts the labels itself
        (loss / len(micro)).backward()
        total = loss.detach() if total is None else total + loss.detach()
    opt.step()
    return total / len(micro)


def train(name, model, data, lr, warmup, optim, profile_steps=0, top_kernels=0):
    try:
        from tqdm import tqdm
    except ImportError:
        def tqdm(it, **_):
            return it
    opt = make_optimizer(model, lr, optim)
    losses, tokens, start, pending = [], 0, None, None
    bar = tqdm(data, desc=f"{name:>10}", unit="step", dynamic_ncols=True)
    for i, micro in enumerate(bar):
        if i == warmup:
            torch.cuda.synchronize()
            start, tokens = time.perf_counter(), 0
        loss = step(model, opt, micro)
        tokens += sum(chunk.numel() for chunk in micro)
        # Each loss is read one step late, once the next step is queued, as
        # training stacks log: reading it at once would empty the GPU's queue
        # every step and leave the GPU idle while the host queues the next
        # forward (its Python runs slower than the forward's kernels).
        if pending is not None:
            losses.append(pending.item())
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
        pending = loss
    if pending is not None:
        losses.append(pending.item())  # the bar has closed: the summary below prints the last loss
    torch.cuda.synchronize()
    rate = tokens / (time.perf_counter() - start) if start is not None else float("nan")
    # Profiling runs after the timed steps (its hooks and the profiler cost time),
    # as further training steps on the first batches; the losses above are final.
    profile = profile_run(model, opt, data[:profile_steps], top_kernels) if profile_steps else None
    return losses, rate, profile


# --- --profile: the experts' share of a step, and the top kernels --------------

class ExpertsTimer:
    """CUDA events at every experts module's forward (pre-hook, hook) and backward (full backward pre-hook, hook).

    The backward interval runs from the gradient of the module's output being
    ready to the gradients of its inputs (hidden states, routing weights) being
    computed: the experts' data and weight gradients, whichever backend runs
    them. The router, attention and the rest are outside both intervals.
    """

    def __init__(self, model):
        self.events = {"forward": [], "backward": []}
        self.handles = []
        for module in model.modules():
            if is_experts(module):
                self.handles += [
                    module.register_forward_pre_hook(lambda *_: self._mark("forward")),
                    module.register_forward_hook(lambda *_: self._mark("forward")),
                    module.register_full_backward_pre_hook(lambda *_: self._mark("backward")),
                    module.register_full_backward_hook(lambda *_: self._mark("backward")),
                ]

    def _mark(self, kind):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events[kind].append(event)

    def take_ms(self) -> dict:
        """Milliseconds per kind since the last call (after a synchronize), and the events cleared."""
        totals = {}
        for kind, events in self.events.items():
            if len(events) % 2:
                raise RuntimeError(f"unpaired {kind} events in the experts timer")
            totals[kind] = sum(a.elapsed_time(b) for a, b in zip(events[0::2], events[1::2]))
            events.clear()
        return totals

    def remove(self):
        for handle in self.handles:
            handle.remove()


def profile_run(model, opt, data, top_kernels) -> dict:
    """Times len(data) steps with ExpertsTimer, then profiles them again with torch.profiler.

    Each step starts from an idle GPU. Also kept: the host's time to enqueue a
    step (until step() returns, before anything waits for the GPU), and the
    caching allocator's device allocations, frees and retries over the steps
    (a cudaMalloc or cudaFree inside a step stalls the host on the GPU). A
    step whose host time reaches its GPU time is host-bound: then faster
    kernels leave the GPU idle instead of shortening the step.
    """
    timer = ExpertsTimer(model)
    step_ms, host_ms, experts = 0.0, 0.0, {"forward": 0.0, "backward": 0.0}
    before = torch.cuda.memory_stats()
    try:
        for micro in data:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            started = time.perf_counter()
            step(model, opt, micro)
            host_ms += (time.perf_counter() - started) * 1e3
            end.record()
            torch.cuda.synchronize()
            step_ms += begin.elapsed_time(end)
            for kind, ms in timer.take_ms().items():
                experts[kind] += ms
    finally:
        timer.remove()
    after = torch.cuda.memory_stats()
    result = {"steps": len(data), "step_ms": step_ms / len(data), "host_ms": host_ms / len(data),
              "allocator": {key: after.get(key, 0) - before.get(key, 0)
                            for key in ("num_device_alloc", "num_device_free", "num_alloc_retries")},
              "experts_forward_ms": experts["forward"] / len(data),
              "experts_backward_ms": experts["backward"] / len(data), "kernels": []}
    if top_kernels:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for micro in data:
                step(model, opt, micro)
            torch.cuda.synchronize()
        totals = {}
        for event in prof.events():  # kernels and copies (not the ranges of user annotations)
            if event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False):
                us, calls = totals.get(event.name, (0.0, 0))
                totals[event.name] = (us + event.time_range.elapsed_us(), calls + 1)
        result["kernel_ms"] = sum(us for us, _ in totals.values()) / 1e3 / len(data)
        result["kernels"] = sorted(((us / 1e3 / len(data), calls / len(data), name)
                                    for name, (us, calls) in totals.items()), reverse=True)[:top_kernels]
    return result


def print_profile(name: str, p: dict) -> None:
    fwd, bwd, total = p["experts_forward_ms"], p["experts_backward_ms"], p["step_ms"]
    print(f"\n{name}: {p['steps']} profiled steps, {total:.2f} ms a step (CUDA events; hooks on); MoE experts "
          f"{fwd + bwd:.2f} ms = {100 * (fwd + bwd) / total:.1f}% of the step (forward {fwd:.2f} ms, backward "
          f"{bwd:.2f} ms); the rest {total - fwd - bwd:.2f} ms")
    print(f"  the host enqueues a step in {p['host_ms']:.2f} ms (step() returning); the caching allocator over the "
          f"{p['steps']} steps: " + ", ".join(f"{key} {value}" for key, value in p["allocator"].items()))
    if p["kernels"]:
        print(f"  top {len(p['kernels'])} kernels (torch.profiler; GPU kernel time {p['kernel_ms']:.2f} ms a step):")
        print(f"  {'ms/step':>8} {'%':>5} {'calls':>6}  kernel")
        for ms, calls, kernel in p["kernels"]:
            short = kernel if len(kernel) <= 100 else kernel[:97] + "..."
            print(f"  {ms:8.3f} {100 * ms / p['kernel_ms']:5.1f} {calls:6.0f}  {short}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--accum", type=int, default=None,
                        help="micro-batches per optimizer step (gradient accumulation), each --batch x --seq tokens: "
                             "large-scale trainers step the optimizer once per many micro-batches, which spreads its "
                             f"cost (~15 ms at --size dsv3) over them (default by size: {ACCUM})")
    parser.add_argument("--lr", type=float, default=None, help=f"AdamW's learning rate (default by size: {LR})")
    parser.add_argument("--warmup", type=int, default=5, help="steps not counted in tokens/s")
    parser.add_argument("--plot", default="train_moe_lm.png", help="PNG of the loss curves ('' for none)")
    parser.add_argument("--baseline", choices=("grouped_mm", "eager"), default="grouped_mm",
                        help="transformers' experts implementation to compare with")
    parser.add_argument("--mode", choices=("save", "recompute"), default="save",
                        help="mok's backward mode: the forward keeps gate/up (save) or the backward recomputes them")
    parser.add_argument("--attn", choices=sorted(ATTENTION), default="sdpa",
                        help="attention: transformers' sdpa on torch's flash kernel with a deterministic backward "
                             "(default), or transformers' eager attention")
    parser.add_argument("--optim", choices=("fused", "foreach"), default="fused",
                        help="torch.optim.AdamW's implementation: fused=True (default) or foreach=True")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each model (Inductor; both backends alike): the elementwise work "
                             "around the layers fused, fewer launches; attention stays eager (a graph break each)")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed steps, time the MoE experts' share of a step and list the top kernels "
                             "(the baseline and the first mok run)")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps --profile measures (each twice)")
    parser.add_argument("--top-kernels", type=int, default=15, help="kernels --profile lists (0: none)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA (Hopper) GPU")
    args.accum = ACCUM[args.size] if args.accum is None else args.accum
    if args.accum < 1:
        sys.exit("--accum must be >= 1")
    lr = LR[args.size] if args.lr is None else args.lr
    if args.profile and not 0 < args.profile_steps <= args.steps:
        sys.exit(f"--profile-steps must be in 1..--steps ({args.steps})")
    device = torch.device("cuda")
    # Ops without a deterministic CUDA kernel warn (and would show up as two
    # mok runs that differ) instead of stopping the comparison; strict mode
    # would stop it: grouped_mm's experts call torch.histc. Attention's
    # backward is made deterministic on its own (flash_sdpa_attention).
    torch.use_deterministic_algorithms(True, warn_only=True)
    mok.hf.register(save_activations=args.mode == "save")
    register_attention()
    text = corpus(device)
    chunks = batches(text, args.steps * args.accum, args.batch, args.seq, seed=2)
    data = [chunks[i:i + args.accum] for i in range(0, len(chunks), args.accum)]
    hidden, inter, experts, top_k, layers, heads = SIZES[args.size]
    print(f"corpus: {text.numel() / 1e6:.2f} MB of this repository's text; {args.batch * args.seq} tokens per "
          f"micro-batch, {args.accum} micro-batch(es) per optimizer step, AdamW lr {lr:g}; size {args.size}: "
          f"hidden {hidden}, MoE intermediate {inter}, {experts} experts, top-{top_k}, "
          f"{layers} layers, {heads} heads; attention {ATTENTION[args.attn][1]}; optimizer AdamW ({args.optim}); "
          f"torch deterministic (warn only); mok's backward in {args.mode} mode", flush=True)
    runs = {}
    base = args.baseline
    for name, implementation in ((base, base), ("mok", "mok"), ("mok again", "mok")):
        model = build_model(args.size, implementation, args.attn, device)
        if args.compile:
            model.compile()  # compiled at the first steps (warm-up steps: not counted in tokens/s)
        profile_steps = args.profile_steps if args.profile and name != "mok again" else 0
        runs[name] = train(name, model, data, lr, args.warmup, args.optim, profile_steps, args.top_kernels)
        del model
        torch.cuda.empty_cache()

    (ref, ref_rate, ref_prof), (mine, mine_rate, mine_prof), (again, _, _) = runs[base], runs["mok"], runs["mok again"]
    gap = max(abs(a - b) for a, b in zip(mine, ref))
    late = [a - b for a, b in zip(mine[len(mine) // 4:], ref[len(ref) // 4:])]
    print(f"\ntokens/s per GPU: {base} {ref_rate:,.0f}, mok {mine_rate:,.0f} ({mine_rate / ref_rate:.2f}x)")
    print(f"loss: {base} {ref[0]:.4f} -> {ref[-1]:.4f}, mok {mine[0]:.4f} -> {mine[-1]:.4f}; largest gap between "
          f"the curves {gap:.4f}; mean of mok - {base} over the last 3/4 of the steps {sum(late) / len(late):+.4f}")
    print(f"two mok runs, same seed: {'bitwise identical' if mine == again else 'DIFFERENT'} losses")
    for i in sorted({0, len(ref) // 4, len(ref) // 2, 3 * len(ref) // 4, len(ref) - 1}):
        print(f"  step {i:5d}: {base} {ref[i]:.4f}  mok {mine[i]:.4f}")
    if ref_prof and mine_prof:
        print_profile(base, ref_prof)
        print_profile("mok", mine_prof)
        moe_ref = ref_prof["experts_forward_ms"] + ref_prof["experts_backward_ms"]
        moe_mine = mine_prof["experts_forward_ms"] + mine_prof["experts_backward_ms"]
        rest_ref, rest_mine = ref_prof["step_ms"] - moe_ref, mine_prof["step_ms"] - moe_mine
        print(f"\nMoE experts a step: {base} {moe_ref:.2f} ms, mok {moe_mine:.2f} ms ({moe_ref / moe_mine:.2f}x); "
              f"the rest of the step: {rest_ref:.2f} and {rest_mine:.2f} ms; step ratio {base} / mok "
              f"{ref_prof['step_ms'] / mine_prof['step_ms']:.2f}x (hooks on), at most "
              f"{ref_prof['step_ms'] / rest_mine:.2f}x were mok's experts free")
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
        ax.set_title(f"Qwen3-MoE ({args.size}, {args.attn} attention, AdamW {args.optim}) on this repository's text")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
