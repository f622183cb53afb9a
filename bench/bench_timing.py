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


def mirrored_times(fns, rounds: int = 6, iters: int = 4, host_ahead: bool = False, timer=None) -> list:
    """Each function's times (ms), in rounds whose order mirrors every other
    round (A B C, C B A, A B C, ...), iters calls a turn, after 3 warm-up
    calls each.

    Under the power cap a call's clock depends on what ran just before it. In
    a fixed order each function always follows the same neighbour, a bias that
    no number of rounds removes; mirrored rounds give every function each
    position and each neighbour equally often, and a drift that is linear
    over the run cancels too. rounds should be even. timer(fn) -> ms replaces
    event_ms (bench_ep.py syncs the ranks first)."""
    timer = timer or (lambda fn: event_ms(fn, host_ahead))
    for _ in range(3):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            times[i].extend(timer(fns[i]) for _ in range(iters))
    return times


def upper_median(times) -> float:
    """The benchmarks' median: the upper middle of an even count."""
    return sorted(times)[len(times) // 2]


def mirrored_medians(fns, rounds: int = 6, iters: int = 4, host_ahead: bool = False) -> list:
    """Median ms of each function in fns over mirrored rounds (mirrored_times)."""
    return [upper_median(t) for t in mirrored_times(fns, rounds, iters, host_ahead)]


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
