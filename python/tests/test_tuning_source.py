"""Where a pass's tuning options come from: the caller, the tuning cache, or
the library's defaults (mok/tuning_source.py). CPU only: the cache key's GPU
facts are replaced by a fixed key."""
from __future__ import annotations

import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mok.tune as tune  # noqa: E402
import mok.tuning_source as source  # noqa: E402
from mok.options import TUNING_OPTIONS  # noqa: E402

LAYER = dict(hidden=7168, intermediate=2048, experts=32, top_k=8, shared=2048, tokens_per_rank=4096, world=1)
CUDA = torch.device("cuda")  # only a name here: nothing runs on it
KEY = tune.TuneKey("NVIDIA H200", 132, "13.0", "0", 7168, 2048, 32, 8, 2048, 4096, 1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("MOK_TUNING_CACHE", str(path))
    monkeypatch.setattr(tune, "current_key", lambda *args, **kw: KEY)
    source.forget()
    return tune.TuningCache(path)


def test_the_callers_options_win_and_the_rest_are_defaults(cache):
    cache.store(KEY, {"minibatch_rows": 2048})
    options, sources = source.resolve({"ring_slots": 3}, device=CUDA, **LAYER)
    assert options == {"ring_slots": 3}
    assert sources["ring_slots"] == "caller"
    assert all(sources[name] == "default" for name in TUNING_OPTIONS if name != "ring_slots")


def test_a_cached_entry_is_used_when_the_caller_gives_none(cache):
    cache.store(KEY, {"minibatch_rows": 2048, "lookahead": 2})
    options, sources = source.resolve({}, device=CUDA, **LAYER)
    assert options == {"minibatch_rows": 2048, "lookahead": 2}
    assert sources["minibatch_rows"] == sources["lookahead"] == "cache"
    assert sources["ring_slots"] == "default"
    assert "minibatch_rows=2048 (cache)" in source.describe(sources, options)


def test_no_entry_for_this_key_means_defaults(cache, monkeypatch):
    cache.store(KEY, {"minibatch_rows": 2048})
    other = tune.TuneKey("NVIDIA H100", 132, "13.0", "0", 7168, 2048, 32, 8, 2048, 4096, 1)
    monkeypatch.setattr(tune, "current_key", lambda *args, **kw: other)
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {}


def test_a_new_entry_is_seen_without_a_restart(cache):
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {}  # no file yet
    cache.store(KEY, {"ring_slots": 6})
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {"ring_slots": 6}
    cache.store(KEY, {"ring_slots": 2})
    os.utime(cache.path, ns=(1, 2_000_000_000_000_000_000))  # a different mtime even on a coarse clock
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {"ring_slots": 2}


def test_another_writer_is_seen_within_the_recheck_interval(cache, monkeypatch):
    # Every forward call asks; the file's time is looked at once a second, so
    # an entry written by another process (here: the file written directly,
    # not through this process's TuningCache.store) shows up after that.
    clock = [100.0]
    monkeypatch.setattr(source, "_now", lambda: clock[0])
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {}  # no file yet
    cache.path.write_text(json.dumps({"version": tune.CACHE_VERSION, "entries": {
        KEY.id(): {"options": {"lookahead": 3}}}}))
    clock[0] += source.RECHECK_SECONDS / 2
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {}  # not looked at again yet
    clock[0] += source.RECHECK_SECONDS / 2
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {"lookahead": 3}


def test_the_cache_path_follows_the_environment(cache, monkeypatch, tmp_path):
    cache.store(KEY, {"ring_slots": 6})
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {"ring_slots": 6}
    monkeypatch.setenv("MOK_TUNING_CACHE", str(tmp_path / "other.json"))  # memoised per environment
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {}
    monkeypatch.setenv("MOK_TUNING_CACHE", str(cache.path))
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {"ring_slots": 6}


def test_disabled_by_the_environment(cache, monkeypatch):
    cache.store(KEY, {"minibatch_rows": 2048})
    for value in ("0", "off"):
        monkeypatch.setenv("MOK_TUNING_CACHE", value)
        assert source.resolve({}, device=CUDA, **LAYER)[0] == {}


def test_a_corrupt_cache_warns_and_falls_back_to_the_defaults(cache):
    cache.path.write_text("{ not json")
    with pytest.warns(UserWarning, match="ignoring the tuning cache"):
        assert source.resolve({}, device=CUDA, **LAYER)[0] == {}


def test_unknown_names_in_an_entry_are_dropped(cache):
    cache.path.write_text(json.dumps({"version": tune.CACHE_VERSION, "entries": {
        KEY.id(): {"options": {"minibatch_rows": 1024, "warp_speed": 9}}}}))
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {"minibatch_rows": 1024}


def test_not_read_while_compiling_nor_for_meta_tensors(cache, monkeypatch):
    cache.store(KEY, {"minibatch_rows": 2048})
    assert source.resolve({}, device=torch.device("meta"), **LAYER)[0] == {}
    monkeypatch.setattr(source, "_compiling", lambda: True)
    options, sources = source.resolve({}, device=CUDA, **LAYER)
    assert options == {} and all(v == "default" for v in sources.values())


def test_fp8_entries_are_their_own(cache, monkeypatch):
    # mok_cli tune --fp8 stores under precision "fp8"; mok.fused_forward_fp8 reads only those.
    fp8_key = tune.TuneKey(*[getattr(KEY, f) for f in ("gpu", "sms", "cuda", "driver", "hidden", "intermediate",
                                                       "experts", "top_k", "shared", "tokens_bucket", "world")],
                           "fp8")
    assert fp8_key.id() == KEY.id().replace("|bf16|", "|fp8|")
    monkeypatch.setattr(tune, "current_key",
                        lambda *args, **kw: fp8_key if (args[8:] or [kw.get("precision")])[0] == "fp8" else KEY)
    cache.store(KEY, {"minibatch_rows": 2048})
    cache.store(fp8_key, {"comm_ctas_per_rank": 9})
    assert source.resolve({}, device=CUDA, **LAYER)[0] == {"minibatch_rows": 2048}
    assert source.resolve({}, device=CUDA, **LAYER, precision="fp8")[0] == {"comm_ctas_per_rank": 9}


def test_fused_forward_reports_the_options_it_would_use(monkeypatch):
    mok = pytest.importorskip("mok")
    monkeypatch.setattr(source, "cached_options", lambda *args: {"comm_ctas_per_rank": 5})
    T, H, I, E, k = 8, 128, 64, 4, 2
    meta = dict(device="meta")
    x = [torch.empty(T, H, dtype=torch.bfloat16, **meta)]
    ids = [torch.empty(T, k, dtype=torch.int32, **meta)]
    w13 = [torch.empty(E, 2 * I, H, dtype=torch.bfloat16, **meta)]
    w2 = [torch.empty(E, H, I, dtype=torch.bfloat16, **meta)]
    got = mok.tuning_sources(x, ids, w13, w2, num_experts=E)
    assert got["comm_ctas_per_rank"] == (5, "cache")
    assert got["minibatch_rows"] == (0, "default")
    assert mok.tuning_sources(x, ids, w13, w2, num_experts=E, ring_slots=2)["ring_slots"] == (2, "caller")
    # The FP8 forward's lookup: its precision, its quantized weights' shapes.
    asked = []
    monkeypatch.setattr(source, "cached_options", lambda *args: asked.append(args) or {"ring_slots": 3})
    q13 = [mok.QuantizedWeights(w, None, None, None) for w in w13]
    q2 = [mok.QuantizedWeights(w, None, None, None) for w in w2]
    got = mok.tuning_sources(x, ids, q13, q2, num_experts=E, fp8=True, token_capacity=64)
    assert got["ring_slots"] == (3, "cache")
    assert asked[-1][-1] == "fp8" and asked[-1][1] == I and asked[-1][5] == 64
