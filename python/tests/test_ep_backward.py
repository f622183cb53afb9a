"""The expert-parallel staged backward (mok/ep_backward.py) over a real
process group: 2 and 3 CPU processes on gloo, the grouped kernels replaced by
their fp32 references, against the one-process backward of the same global
layer. Each rank's dx, d weights and its experts' dW13 / dW2 must be the same
bits (every expert's rows reach their owner in global token order); the
shared expert's weight gradients are each rank's part and sum to the whole."""
from __future__ import annotations

import os
import socket
import tempfile

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from mok import staged_backward  # noqa: E402
from mok.ep_backward import layer_backward_ep  # noqa: E402
from mok.testing import random_global_layer, reference_ops  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slices(layer, tokens_per_rank):
    x, ids, w, w13, w2, sw13, sw2 = layer
    R = len(tokens_per_rank)
    El = w13.shape[0] // R
    starts = [sum(tokens_per_rank[:r]) for r in range(R)]
    return [(x[s:s + n].contiguous(), ids[s:s + n].contiguous(), w[s:s + n].contiguous(),
             w13[r * El:(r + 1) * El].contiguous(), w2[r * El:(r + 1) * El].contiguous(), sw13, sw2)
            for r, (s, n) in enumerate(zip(starts, tokens_per_rank))]


def _case(shared):
    T, H, I, E, k = 30, 64, 64, 6, 2
    layer = random_global_layer(T, H, I, E, k, 64 if shared else 0, seed=8)
    dout = torch.randn(T, H, generator=torch.Generator().manual_seed(9)).bfloat16()
    return layer, dout


def _worker(rank, world, port, tokens_per_rank, shared, out_dir):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        layer, dout = _case(shared)
        mine = _slices(layer, tokens_per_rank)[rank]
        first = sum(tokens_per_rank[:rank])
        grads = layer_backward_ep(dout[first:first + tokens_per_rank[rank]], *mine, group=dist.group.WORLD,
                                  ops=reference_ops())
        torch.save(tuple(grads), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tokens_per_rank, shared", [([15, 15], True), ([0, 21, 9], True), ([10, 20], False)])
def test_every_rank_gets_the_one_process_gradients(tokens_per_rank, shared):
    import torch.multiprocessing as mp
    layer, dout = _case(shared)
    whole = staged_backward.layer_backward(dout, *layer, ops=reference_ops())
    R = len(tokens_per_rank)
    El = layer[3].shape[0] // R
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_worker, args=(R, _free_port(), tokens_per_rank, shared, out_dir), nprocs=R,
                           start_method="spawn")
        parts = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(R)]
    first = 0
    for r, (dx, dweights, dw13, dw2, dsw13, dsw2) in enumerate(parts):
        n = tokens_per_rank[r]
        assert torch.equal(dx, whole.dx[first:first + n]), f"rank {r}: dx"
        assert torch.equal(dweights, whole.dweights[first:first + n]), f"rank {r}: d weights"
        assert torch.equal(dw13, whole.dw13[r * El:(r + 1) * El]), f"rank {r}: dW13 of its experts"
        assert torch.equal(dw2, whole.dw2[r * El:(r + 1) * El]), f"rank {r}: dW2 of its experts"
        first += n
    if shared:
        total13 = sum(p[4] for p in parts)
        total2 = sum(p[5] for p in parts)
        torch.testing.assert_close(total13, whole.dshared_w13, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(total2, whole.dshared_w2, rtol=1e-5, atol=1e-5)
    else:
        assert all(p[4] is None and p[5] is None for p in parts)
