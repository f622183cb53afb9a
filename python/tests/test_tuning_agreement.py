"""A process world's ranks agree on one set of tuning options
(mok.tuning_source.agree): the caller's when every rank gives the same, an
error on every rank when they differ, else rank 0's tuning-cache entry for
all. CPU processes over gloo; the cache lookup is replaced per rank."""
from __future__ import annotations

import os
import socket
import tempfile

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import mok.tuning_source as source  # noqa: E402

LAYER = dict(hidden=7168, intermediate=2048, experts=32, top_k=8, shared=2048, tokens_per_rank=4096,
             device=torch.device("cuda"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, given, cached, out_dir):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        source.cached_options = lambda *args: dict(cached[rank])  # this rank's cache
        try:
            result = source.agree(given[rank], dist.group.WORLD, **LAYER)
        except RuntimeError as e:
            result = "error: " + str(e)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _run(given, cached):
    import torch.multiprocessing as mp
    world = len(given)
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_worker, args=(world, _free_port(), given, cached, out_dir), nprocs=world,
                           start_method="spawn")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world)]


def test_the_same_caller_options_are_kept():
    got = _run([{"ring_slots": 3}, {"ring_slots": 3}], [{"lookahead": 2}, {}])
    assert got == [{"ring_slots": 3}, {"ring_slots": 3}]


def test_different_caller_options_are_an_error_on_every_rank():
    got = _run([{"ring_slots": 3}, {"ring_slots": 4}], [{}, {}])
    assert all(isinstance(g, str) and "must pass the same tuning options" in g and "rank 1: {'ring_slots': 4}" in g
               for g in got), got


def test_without_options_every_rank_takes_rank_0s_cache_entry():
    got = _run([{}, {}, {}], [{"lookahead": 2}, {"minibatch_rows": 512}, {}])
    assert got == [{"lookahead": 2}] * 3
