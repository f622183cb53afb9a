"""mok.testing's world split (the one used by the tests, the benchmark and
the torchrun tool), on the CPU."""

import torch

from mok.testing import random_global_layer, rank_slice, split_world


def test_split_world_concatenates_back_to_the_layer():
    layer = random_global_layer(64, 64, 64, 8, 2, 64, seed=1)
    for world in (1, 2, 4):
        xs, ids, ws, w13s, w2s, sw13, sw2 = split_world(layer, world)
        assert len(xs) == world
        for part, whole in zip((xs, ids, ws, w13s, w2s), layer[:5]):
            assert all(p.is_contiguous() for p in part)
            assert torch.equal(torch.cat(part), whole)
        assert sw13 is layer[5] and sw2 is layer[6]


def test_split_world_agrees_with_rank_slice():
    layer = random_global_layer(32, 64, 64, 4, 2, 0, seed=2)
    lists = split_world(layer, 2)
    for r in range(2):
        mine = rank_slice(layer, r, 2)
        for i in range(5):
            assert torch.equal(lists[i][r], mine[i])
        assert mine[5] is None and lists[5] is None
