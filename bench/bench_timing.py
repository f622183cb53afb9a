"""CUDA-event timing shared by the benchmarks (run as scripts: bench/ is on sys.path).

Two ways to time one call:
- from an idle GPU (the default): the start event fires at once, so the host's
  time from the call's entry to its first kernel is part of the figure. This is
  what a single call costs, and it is the benchmarks' headline figure.
- with the host ahead (host_ahead=True): a sleep kernel keeps the GPU busy
  while the host enqueues the call, as in a training loop whose host runs
  ahead of the GPU, so the events time the GPU's work and whatever gaps the
  call itself leaves. A call that synchronises the host (the torch-native
  pipeline reads its per-expert counts back) still waits for the GPU there and
  pays its host time after that point.
"""
from __future__ import annotations

import statistics
import time

import torch

# GPU cycles of the sleep kernel in host-ahead timing: ~10-15 ms at the
# H200's 1.3-2.0 GHz, longer than any benchmarked call takes to enqueue
# (mok's forward+backward step: ~4 ms of host time).
HOST_AHEAD_SLEEP_CYCLES = 20_000_000


def event_ms(fn, host_ahead: bool = False) -> float:
    """Milliseconds of one call of fn on the current stream, between two CUDA
    events (host_ahead: with the GPU kept busy while fn is enqueued)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if host_ahead:
        torch.cuda._sleep(HOST_AHEAD_SLEEP_CYCLES)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def balanced_orders(n: int) -> list:
    """Orders of range(n) in which every function takes every position
    equally often and directly follows every other function equally often (a
    Williams design: n orders for even n, 2n for odd n; [0, 1], [1, 0] for
    two)."""
    first = [0]
    for i in range(1, n):
        first.append((i + 1) // 2 if i % 2 == 1 else n - i // 2)
    orders = [[(j + shift) % n for j in first] for shift in range(n)]
    return orders if n % 2 == 0 else orders + [order[::-1] for order in orders]


def balanced_times(fns, cycles: int = 0, iters: int = 4, host_ahead: bool = False, timer=None) -> list:
    """Each function's times (ms) over rounds in the orders of
    balanced_orders, iters calls a turn, after 3 warm-up calls each; cycles
    passes over those orders (0: as few as make at least 6 rounds).

    Under the power cap a call's clock depends on what ran just before it: in
    a fixed order each function always follows the same neighbour, a bias
    that no number of rounds removes (v29 in docs/perf-notes.md measured it at
    ~10% on the torch-native forward). Here every function follows every
    other equally often and sits at every position equally often. timer(fn)
    -> ms replaces event_ms (bench_ep.py syncs the ranks first)."""
    timer = timer or (lambda fn: event_ms(fn, host_ahead))
    orders = balanced_orders(len(fns))
    cycles = cycles or -(-6 // len(orders))
    for _ in range(3):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for _ in range(cycles):
        for order in orders:
            for i in order:
                times[i].extend(timer(fns[i]) for _ in range(iters))
    return times


def upper_median(times) -> float:
    """The benchmarks' median: the upper middle of an even count."""
    return sorted(times)[len(times) // 2]


def balanced_medians(fns, cycles: int = 0, iters: int = 4, host_ahead: bool = False) -> list:
    """Median ms of each function in fns over balanced rounds (balanced_times)."""
    return [upper_median(t) for t in balanced_times(fns, cycles, iters, host_ahead)]


def host_ms(fn, calls: int = 9) -> float:
    """Median wall time on the host of one call of fn, each started from an
    idle GPU: the host's own work (Python, checks, launches); a call that
    reads a result back also waits there for its own kernels."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)
