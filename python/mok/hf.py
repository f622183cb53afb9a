"""mok.hf: mok's fused forward as a transformers experts backend.

transformers routes the experts of its MoE models (Qwen3-MoE, DeepSeek-V3,
GLM-4.5, Mixtral, ...) through its ExpertsInterface: each experts module holds
gate_up_proj [E, 2I, H] (gate rows, then up rows) and down_proj [E, H, I],
which is the layout mok's kernels read, and calls the backend the config
names with (hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]).

    import mok.hf
    mok.hf.register()                       # once; adds "mok" to the interface
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation="mok")
    # or model.set_experts_implementation("mok")

What the backend runs: the routed experts of one layer as one fused kernel on
one GPU (a virtual world of one rank); the router, the shared expert and the
rest of the model stay in transformers. What it refuses, with a ValueError
naming the reason before any work (never a wrong answer):
  - experts without a gate, with biases, with interleaved gate/up rows, with
    transposed weights, with an activation other than SiLU or a custom gate
    (gpt-oss's clamped SwiGLU, for example);
  - expert parallelism (the ids transformers passes are then global and its
    sentinels lie beyond the local experts);
  - tensors that are not bf16 on a CUDA device, and sizes that are not
    multiples of 64.

Backward: through mok's staged backward (mok/staged_backward.py: separate
grouped kernels), or with MOK_BACKWARD=fused the fused backward kernel, with
or without save_activations (mok/autograd.py), which gives gradients for
hidden_states, top_k_weights (and so the router), gate_up_proj and down_proj.
Expert ids out of range are checked by the kernel; pass
register(check_errors=True) to have every layer synchronise and raise on one
(by default a bad id aborts the pass and is reported by the next checked call).
"""

from __future__ import annotations


import torch

from . import fused_forward
from .options import token_capacity, tuning_list

BACKEND_NAME = "mok"

_settings: dict = {"check_errors": False, "save_activations": False, "max_tokens": 0, "tuning": {}}
# Where the kernel's tensors may live. meta: what torch.compile traces with
# off the GPU (the op's Meta kernel runs the same checks as the CUDA one).
_DEVICE_TYPES = ("cuda", "meta")


def register(name: str = BACKEND_NAME, *, check_errors: bool = False, save_activations: bool = False,
             max_tokens: int | None = None, **tuning) -> str:
    """Adds mok to transformers' ExpertsInterface under `name` (returned).

    check_errors: synchronise after every layer and raise on a stalled pass or
    a bad expert id. save_activations: the backward's save mode (the forward
    keeps gate/up instead of the backward recomputing it; see
    mok.fused_forward). max_tokens: the most tokens (batch x sequence) one
    layer call may bring; every call up to it runs on the one workspace made
    for it (mok.fused_forward's token_capacity: variable batch and sequence
    lengths allocate nothing and never synchronise the host), a larger call
    is a ValueError; None: a workspace per distinct count (cached). Keyword
    tuning options (mok.TUNING_OPTIONS) go to mok.fused_forward for every
    layer. Registering again replaces the settings.
    """
    from transformers.integrations.moe import ExpertsInterface

    tuning_list(tuning)  # unknown names raise TypeError here, not at the first layer
    capacity = token_capacity(max_tokens)  # ValueError before any setting changes
    _settings["check_errors"] = bool(check_errors)
    _settings["max_tokens"] = capacity
    _settings["save_activations"] = bool(save_activations)
    _settings["tuning"] = dict(tuning)
    ExpertsInterface.register(name, experts_forward)
    return name


def module_problems(experts: torch.nn.Module) -> list[str]:
    """Why mok cannot run this transformers experts module ([] if it can).

    Reads only the module's structure and config (no tensor data), so it can
    be asked on any device, and ahead of time.
    """
    from transformers.activations import SiLUActivation
    from transformers.integrations.moe import _default_apply_gate

    problems = []
    if not getattr(experts, "has_gate", True):
        problems.append("its experts have no gate (mok runs SwiGLU experts only)")
    if getattr(experts, "has_bias", False):
        problems.append("its experts have biases")
    if not getattr(experts, "is_concatenated", True):
        problems.append("its gate and up rows are interleaved (mok reads gate rows, then up rows)")
    if getattr(experts, "is_transposed", False):
        problems.append("its expert weights are transposed (mok reads [E, 2I, H] and [E, H, I])")
    if getattr(type(experts), "_apply_gate", _default_apply_gate) is not _default_apply_gate:
        problems.append(f"{type(experts).__name__} has its own gate function")
    act = getattr(experts, "act_fn", None)
    if not isinstance(act, (torch.nn.SiLU, SiLUActivation)):
        problems.append(f"its activation is {type(act).__name__}, not SiLU")
    distributed = getattr(getattr(experts, "config", None), "distributed_config", None)
    if getattr(distributed, "enable_expert_parallel", False):
        problems.append("it runs with transformers' expert parallelism (ids beyond the local experts)")
    for name in ("gate_up_proj", "down_proj"):
        if not isinstance(getattr(experts, name, None), torch.Tensor):
            problems.append(f"it has no {name} tensor")
    if problems:
        return problems
    E, two_i, H = experts.gate_up_proj.shape
    if two_i % 2 != 0 or tuple(experts.down_proj.shape) != (E, H, two_i // 2):
        problems.append(f"gate_up_proj {tuple(experts.gate_up_proj.shape)} and down_proj "
                        f"{tuple(experts.down_proj.shape)} are not [E, 2I, H] and [E, H, I]")
    elif H % 64 != 0 or (two_i // 2) % 64 != 0:
        problems.append(f"hidden {H} and intermediate {two_i // 2} must be multiples of 64")
    return problems


def _refuse(experts: torch.nn.Module, reasons: list[str]) -> None:
    raise ValueError(f"mok.hf: the experts module {type(experts).__name__} cannot run on mok: "
                     + "; ".join(reasons) + ". Use another experts_implementation for this model.")


def experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ExpertsInterface entry: out[t] = sum_j w[t, j] * expert_{id[t, j]}(x[t])."""
    problems = module_problems(self)
    tensors = (("hidden_states", hidden_states), ("gate_up_proj", self.gate_up_proj),
               ("down_proj", self.down_proj))
    for name, t in tensors:
        if t.dtype != torch.bfloat16 or t.device.type not in _DEVICE_TYPES:
            problems.append(f"{name} is {t.dtype} on {t.device}; mok needs bf16 on a CUDA device")
    if hidden_states.dim() != 2 or top_k_index.shape != top_k_weights.shape or top_k_index.dim() != 2 \
            or top_k_index.shape[0] != hidden_states.shape[0]:
        problems.append(f"hidden_states {tuple(hidden_states.shape)}, top_k_index {tuple(top_k_index.shape)} "
                        f"and top_k_weights {tuple(top_k_weights.shape)} are not [T, H], [T, k], [T, k]")
    if problems:
        _refuse(self, problems)
    capacity = _settings["max_tokens"]
    if capacity and hidden_states.shape[0] > capacity:
        raise ValueError(f"mok.hf: a layer call brings {hidden_states.shape[0]} tokens, more than "
                         f"register(max_tokens={capacity}) allows")
    # int32 ids and fp32 weights are what the kernel reads; both casts are exact
    # for the values a router produces (ids < 2^31, bf16/fp32 weights).
    out = fused_forward([hidden_states.contiguous()], [top_k_index.to(torch.int32).contiguous()],
                        [top_k_weights.to(torch.float32).contiguous()], [self.gate_up_proj.contiguous()],
                        [self.down_proj.contiguous()], num_experts=self.gate_up_proj.shape[0],
                        check_errors=_settings["check_errors"],
                        save_activations=_settings["save_activations"] and torch.is_grad_enabled(),
                        token_capacity=capacity, **_settings["tuning"])[0]
    return out


__all__ = ["BACKEND_NAME", "experts_forward", "module_problems", "register"]
