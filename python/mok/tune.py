"""mok.tune: find the fastest tuning options for a layer shape, and cache them.

    python -m mok.tune [--hidden H --intermediate I --experts E --top-k K --shared S --tokens T]
                       [--budget SECONDS] [--cache PATH] [--plot PNG]

The search walks the tuning options (mok.TUNING_OPTIONS: minibatch_rows,
comm_ctas_per_rank, ring_slots, lookahead) one at a time, trying each value
of an option's list against the best set so far, until a full sweep improves
nothing or the time budget is spent.
Every candidate is timed in paired rounds against the current best on the
same data (alternating, so that the GPU's clock drift cancels), and kept only
when it is faster by more than the noise margin. Tuning never changes a
result bit: options move work between SMs and in time, never the arithmetic.

The cache is JSON in the user's cache directory ($XDG_CACHE_HOME/mok, else
~/.cache/mok), one entry per TuneKey (GPU, SM count, CUDA and driver
versions, layer dims, tokens per rank rounded up to a power of two, world
size, precision, pass). A stale or corrupt file is ignored with a warning;
writers take a lock file and replace the file atomically, so concurrent
tuners cannot corrupt it.

The library uses a matching entry whenever a caller passes no tuning option
(mok/tuning_source.py; `mok.tuning_sources(...)` says where each option of a
call comes from; MOK_TUNING_CACHE=off disables it), and a process world's
ranks agree on one choice when their world is made (the same caller options
on every rank, else rank 0's entry; tuning_source.agree).

`mok_cli tune` is this tool's C++ twin (tools/tune/): the same search over the
same grid (tuning_grid.txt beside this file, the one list both read), the
same key, and the same cache file, format and lock, so that each reads the
other's entries. Change the format, the key or the search on both sides.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import functools
import json
import math
import os
import pathlib
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable

CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TuneKey:
    gpu: str
    sms: int
    cuda: str
    driver: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    shared: int
    tokens_bucket: int  # tokens per rank, rounded up to a power of two (at least 256)
    world: int
    precision: str = "bf16"
    pass_name: str = "forward"

    def id(self) -> str:
        return "|".join(str(getattr(self, f.name)) for f in dataclasses.fields(self))


def tokens_bucket(tokens: int) -> int:
    return max(256, 1 << max(0, math.ceil(math.log2(max(1, tokens)))))


def default_cache_path() -> pathlib.Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(root) / "mok" / "tuning.json"


class TuningCache:
    """The JSON cache of tuned options, safe against corruption and concurrent writers."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = pathlib.Path(path) if path is not None else default_cache_path()

    def _load(self):
        """The file's parsed JSON (None: absent or unreadable, with a warning when it exists)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            warnings.warn(f"mok: ignoring the tuning cache {self.path}: {e}")
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
            warnings.warn(f"mok: ignoring the tuning cache {self.path}: {e}")
            return None

    def _read(self) -> dict:
        data = self._load()
        if data is None:
            return {}
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(
                data.get("entries"), dict):
            warnings.warn(f"mok: ignoring the tuning cache {self.path}: not a version-{CACHE_VERSION} mok tuning cache")
            return {}
        return data["entries"]

    def lookup(self, key: TuneKey) -> dict | None:
        """The cached entry for `key` ({"options": {...}, "speedup": ..., ...}), or None."""
        entry = self._read().get(key.id())
        if entry is None:
            return None
        if not isinstance(entry, dict) or not isinstance(entry.get("options"), dict):
            warnings.warn(f"mok: ignoring a malformed entry of the tuning cache {self.path} for {key.id()}")
            return None
        return entry

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.path) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def store(self, key: TuneKey, options: dict, **facts) -> None:
        """Adds or replaces `key`'s entry; other entries (and other writers' ones) are kept."""
        with self._locked():
            data = self._load()
            if isinstance(data, dict) and isinstance(data.get("version"), int) and data["version"] > CACHE_VERSION:
                # A newer mok's cache: keep it aside rather than drop its entries.
                aside = self.path.with_name(self.path.name + f".v{data['version']}")
                warnings.warn(f"mok: the tuning cache {self.path} is from a newer version; moved to {aside}")
                os.replace(self.path, aside)
            entries = self._read()
            entries[key.id()] = {"options": dict(options), "when": datetime.datetime.now().isoformat(timespec="seconds"),
                                 **facts}
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning.", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"version": CACHE_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)  # atomic: a reader sees the old file or the new one
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        from . import tuning_source
        tuning_source.forget()  # this process's next lookup sees the new entry at once


@dataclasses.dataclass
class Measurement:
    options: dict
    ratio_to_default: float  # time with these options / time with the defaults (< 1: faster)


@dataclasses.dataclass
class SearchResult:
    best: dict
    speedup: float  # default time / best time
    measurements: list[Measurement]
    seconds: float


def read_grid(text: str) -> dict:
    """The grid of tuning_grid.txt's format: one option a line, its name then
    its values, '#' starting a comment (tools/tune/tuning_grid.cpp parses the
    same). A value is an int, or 'x' and a positive factor of the value the
    library picks for the layer, kept as written ("x1.5") until resolve_grid."""
    grid = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        values = []
        for word in words[1:]:
            try:
                if word.startswith("x") and len(word) > 1:
                    factor = float(word[1:])
                    if not (factor > 0 and math.isfinite(factor)):
                        raise ValueError(word)
                    values.append(word)
                else:
                    values.append(int(word))
            except ValueError:
                raise ValueError(f"tuning grid line {number}: '{word}' is neither an integer nor 'x' "
                                 "and a positive factor") from None
        grid[words[0]] = values
    return grid


def resolve_grid(grid: dict, library: dict) -> dict:
    """The grid for a layer whose library-chosen option values are `library`
    (by name): a factor "xF" becomes floor(F * value + 0.5), at least 1, and is
    dropped where it lands on the library's value (the walk's start) or on a
    value the option lists already; ints are kept as written
    (tools/tune/tuning_grid.cpp's resolve_grid, the same rule)."""
    out = {}
    for name, values in grid.items():
        numbers = []
        for v in values:
            if isinstance(v, int):
                numbers.append(v)
                continue
            if name not in library:
                raise ValueError(f"tuning grid: '{name}' has factors but no library value to scale")
            n = max(1, math.floor(float(v[1:]) * library[name] + 0.5))
            if n != library[name] and n not in numbers:
                numbers.append(n)
        out[name] = numbers
    return out


def library_values(hidden, intermediate, experts, top_k, shared, tokens, world=1, fp8=False, sms=None) -> dict:
    """The option values the library picks for a layer that the grid's
    factors scale: the dispatch CTAs of its rule (plan/sm_split.cpp), for
    one rank per GPU of `sms` SMs (default: the current GPU's)."""
    import torch  # the package's import loaded the op's library

    if sms is None:
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    comm = torch.ops.mok.default_comm_ctas_per_rank(hidden, intermediate, experts, top_k, shared, tokens, world,
                                                    sms, fp8)
    return {"comm_ctas_per_rank": int(comm)}


# The values tried per option, in walk order, as written (factors
# unresolved: resolve_grid gives a layer's). An option left out of the best
# set keeps the library's default or rule. One list for both tuners: mok_cli
# has the file built in.
DEFAULT_GRID = read_grid((pathlib.Path(__file__).parent / "tuning_grid.txt").read_text())


def search(defaults: dict, grid: dict, compare: Callable[[dict, dict], float], budget_s: float,
           margin: float = 0.005, progress: bool = True) -> SearchResult:
    """Coordinate search from `defaults`. compare(a, b) returns time(a) / time(b)
    measured in paired rounds (< 1: a is faster). A candidate replaces the best
    only when faster by more than `margin` (the noise), and the walk repeats
    over the options until a full sweep changes nothing or the budget is out."""
    start = time.monotonic()
    best = dict(defaults)
    best_ratio = 1.0  # best's time / the defaults' time
    measurements: list[Measurement] = []
    tried = {json.dumps(best, sort_keys=True)}
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=None, desc="mok.tune", unit="candidate")
        except ImportError:
            bar = None
    improved = True
    while improved and time.monotonic() - start < budget_s:
        improved = False
        for name, values in grid.items():
            for value in values:
                if time.monotonic() - start >= budget_s:
                    break
                candidate = dict(best, **{name: value})
                signature = json.dumps(candidate, sort_keys=True)
                if signature in tried:
                    continue
                tried.add(signature)
                ratio = compare(candidate, best)
                measurements.append(Measurement(candidate, ratio * best_ratio))
                if ratio < 1.0 - margin:
                    best, best_ratio, improved = candidate, ratio * best_ratio, True
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(best=f"{1.0 / best_ratio:.3f}x")
                elif progress:
                    print(f"mok.tune: {candidate} -> {ratio:.4f} of the best; best so far {1.0 / best_ratio:.3f}x")
    if bar is not None:
        bar.close()
    return SearchResult(best, 1.0 / best_ratio, measurements, time.monotonic() - start)


def table(result: SearchResult) -> str:
    """The sweep as a table, fastest first."""
    rows = sorted(result.measurements, key=lambda m: m.ratio_to_default)
    lines = [f"{'options':60s} {'time vs defaults':>16s}"]
    for m in rows:
        lines.append(f"{json.dumps(m.options, sort_keys=True):60s} {m.ratio_to_default:16.4f}")
    lines.append(f"best: {result.best} ({result.speedup:.3f}x the defaults, {result.seconds:.0f} s of tuning)")
    return "\n".join(lines)


def plot(result: SearchResult, path: str | os.PathLike) -> None:
    """Time against the defaults over minibatch rows x dispatch CTAs, one panel per ring size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rings = sorted({m.options.get("ring_slots") for m in result.measurements}, key=lambda v: (v is None, v))
    fig, axes = plt.subplots(1, max(1, len(rings)), figsize=(5 * max(1, len(rings)), 4), squeeze=False)
    for ax, ring in zip(axes[0], rings):
        points = [m for m in result.measurements if m.options.get("ring_slots") == ring]
        xs = [m.options.get("minibatch_rows", 0) for m in points]
        ys = [m.options.get("comm_ctas_per_rank", 0) for m in points]
        sc = ax.scatter(xs, ys, c=[m.ratio_to_default for m in points], cmap="viridis_r", s=80)
        ax.set_title(f"ring_slots = {ring}")
        ax.set_xlabel("minibatch_rows")
        ax.set_ylabel("comm_ctas_per_rank")
        fig.colorbar(sc, ax=ax, label="time / defaults")
    fig.suptitle(f"mok.tune: best {result.speedup:.3f}x the defaults")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---- on a GPU ------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def driver_version() -> str:
    """The CUDA driver's version ("13000" for 13.0), from libcuda itself (torch
    has no public call for it); "0" where no driver is loaded."""
    import ctypes
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
            return "0"
        return str(version.value)
    except OSError:
        return "0"


@functools.lru_cache(maxsize=None)
def _gpu_facts(device_index: int) -> tuple:
    """(name, SM count, CUDA version, driver version) of a GPU: read once per
    device (mok.fused_forward asks on every call that has a tuning cache)."""
    import torch
    props = torch.cuda.get_device_properties(device_index)
    return props.name, props.multi_processor_count, str(torch.version.cuda), driver_version()


def current_key(hidden, intermediate, experts, top_k, shared, tokens, world=1, device=None,
                precision: str = "bf16") -> TuneKey:
    """precision "fp8": the fused FP8 forward's entries (mok_cli tune --fp8 stores them)."""
    import torch
    index = torch.cuda.current_device() if device is None or torch.device(device).index is None \
        else torch.device(device).index
    name, sms, cuda, driver = _gpu_facts(index)
    return TuneKey(name, sms, cuda, driver, hidden, intermediate, experts, top_k, shared, tokens_bucket(tokens), world,
                   precision)


def paired_compare(layer_args: tuple, num_experts: int, rounds: int = 5, passes: int = 10,
                   forward: Callable | None = None) -> Callable:
    """compare(a, b) for mok.fused_forward (or `forward`, mok.fused_forward_fp8
    with its quantized weights in layer_args) on one layer: rounds of
    `passes` passes with options a, b, b, a; the median of the per-round
    ratios. A candidate `a` the library refuses for this layer (a
    RuntimeError naming the option) is never faster: infinity."""
    import torch

    from . import fused_forward

    from .options import TUNING_OPTIONS
    run = forward or fused_forward

    def timed(options):
        # Every option named (0 = the library's default), so that the tuning
        # cache never stands in for "the defaults" (mok/tuning_source.py).
        options = {name: options.get(name, 0) for name in TUNING_OPTIONS}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        run(*layer_args, num_experts=num_experts, **options)  # warm (and build its workspace)
        start.record()
        for _ in range(passes):
            run(*layer_args, num_experts=num_experts, **options)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    ran = set()  # option sets known to run (the baseline `b` must: a refusal there ends the search)

    def compare(a: dict, b: dict) -> float:
        def call(options):
            run(*layer_args, num_experts=num_experts, **{name: options.get(name, 0) for name in TUNING_OPTIONS})
            ran.add(json.dumps(options, sort_keys=True))
        if json.dumps(b, sort_keys=True) not in ran:
            call(b)  # the defaults first of all: a layer the library cannot run at all raises here
        try:
            call(a)
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as e:  # the op's refusal of an option for this layer names it
            print(f"mok.tune: {a} refused: {e}")
            return math.inf

        # a b b a per round, so that a clock drifting within a round favours neither.
        def one_round():
            a1, b1, b2, a2 = timed(a), timed(b), timed(b), timed(a)
            return (a1 + a2) / (b1 + b2)
        return statistics.median(one_round() for _ in range(rounds))

    return compare


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mok.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--shared", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--budget", type=float, default=120.0, help="seconds of tuning")
    p.add_argument("--cache", default=None, help=f"cache file (default {default_cache_path()})")
    p.add_argument("--plot", default=None, help="write the sweep as a PNG")
    p.add_argument("--fp8", action="store_true",
                   help="tune the fused FP8 forward (weights from mok.quantize_weights; entries of precision fp8)")
    args = p.parse_args(argv)

    import torch

    from .testing import random_global_layer, split_world
    if not torch.cuda.is_available():
        print("mok.tune: needs a CUDA GPU (Hopper)")
        return 2
    layer = random_global_layer(args.tokens, args.hidden, args.intermediate, args.experts, args.top_k, args.shared,
                                seed=1, device="cuda")
    layer_args = split_world(layer, 1)
    forward = None
    if args.fp8:
        from . import fused_forward_fp8, quantize_weights
        x, ids, w, w13, w2, shared_w13, shared_w2 = layer_args
        layer_args = (x, ids, w, [quantize_weights(t) for t in w13], [quantize_weights(t) for t in w2],
                      shared_w13, shared_w2)
        forward = fused_forward_fp8
    compare = paired_compare(layer_args, args.experts, forward=forward)
    grid = resolve_grid(DEFAULT_GRID, library_values(args.hidden, args.intermediate, args.experts, args.top_k,
                                                     args.shared, args.tokens, fp8=args.fp8))
    result = search({}, grid, compare, args.budget)
    print(table(result))
    key = current_key(args.hidden, args.intermediate, args.experts, args.top_k, args.shared, args.tokens,
                      precision="fp8" if args.fp8 else "bf16")
    TuningCache(args.cache).store(key, result.best, speedup=result.speedup, tuning_seconds=result.seconds,
                                  tool="python -m mok.tune")
    print(f"mok.tune: stored for {key.id()} in {TuningCache(args.cache).path}")
    if args.plot:
        plot(result, args.plot)
        print(f"mok.tune: plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
