"""mok.distributed.FusedMoEWorld (the process world: one process per GPU)
against the virtual world (mok.fused_forward) on the same global batch:
bitwise equal, over several passes with inputs changing between them.

(a) a world of one process, in this process (a single-rank gloo group; no
    IPC is involved);
(b) worlds of 2 (and 4 or 8 where that many GPUs exist) processes, spawned
    with torch.multiprocessing, NCCL; skipped with fewer than 2 GPUs.
Both also run the backward -- the expert-parallel staged one, and with
MOK_BACKWARD=fused the fused backward kernel over the process world -- and
compare each rank's gradients with the virtual world's.
"""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import skip_without_hopper  # noqa: E402

skip_without_hopper()

import mok  # noqa: E402
from mok.distributed import FusedMoEWorld, apply_no_multicast_env  # noqa: E402
from mok.testing import random_global_layer, rank_slice  # noqa: E402

H, I, E, K, S = 256, 128, 8, 2, 128
GLOBAL_TOKENS = 256
PASSES = 6


def _global_layer(seed, device):
    """The whole world's batch and experts, the same on every process."""
    return random_global_layer(GLOBAL_TOKENS, H, I, E, K, S, seed, device)


def _virtual(layer, world):
    """The virtual world's output of the global batch split over `world` ranks on one GPU."""
    parts = [rank_slice(layer, r, world) for r in range(world)]
    out = mok.fused_forward([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts],
                            [p[3] for p in parts], [p[4] for p in parts], layer[5], layer[6],
                            num_experts=E, check_errors=True)
    return torch.cat(out)


def _same_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_world_of_one_process_matches_the_virtual_world_bitwise():
    store_dir = tempfile.mkdtemp()
    store = dist.FileStore(os.path.join(store_dir, "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        layers = [_global_layer(seed, "cuda") for seed in (1, 2)]
        expected = [_virtual(layer, 1) for layer in layers]
        assert _same_bits(expected[0], _virtual(layers[0], 4))  # any world size, the same bits
        world = FusedMoEWorld(dist.group.WORLD, [GLOBAL_TOKENS], H, I, E, K, S,
                              minibatch_rows=256, ring_slots=2)
        for p in range(PASSES):
            layer = layers[p % 2]
            out = world(*rank_slice(layer, 0, 1), check_errors=True)
            assert _same_bits(out, expected[p % 2]), "pass %d" % p
        # Backward: the expert-parallel staged backward on a group of one gives
        # the virtual world's gradients bit for bit.
        layer = layers[0]
        dout = torch.randn(GLOBAL_TOKENS, H, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
        dout = dout.bfloat16()
        grads = []
        for run in ("process", "virtual"):
            x, ids, w, w13, w2, sw13, sw2 = (t.clone().requires_grad_(t.is_floating_point()) for t in layer)
            out = world(x, ids, w, w13, w2, sw13, sw2) if run == "process" else \
                mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E)[0]
            grads.append(torch.autograd.grad(out, [x, w, w13, w2, sw13, sw2], dout))
        for name, a, b in zip(("x", "weights", "w13", "w2", "shared_w13", "shared_w2"), *grads):
            assert torch.equal(a, b), name
        with pytest.raises(RuntimeError, match="x \\(this rank's tokens"):
            x, ids, w, w13, w2, sw13, sw2 = rank_slice(layers[0], 0, 1)
            world(x[:10].contiguous(), ids, w, w13, w2, sw13, sw2)
        world.close()
    finally:
        dist.destroy_process_group()


def test_world_of_one_process_with_the_fused_backward_gives_the_staged_bits(monkeypatch):
    """MOK_BACKWARD=fused when the world is made: the fused backward kernel
    over the process world (recompute mode, the pass keeping its schedule)
    gives the staged backward's gradients bit for bit, pass after pass."""
    store_dir = tempfile.mkdtemp()
    store = dist.FileStore(os.path.join(store_dir, "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        layer = _global_layer(5, "cuda")
        dout = torch.randn(GLOBAL_TOKENS, H, device="cuda", generator=torch.Generator("cuda").manual_seed(7))
        dout = dout.bfloat16()

        def grads(world):
            x, ids, w, w13, w2, sw13, sw2 = (t.clone().requires_grad_(t.is_floating_point()) for t in layer)
            out = world(x, ids, w, w13, w2, sw13, sw2, check_errors=True)
            return torch.autograd.grad(out, [x, w, w13, w2, sw13, sw2], dout)

        monkeypatch.setenv("MOK_BACKWARD", "staged")
        staged_world = FusedMoEWorld(dist.group.WORLD, [GLOBAL_TOKENS], H, I, E, K, S,
                                     minibatch_rows=256, ring_slots=2)
        assert not staged_world.fused_backward
        want = grads(staged_world)
        staged_world.close()

        monkeypatch.setenv("MOK_BACKWARD", "fused")
        world = FusedMoEWorld(dist.group.WORLD, [GLOBAL_TOKENS], H, I, E, K, S, minibatch_rows=256, ring_slots=2)
        assert world.fused_backward
        for p in range(3):
            got = grads(world)
            for name, a, b in zip(("x", "weights", "w13", "w2", "shared_w13", "shared_w2"), got, want):
                assert a.dtype == b.dtype and torch.equal(a, b), "pass %d: %s" % (p, name)
        world.close()
    finally:
        dist.destroy_process_group()


def _child(rank, world, store_path, result_dir, backward):
    apply_no_multicast_env()
    os.environ["MOK_BACKWARD"] = backward  # both worlds' backward: "staged" or "fused"
    torch.cuda.set_device(rank)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        layers = [_global_layer(seed, "cuda") for seed in (3, 4)]
        expected = None
        if rank == 0:  # the virtual world on rank 0's GPU, before any pass of the process world
            expected = [_virtual(layer, world) for layer in layers]
        fused = FusedMoEWorld(dist.group.WORLD, [GLOBAL_TOKENS // world] * world, H, I, E, K, S,
                              minibatch_rows=256, ring_slots=2)
        outs = []
        for p in range(PASSES):  # no host synchronisation between passes
            outs.append(fused(*rank_slice(layers[p % 2], rank, world)))
        torch.cuda.synchronize()
        for p, out in enumerate(outs):
            gathered = [torch.empty_like(out) for _ in range(world)]
            dist.all_gather(gathered, out)
            if rank == 0:
                assert _same_bits(torch.cat(gathered), expected[p % 2]), "pass %d" % p
        # A last pass with the error check on every rank.
        fused(*rank_slice(layers[0], rank, world), check_errors=True)
        # Backward (staged: expert-parallel, all_to_all over NCCL; fused: the
        # fused backward kernel over the process world): each rank's
        # gradients are its slice of the virtual world's, bit for bit (the
        # shared expert's weight gradients are per-rank parts: not compared).
        layer = layers[1]
        dout = torch.randn(GLOBAL_TOKENS, H, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
        dout = dout.bfloat16()
        virtual = [t.clone().requires_grad_(t.is_floating_point()) for t in layer]
        parts = [rank_slice(tuple(virtual), r, world) for r in range(world)]
        outs = mok.fused_forward([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts],
                                 [p[3] for p in parts], [p[4] for p in parts], virtual[5], virtual[6],
                                 num_experts=E)
        want = torch.autograd.grad(torch.cat(outs), [virtual[0], virtual[2], virtual[3], virtual[4]], dout)
        mine = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in rank_slice(layer, rank, world)]
        out = fused(*mine)
        t = GLOBAL_TOKENS // world
        got = torch.autograd.grad(out, [mine[0], mine[2], mine[3], mine[4]], dout[rank * t:(rank + 1) * t])
        el = E // world
        for name, g, w in zip(("x", "weights", "w13", "w2"), got,
                              (want[0][rank * t:(rank + 1) * t], want[1][rank * t:(rank + 1) * t],
                               want[2][rank * el:(rank + 1) * el], want[3][rank * el:(rank + 1) * el])):
            assert torch.equal(g, w), "rank %d: %s" % (rank, name)
        fused.close()
        open(os.path.join(result_dir, "rank%d.ok" % rank), "w").close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backward", ["staged", "fused"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_world_of_processes_matches_the_virtual_world_bitwise(world, backward):
    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip("needs 2 or more GPUs (found %d)" % gpus)
    if world > gpus:
        pytest.skip("needs %d GPUs (found %d)" % (world, gpus))
    work = tempfile.mkdtemp()
    mp.spawn(_child, args=(world, os.path.join(work, "store"), work, backward), nprocs=world, join=True)
    for rank in range(world):
        assert os.path.exists(os.path.join(work, "rank%d.ok" % rank)), "rank %d did not finish" % rank
