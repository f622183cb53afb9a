"""CUDA-event timing shared by the benchmarks (run as scripts: bench/ is on sys.path)."""
from __future__ import annotations

import torch


def event_ms(fn) -> float:
    """Milliseconds of one call of fn on the current stream, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)
