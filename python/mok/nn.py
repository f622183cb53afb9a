"""mok.nn: an MoE layer to put in a model, on one GPU or expert-parallel
over a torch.distributed process group (one process per GPU).

  TopKRouter  the top-k router: softmax (Qwen3, Mixtral) or sigmoid (DeepSeek-V3,
              GLM-4.5) scores, optional group-limited selection and a
              selection-only expert bias (DeepSeek-V3), optional
              renormalisation of the chosen weights and a scaling factor.
  MoE         router + routed SwiGLU experts (+ an optional shared expert),
              with parameters in the layout the kernels read (w13 [E, 2I, H]:
              gate rows then up rows; w2 [E, H, I]; nn.Linear's layout), whose
              forward is mok.fused_forward (one persistent kernel).

The router runs in fp32 in torch; the experts in mok's kernel (bf16 operands,
fp32 accumulation). Backward: mok's staged backward (mok/staged_backward.py:
separate grouped kernels), or with MOK_BACKWARD=fused on a GPU the fused
backward kernel, in save mode (save_activations) or recompute mode
(mok/autograd.py), gives the input, every expert weight and,
through the routing weights, the router their gradients.
"""

from __future__ import annotations


import collections
import math

import torch

from . import fused_forward
from .options import token_capacity


class TopKRouter(torch.nn.Module):
    """Scores every expert for each token and picks top_k of them.

    scoring:              "softmax" (over all experts) or "sigmoid" (each expert alone).
    n_group, topk_group:  group-limited routing: experts form n_group equal groups,
                          and only the topk_group best groups are eligible (1, 1: no
                          groups). group_score: "top2_sum", a group's two best choice
                          scores summed (DeepSeek-V3), or "max", its best (DeepSeek-V2).
    expert_bias:          a per-expert bias (buffer e_score_correction_bias) added
                          to the scores for the *choice* only, never to the weights.
    norm_topk_prob:       divide the chosen weights by their sum.
    routed_scaling_factor: multiply the (normalised) weights by it.

    forward(x [T, H]) -> (expert_ids int32 [T, top_k], weights fp32 [T, top_k]):
    slots ordered by descending choice score; weights are the plain scores of
    the chosen experts (then normalised and scaled).
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, *, scoring: str = "softmax",
                 n_group: int = 1, topk_group: int = 1, group_score: str = "top2_sum", expert_bias: bool = False,
                 norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0, device=None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring = {scoring!r}: expected 'softmax' or 'sigmoid'")
        if group_score not in ("top2_sum", "max"):
            raise ValueError(f"group_score = {group_score!r}: expected 'top2_sum' or 'max'")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k = {top_k}: must be in [1, num_experts = {num_experts}]")
        if n_group < 1 or num_experts % n_group != 0:
            raise ValueError(f"n_group = {n_group}: must be >= 1 and divide num_experts = {num_experts}")
        if not 1 <= topk_group <= n_group:
            raise ValueError(f"topk_group = {topk_group}: must be in [1, n_group = {n_group}]")
        if n_group > 1 and topk_group * (num_experts // n_group) < top_k:
            raise ValueError(f"topk_group = {topk_group} groups of {num_experts // n_group} experts hold fewer "
                             f"than top_k = {top_k}")
        self.hidden, self.num_experts, self.top_k = hidden, num_experts, top_k
        self.scoring, self.n_group, self.topk_group, self.group_score = scoring, n_group, topk_group, group_score
        self.norm_topk_prob, self.routed_scaling_factor = norm_topk_prob, routed_scaling_factor
        self.weight = torch.nn.Parameter(torch.empty(num_experts, hidden, device=device, dtype=dtype))
        torch.nn.init.normal_(self.weight, std=1.0 / math.sqrt(hidden))
        if expert_bias:
            self.register_buffer("e_score_correction_bias",
                                 torch.zeros(num_experts, device=device, dtype=torch.float32))
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor):
        logits = x.float() @ self.weight.float().t()
        scores = logits.softmax(dim=-1) if self.scoring == "softmax" else logits.sigmoid()
        choice = scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias
        if self.n_group > 1:
            tokens = choice.shape[0]
            grouped = choice.view(tokens, self.n_group, self.num_experts // self.n_group)
            if self.group_score == "max":
                group_scores = grouped.amax(dim=-1)
            else:
                group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
            keep = torch.zeros_like(group_scores, dtype=torch.bool)
            keep.scatter_(1, group_scores.topk(self.topk_group, dim=-1).indices, True)
            # -inf, not 0: a biased choice score may be negative.
            choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, self.num_experts)
        ids = choice.topk(self.top_k, dim=-1, sorted=True).indices
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
        weights = weights * self.routed_scaling_factor
        return ids.to(torch.int32).contiguous(), weights.float().contiguous()


class MoE(torch.nn.Module):
    """A top-k routed SwiGLU MoE layer (+ an optional shared expert) on one GPU.

    out = shared(x) + sum_j w_j * expert_{id_j}(x),
    expert(x) = down(silu(gate(x)) * up(x)); x [..., hidden] bf16 -> out of the
    same shape. Parameters: router.weight [E, H]; w13 [E, 2I, H] (gate rows,
    then up rows), w2 [E, H, I]; shared_w13 [2S, H], shared_w2 [H, S] (or None).
    hidden, intermediate and shared_intermediate must be multiples of 64.
    save_activations: the backward's save mode (see mok.fused_forward; only
    while grad is enabled). fp32_main_grad: each expert weight gets a float32
    `main_grad` that its gradients are added to, micro-batch after
    micro-batch, in place of .grad (which stays None; zero main_grad yourself
    after the optimizer step). The router's weight keeps its ordinary .grad.
    max_tokens: the most tokens one call may bring (x's elements over
    hidden); calls with any count up to it run on one workspace made for it
    (mok.fused_forward's token_capacity: variable batch and sequence lengths
    allocate nothing and never synchronise the host, in the forward and in
    either backward), shared by every layer of the same shape, device and
    tuning; a larger call is a ValueError.
    None: a workspace per distinct count (cached). Keyword tuning options
    (minibatch_rows, ring_slots, ...) go to mok.fused_forward unchanged.

    process_group: expert parallelism over that group (one process per GPU,
    mok.distributed.FusedMoEWorld): this rank holds experts [r E/R, (r + 1)
    E/R) (w13 [E/R, 2I, H], w2 [E/R, H, I]), its router and shared expert are
    its own copies (a data-parallel framework keeps them in sync), and each
    call routes this rank's tokens to every rank's experts and back. Token
    counts may differ between ranks and between calls: each call gathers the
    ranks' counts (one small all_gather, a host synchronisation) and reuses
    the world made for those counts (up to `worlds` of them, least recently
    used evicted; making or evicting one is collective, which holds because
    every rank sees the same counts in the same order). Every rank must call
    forward (and backward) the same number of times, in the same order
    relative to other collectives. The expert-parallel backward is the staged
    one (mok/ep_backward.py, recompute mode), or the fused backward kernel
    with MOK_BACKWARD=fused set when the world is made; save_activations,
    fp32_main_grad and max_tokens are not available with it. close() releases the worlds
    (collective). Each rank's experts start from their own random draw (a
    generator seeded by torch.initial_seed() and the rank), not from the
    same one. With a data-parallel wrapper, keep w13 and w2 out of its
    synchronisation over this group (they are different experts on each
    rank); an expert's gradient sums every rank's tokens' contributions,
    where a data-parallel average would divide by the ranks. Each layer
    holds its own worlds (a workspace each, ~120 MB per rank at DeepSeek-V3's
    per-GPU size), and a process world needs its layer's exact counts, so
    counts that change every call make and release worlds often.
    """

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, *,
                 shared_intermediate: int = 0, router: TopKRouter | None = None, device=None,
                 dtype: torch.dtype = torch.bfloat16, save_activations: bool = False, fp32_main_grad: bool = False,
                 process_group=None, worlds: int = 4, max_tokens: int | None = None, **tuning):
        super().__init__()
        for name, value in (("hidden", hidden), ("intermediate", intermediate),
                            ("shared_intermediate", shared_intermediate)):
            if value < 0 or value % 64 != 0 or (value == 0 and name != "shared_intermediate"):
                raise ValueError(f"{name} = {value}: must be a positive multiple of 64"
                                 + (" (or 0: no shared expert)" if name == "shared_intermediate" else ""))
        if dtype != torch.bfloat16:
            raise ValueError(f"dtype = {dtype}: the kernels take bf16 parameters")
        self.hidden, self.intermediate, self.num_experts, self.top_k = hidden, intermediate, num_experts, top_k
        self.shared_intermediate = shared_intermediate
        self.tuning = tuning
        self.max_tokens = token_capacity(max_tokens) or None
        self.process_group = process_group
        local_experts = num_experts
        if process_group is not None:
            import torch.distributed as dist
            ranks = dist.get_world_size(process_group)
            if num_experts % ranks != 0:
                raise ValueError(f"num_experts = {num_experts}: must be a multiple of the group's {ranks} ranks")
            if save_activations or fp32_main_grad:
                raise ValueError("process_group: save_activations and fp32_main_grad are not available with the "
                                 "expert-parallel backward yet")
            if max_tokens is not None:
                raise ValueError("process_group: max_tokens is not available in the process world (its ranks "
                                 "share their exact counts; a world is made per set of counts)")
            if worlds < 1:
                raise ValueError(f"worlds = {worlds}: must be >= 1")
            local_experts = num_experts // ranks
            self._worlds = collections.OrderedDict()  # token counts of every rank -> FusedMoEWorld
            self._max_worlds = worlds
        self.save_activations = save_activations
        self.router = router if router is not None else TopKRouter(hidden, num_experts, top_k, device=device)
        if (self.router.hidden, self.router.num_experts, self.router.top_k) != (hidden, num_experts, top_k):
            raise ValueError("router: its hidden, num_experts and top_k must be the layer's")

        def param(*shape, fan_in, generator=None):
            p = torch.empty(*shape, device=device, dtype=dtype)
            torch.nn.init.normal_(p, std=1.0 / math.sqrt(fan_in), generator=generator)
            return torch.nn.Parameter(p)

        experts_generator = None
        if process_group is not None:  # every rank's experts are others: their own draw
            import torch.distributed as dist
            experts_generator = torch.Generator(device=torch.empty(0, device=device).device)
            experts_generator.manual_seed((torch.initial_seed() + 1_000_003 * (dist.get_rank(process_group) + 1))
                                          % (1 << 63))
        self.w13 = param(local_experts, 2 * intermediate, hidden, fan_in=hidden, generator=experts_generator)
        self.w2 = param(local_experts, hidden, intermediate, fan_in=intermediate, generator=experts_generator)
        if shared_intermediate > 0:
            self.shared_w13 = param(2 * shared_intermediate, hidden, fan_in=hidden)
            self.shared_w2 = param(hidden, shared_intermediate, fan_in=shared_intermediate)
        else:
            self.shared_w13 = self.shared_w2 = None
        if fp32_main_grad:  # gradients accumulate here, in fp32, instead of in .grad
            for p in (self.w13, self.w2, self.shared_w13, self.shared_w2):
                if p is not None:
                    p.main_grad = torch.zeros_like(p, dtype=torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden:
            raise ValueError(f"x: last dimension {x.shape[-1]}, expected hidden = {self.hidden}")
        tokens = x.reshape(-1, self.hidden).to(torch.bfloat16).contiguous()
        if self.max_tokens is not None and tokens.shape[0] > self.max_tokens:
            raise ValueError(f"x holds {tokens.shape[0]} tokens, more than this layer's max_tokens = "
                             f"{self.max_tokens}")
        expert_ids, weights = self.router(tokens)
        if self.process_group is not None:
            world = self._world_for(tokens)
            out = world(tokens, expert_ids, weights, self.w13, self.w2, self.shared_w13, self.shared_w2)
            return out.view(x.shape)
        out = fused_forward([tokens], [expert_ids], [weights], [self.w13], [self.w2], self.shared_w13,
                            self.shared_w2, num_experts=self.num_experts,
                            save_activations=self.save_activations and torch.is_grad_enabled(),
                            token_capacity=self.max_tokens or 0, **self.tuning)[0]
        return out.view(x.shape)

    def _world_for(self, tokens: torch.Tensor):
        """The process world for this call's token counts (collective)."""
        import torch.distributed as dist
        from .distributed import FusedMoEWorld
        group = self.process_group
        on_gpu = dist.get_backend(group) == "nccl"
        mine = torch.tensor([tokens.shape[0]], dtype=torch.int64, device=tokens.device if on_gpu else "cpu")
        counts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(counts, mine, group=group)
        key = tuple(torch.cat(counts).tolist())  # one host synchronisation, not one per rank
        world = self._worlds.get(key)
        if world is None:
            if len(self._worlds) >= self._max_worlds:  # every rank evicts the same one
                _, oldest = self._worlds.popitem(last=False)
                oldest.close()
            world = FusedMoEWorld(group, list(key), self.hidden, self.intermediate, self.num_experts, self.top_k,
                                  self.shared_intermediate, device=tokens.device, **self.tuning)
            self._worlds[key] = world
        else:
            self._worlds.move_to_end(key)
        return world

    def close(self) -> None:
        """Releases the process worlds of an expert-parallel layer (collective:
        every rank calls it); a no-op on one GPU."""
        if self.process_group is None:
            return
        while self._worlds:
            _, world = self._worlds.popitem(last=False)
            world.close()


__all__ = ["MoE", "TopKRouter"]
