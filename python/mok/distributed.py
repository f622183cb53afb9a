"""mok over torch.distributed: the fused MoE forward with one process per GPU.

Each process (e.g. one per GPU under ``torchrun --nproc-per-node N``) owns
one rank of an expert-parallel world: its tokens, its experts (E / R of
them) and its workspace on its GPU. The ranks exchange their workspaces as
CUDA IPC handles (all-gathered over the process group once, at
construction) and then order every pass on the GPUs themselves (the
kernel's start and end barriers; docs/protocol.md, "Device-ordered passes"):
no collective runs per pass.

    from mok.distributed import FusedMoEWorld, apply_no_multicast_env
    apply_no_multicast_env()            # before init_process_group
    dist.init_process_group("nccl")
    world = FusedMoEWorld(dist.group.WORLD, tokens_per_rank, hidden, intermediate,
                          num_experts, top_k, shared_intermediate)
    out = world(x, expert_ids, weights, w13, w2, shared_w13, shared_w2)
    world.close()                       # collective

Rules: every rank calls forward the same number of times, in the same
order relative to other collectives (the GPUs wait for each other inside the
kernel, which holds every SM of its GPU meanwhile); each rank has a GPU to
itself; token counts per rank are fixed per world object.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .options import tuning_list  # importing mok loads libmok_torch.so (the ops)

# NVLink multicast (NVLS) must stay off on shared machines: it can take a
# node's GPUs out of service. mok never uses it; these keep NCCL, torch's
# symmetric memory and NVSHMEM from using it either.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def apply_no_multicast_env() -> None:
    """Sets NO_MULTICAST_ENV in os.environ (call before init_process_group)."""
    os.environ.update(NO_MULTICAST_ENV)


def _error_of(step) -> str | None:
    """None if step() succeeds, else its error message (a RuntimeError from
    the op; other exceptions propagate)."""
    try:
        step()
        return None
    except RuntimeError as e:
        return str(e)


class FusedMoEWorld:
    """This process's rank of a process world running the fused MoE forward.

    group: the torch.distributed process group of the expert-parallel world
    (its rank order is the world's rank order). tokens_per_rank: tokens of
    every rank, the same list on every rank. num_experts: E for the whole
    world (a multiple of the group size). shared_intermediate: S of the shared
    expert, 0 for none. device: this rank's GPU (default: the current one).
    The keyword tuning options are mok.TUNING_OPTIONS, as for
    mok.fused_forward; timeout_seconds and barrier_timeout_seconds are
    FusedForwardOptions (include/mok/fused_forward.hpp).
    """

    def __init__(self, group, tokens_per_rank, hidden: int, intermediate: int, num_experts: int,
                 top_k: int, shared_intermediate: int = 0, *, timeout_seconds: float = 5.0,
                 barrier_timeout_seconds: float = 60.0, device=None, **tuning):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.tokens_per_rank = [int(t) for t in tokens_per_rank]
        if len(self.tokens_per_rank) != self.world_size:
            raise ValueError("tokens_per_rank has %d entries; the group has %d ranks"
                             % (len(self.tokens_per_rank), self.world_size))
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None
                                   else torch.device(device).index)
        self._on_gpu = dist.get_backend(self.group) == "nccl"  # NCCL moves CUDA tensors, gloo CPU ones
        tuning_list(tuning)  # unknown names raise here, on every rank alike
        from . import tuning_source
        # Every rank runs the same options: the caller's (the same on every
        # rank), else rank 0's tuning-cache entry (collective).
        tuning = tuning_source.agree(tuning, group, hidden=hidden, intermediate=intermediate, experts=num_experts,
                                     top_k=top_k, shared=shared_intermediate,
                                     tokens_per_rank=max(self.tokens_per_rank), device=self.device)
        self.tuning = tuning
        tuning_values = tuning_list(tuning)
        self._id = 0
        # MOK_BACKWARD=fused (read here: the backward's object and its handles
        # are made with the world's): the fused backward kernel over the
        # process world, in recompute mode; else the expert-parallel staged
        # backward. Every rank must see the same setting.
        from .autograd import backward_path
        self.fused_backward = backward_path(self.device) == "fused"

        def create():
            self._id = torch.ops.mok.process_world_create(
                self.rank, self.tokens_per_rank, hidden, intermediate, num_experts, top_k,
                shared_intermediate, tuning_values, float(timeout_seconds),
                float(barrier_timeout_seconds), self.device.index, self.fused_backward)
        error = _error_of(create)
        # Every step below is collective: a rank that failed tells the others,
        # so that every rank raises instead of some waiting forever.
        self._agree(error)
        if self.world_size > 1:  # a world of one needs no IPC at all
            self._exchange_handles(backward=False)
            if self.fused_backward:
                self._exchange_handles(backward=True)

    def _agree(self, error) -> None:
        """Collective: raises on every rank if `error` (a message or None) is set on any."""
        if self.world_size == 1:
            if error is not None:
                raise RuntimeError(error)
            return
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int32,
                            device=self.device if self._on_gpu else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if flag.item() != 0:
            if self._id != 0:
                torch.ops.mok.process_world_destroy(self._id)
                self._id = 0
            raise RuntimeError(error if error is not None else "mok: another rank of the process world failed")

    def _exchange_handles(self, backward: bool) -> None:
        """Collective: every rank's workspace handle (the forward's, or the fused backward's) to every rank."""
        exported = []
        self._agree(_error_of(lambda: exported.append(torch.ops.mok.process_world_export(self._id, backward))))
        mine = exported[0]
        local = mine.to(self.device) if self._on_gpu else mine
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local, group=self.group)
        handles = torch.stack([h.cpu() for h in gathered])
        # Nobody may launch a pass before every rank has mapped its peers (a
        # pass writes into every peer's memory): the agreement is the barrier.
        self._agree(_error_of(lambda: torch.ops.mok.process_world_import(self._id, handles, backward)))

    def forward(self, x, expert_ids, weights, w13, w2, shared_w13=None, shared_w2=None, *,
                check_errors: bool = False):
        """This rank's output [T_r, H] bf16 for its tokens.

        x [T_r, H] bf16, expert_ids [T_r, k] int32 (global ids), weights
        [T_r, k] fp32, w13 [E/R, 2I, H] and w2 [E/R, H, I] bf16 (this rank's
        experts), shared_w13 [2S, H] and shared_w2 [H, S] bf16 or None; all on
        this rank's GPU. Enqueued on the current stream; bitwise identical to
        the virtual world (mok.fused_forward) on the same global batch.
        check_errors=True synchronises and raises on a failed pass.

        Backward: the expert-parallel staged backward (mok/ep_backward.py:
        rows to their experts' owners and back with all_to_all over the
        group; the same bits as the virtual world's backward for dx, d weights
        and each rank's dW13 / dW2), or with MOK_BACKWARD=fused when the
        world was made, the fused backward kernel over the process world
        (recompute mode: this pass keeps only its schedule, a small uint8
        tensor; the same bits). It is collective: every rank must run its
        backward, in the same order relative to other collectives, with the
        same inputs requiring grad. The shared expert's weight gradients are
        this rank's part (a data-parallel reduction sums them).
        """
        if self._id == 0:
            raise RuntimeError("mok: this FusedMoEWorld is closed")
        return _ProcessWorldLayer.apply(self, check_errors, x, expert_ids, weights, w13, w2, shared_w13, shared_w2)

    __call__ = forward

    def close(self) -> None:
        """Collective: unmaps the peers, waits for every rank, frees this rank's memory."""
        if self._id == 0:
            return
        error = _error_of(lambda: torch.ops.mok.process_world_close_peers(self._id))
        try:
            if self.world_size > 1:
                dist.barrier(group=self.group)  # nobody frees memory a peer still maps
        finally:
            world_id, self._id = self._id, 0
            torch.ops.mok.process_world_destroy(world_id)
        if error is not None:
            raise RuntimeError(error)


class _ProcessWorldLayer(torch.autograd.Function):
    """The process world's pass, with the expert-parallel staged backward or the fused backward kernel."""

    @staticmethod
    def forward(ctx, world, check_errors, x, expert_ids, weights, w13, w2, shared_w13, shared_w2):
        ctx.group = world.group
        ctx.world_id = world._id if world.fused_backward else 0
        ctx.check_errors = check_errors
        # The fused backward reads this pass's schedule: the forward keeps it.
        pass_state = None
        if ctx.world_id != 0:
            pass_state = torch.empty(torch.ops.mok.process_world_pass_state_bytes(world._id), dtype=torch.uint8,
                                     device=x.device)
        ctx.save_for_backward(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, pass_state)
        if pass_state is not None:
            return torch.ops.mok.process_world_run_keeping_schedule(world._id, x, expert_ids, weights, w13, w2,
                                                                    shared_w13, shared_w2, pass_state, check_errors)
        return torch.ops.mok.process_world_run(world._id, x, expert_ids, weights, w13, w2, shared_w13, shared_w2,
                                               check_errors)

    @staticmethod
    def backward(ctx, dout):
        from .ep_backward import layer_backward_ep
        from .staged_backward import Needs
        x, expert_ids, weights, w13, w2, shared_w13, shared_w2, pass_state = ctx.saved_tensors
        need = ctx.needs_input_grad
        if ctx.world_id != 0:
            dx, dweights, dw13, dw2, dshared_w13, dshared_w2 = torch.ops.mok.process_world_backward(
                ctx.world_id, dout.contiguous(), x, expert_ids, weights, w13, w2, shared_w13, shared_w2, pass_state,
                ctx.check_errors)

            def wanted(grad, i, ref):
                return grad.to(ref.dtype) if need[i] and ref is not None else None
            return (None, None, wanted(dx, 2, x), None, wanted(dweights, 4, weights), wanted(dw13, 5, w13),
                    wanted(dw2, 6, w2), wanted(dshared_w13, 7, shared_w13), wanted(dshared_w2, 8, shared_w2))
        needs = Needs(x=need[2], weights=need[4], w13=need[5], w2=need[6], shared_w13=need[7], shared_w2=need[8])
        grad_dtype = torch.bfloat16 if w13.dtype == torch.bfloat16 else None
        g = layer_backward_ep(dout, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, group=ctx.group,
                              needs=needs, grad_dtype=grad_dtype)

        def like(grad, ref):
            return None if grad is None or ref is None else grad.to(ref.dtype)
        return (None, None, like(g.dx, x), None, like(g.dweights, weights), like(g.dw13, w13), like(g.dw2, w2),
                like(g.dshared_w13, shared_w13), like(g.dshared_w2, shared_w2))


__all__ = ["FusedMoEWorld", "NO_MULTICAST_ENV", "apply_no_multicast_env"]
