"""Which tuning options a pass runs with, and where each came from.

A pass's options come from, in order: the caller (keyword options given to
mok.fused_forward, mok.nn.MoE or mok.hf.register), else the tuning cache
(an entry `python -m mok.tune` stored for this GPU, CUDA/driver version, layer
dims, tokens-per-rank bucket and world size), else the library's defaults and
rules (include/mok/fused_forward.hpp). Options never change a result bit,
only where and when work runs, so a cache entry can only change speed.

A process world's ranks agree on one choice (agree(): the same caller
options on every rank, else rank 0's cache entry for all). The cache is
consulted when the caller gives no option at all, not while
torch.compile traces (a trace must not read files; the compiled graph runs the
library's defaults unless options are passed), and not when MOK_TUNING_CACHE
is "0" or "off". A path in MOK_TUNING_CACHE selects another cache file. The
file is re-read only when its modification time changes, and that time is
looked at no more than once a second (at once after this process stores an
entry): every forward call asks, and a file-system call on each would be
host time before its kernel (docs/perf-notes.md v17). An entry another
process stores is seen within a second.
"""

from __future__ import annotations

import os
import time

from .options import TUNING_OPTIONS

SOURCE_CALLER, SOURCE_CACHE, SOURCE_DEFAULT = "caller", "cache", "default"

# Memos, cleared together by forget(): the options per (path, mtime_ns, key
# id); per path, when its modification time was last looked at and what it
# was (None: no file); the cache path per environment.
_memo: dict = {}
_checked: dict = {}
_paths: dict = {}
RECHECK_SECONDS = 1.0
_now = time.monotonic  # the clock of the re-check (a test sets another)


def forget() -> None:
    """Drops every memo: the next lookup reads the file system again
    (TuningCache.store calls it, so this process sees its own entries at once)."""
    _memo.clear()
    _checked.clear()
    _paths.clear()


def _cache_path():
    """The cache file's path (a str), or None when disabled; memoised per
    environment, since it is asked on every forward call."""
    env = os.environ
    setting = env.get("MOK_TUNING_CACHE", "")
    where = (setting, env.get("XDG_CACHE_HOME"), env.get("HOME"))
    if where not in _paths:
        from .tune import default_cache_path
        if setting.lower() in ("0", "off", "false", "no"):
            _paths[where] = None
        else:
            custom = setting and setting.lower() not in ("1", "on", "true", "yes")
            _paths[where] = setting if custom else str(default_cache_path())
    return _paths[where]


def _modified(path: str):
    """The file's modification time (None: no file), looked at no more than
    once every RECHECK_SECONDS."""
    now = _now()
    last = _checked.get(path)
    if last is None or now - last[0] >= RECHECK_SECONDS:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = None
        last = _checked[path] = (now, mtime)
    return last[1]


def cached_options(hidden, intermediate, experts, top_k, shared, tokens_per_rank, world, device,
                   precision: str = "bf16") -> dict:
    """The cache's options for this layer on this GPU, or {} (no cache, no entry,
    disabled, or not a CUDA device: meta tensors under fake tracing have no GPU to key on).
    precision "fp8": the FP8 forward's entries (mok_cli tune --fp8)."""
    if getattr(device, "type", None) != "cuda":
        return {}
    path = _cache_path()
    if path is None:
        return {}
    mtime = _modified(path)
    if mtime is None:
        return {}
    from . import tune
    key = tune.current_key(hidden, intermediate, experts, top_k, shared, tokens_per_rank, world, device, precision)
    memo_key = (path, mtime, key.id())
    if memo_key not in _memo:
        entry = tune.TuningCache(path).lookup(key)
        options = dict(entry["options"]) if entry is not None else {}
        _memo[memo_key] = {k: v for k, v in options.items() if k in TUNING_OPTIONS}
    return dict(_memo[memo_key])


def _compiling() -> bool:
    import torch
    return bool(getattr(torch.compiler, "is_compiling", lambda: False)())


def resolve(tuning: dict, *, hidden, intermediate, experts, top_k, shared, tokens_per_rank, world, device,
            precision: str = "bf16"):
    """(options, sources): the options to run with, and for each of
    mok.TUNING_OPTIONS where its value comes from (caller, cache, default)."""
    if tuning or _compiling():
        options = dict(tuning)
        source = SOURCE_CALLER
    else:
        options = cached_options(hidden, intermediate, experts, top_k, shared, tokens_per_rank, world, device,
                                 precision)
        source = SOURCE_CACHE
    sources = {name: (source if options.get(name) else SOURCE_DEFAULT) for name in TUNING_OPTIONS}
    return options, sources


def agree(tuning: dict, group, *, hidden, intermediate, experts, top_k, shared, tokens_per_rank, device) -> dict:
    """Collective, for a process world, whose ranks must all run the same
    options (they shape the world's shared layout): the caller's options when
    every rank gives the same ones (a RuntimeError on every rank, naming what
    each gave, when they differ), else rank 0's tuning-cache entry (or the
    defaults) for every rank."""
    import torch.distributed as dist
    given = [None] * dist.get_world_size(group)
    dist.all_gather_object(given, dict(tuning), group=group)
    if any(given):
        if any(g != given[0] for g in given):
            raise RuntimeError("mok: the ranks of a process world must pass the same tuning options; got "
                               + "; ".join(f"rank {r}: {g or 'none'}" for r, g in enumerate(given)))
        return dict(given[0])
    mine = [None]
    if dist.get_rank(group) == 0:
        mine = [cached_options(hidden, intermediate, experts, top_k, shared, tokens_per_rank,
                               dist.get_world_size(group), device) if not _compiling() else {}]
    dist.broadcast_object_list(mine, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return dict(mine[0])


def describe(sources: dict, options: dict) -> str:
    """One line: each option's value and where it came from."""
    return ", ".join(f"{name}={options.get(name) or 'default'} ({sources[name]})" for name in TUNING_OPTIONS)


__all__ = ["RECHECK_SECONDS", "SOURCE_CACHE", "SOURCE_CALLER", "SOURCE_DEFAULT", "agree", "cached_options", "describe",
           "forget", "resolve"]
