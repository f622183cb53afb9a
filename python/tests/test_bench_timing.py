# The benchmarks' call order (bench/bench_timing.py): under the power cap a
# call's time depends on the call before it (docs/perf-notes.md v29), so the
# paired timings rest on balanced_orders' two properties. CPU only.
import collections
import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
bench_timing = pytest.importorskip("bench_timing")


@pytest.mark.parametrize("n", range(1, 9))
def test_every_function_takes_every_position_and_follows_every_other_equally_often(n):
    orders = bench_timing.balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    positions = collections.Counter((i, p) for order in orders for p, i in enumerate(order))
    assert set(positions.values()) == {len(orders) // n}
    assert len(positions) == n * n
    follows = collections.Counter(pair for order in orders for pair in zip(order, order[1:]))
    if n > 1:
        assert set(follows) == set(itertools.permutations(range(n), 2))
        assert len(set(follows.values())) == 1


def test_balanced_times_gives_each_function_its_own_times(monkeypatch):
    monkeypatch.setattr(bench_timing.torch.cuda, "synchronize", lambda: None)
    calls = []
    fns = [lambda i=i: calls.append(i) for i in range(4)]
    clock = itertools.count(1)

    def timer(fn):
        fn()
        return float(next(clock))
    times = bench_timing.balanced_times(fns, iters=2, timer=timer)
    warmup, timed = calls[:12], calls[12:]
    assert collections.Counter(warmup) == {i: 3 for i in range(4)}
    # Two passes over the four orders (at least six rounds), two calls a turn.
    expected = [i for order in bench_timing.balanced_orders(4) * 2 for i in order for _ in range(2)]
    assert timed == expected
    assert [len(t) for t in times] == [16] * 4
    # Each value went to the function that was timed.
    for i, t in enumerate(times):
        assert all(expected[int(v) - 1] == i for v in t)
    assert bench_timing.upper_median([3.0, 1.0, 2.0, 4.0]) == 3.0
