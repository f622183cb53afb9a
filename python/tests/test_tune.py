"""mok.tune on the CPU: the coordinate search against a known cost model, its
budget and noise margin, the cache's round trip, its tolerance of corrupt
files and concurrent writers, the entries mok_cli tune writes, and the plot."""

import json
import math
import multiprocessing
import os
import pathlib

import pytest

from mok import tune


def _cost(options):
    """A made-up pass time with its minimum at minibatch 3072, 5 CTAs, 3 slots, lookahead 2."""
    mb = options.get("minibatch_rows", 2048)
    ctas = options.get("comm_ctas_per_rank", 4)
    slots = options.get("ring_slots", 4)
    look = options.get("lookahead", 2)
    return 5.0 + 1e-7 * (mb - 3072) ** 2 + 0.1 * (ctas - 5) ** 2 + 0.03 * abs(slots - 3) + 0.05 * abs(look - 2)


# The grid for a layer whose rule picks 4 dispatch CTAs (the cost model's
# default): every factor lands on a number the grid lists already
# (tests/cpu/test_tune_search.cpp walks the same grid).
GRID = tune.resolve_grid(tune.DEFAULT_GRID, {"comm_ctas_per_rank": 4})


def test_search_finds_the_cost_models_minimum():
    result = tune.search({}, GRID, lambda a, b: _cost(a) / _cost(b), budget_s=30, progress=False)
    # lookahead 2 is the default already: the best set need not name it.
    assert result.best == {"minibatch_rows": 3072, "comm_ctas_per_rank": 5, "ring_slots": 3}
    assert _cost(result.best) == 5.0
    assert result.speedup == pytest.approx(_cost({}) / _cost(result.best))
    # Every measurement is expressed against the defaults.
    for m in result.measurements:
        assert m.ratio_to_default == pytest.approx(_cost(m.options) / _cost({}), rel=1e-9)
    assert "best:" in tune.table(result)


def test_gains_within_the_noise_margin_are_not_taken():
    def flat(a, b):
        return 0.998 if a.get("minibatch_rows") == 512 else 1.0
    result = tune.search({}, GRID, flat, budget_s=30, margin=0.005, progress=False)
    assert result.best == {} and result.speedup == 1.0


def test_the_budget_is_honoured():
    assert tune.search({}, GRID, lambda a, b: 1.0, budget_s=0, progress=False).measurements == []


def test_tokens_are_bucketed_to_powers_of_two():
    assert [tune.tokens_bucket(t) for t in (1, 256, 257, 4096, 5000)] == [256, 256, 512, 4096, 8192]


def _key(world=1):
    return tune.TuneKey("NVIDIA H200", 132, "13.0", "580", 7168, 2048, 32, 8, 2048, 4096, world)


def test_cache_round_trip_keeps_other_entries(tmp_path):
    cache = tune.TuningCache(tmp_path / "tuning.json")
    assert cache.lookup(_key()) is None
    cache.store(_key(1), {"minibatch_rows": 3072}, speedup=1.04)
    cache.store(_key(2), {"ring_slots": 3}, speedup=1.01)
    assert cache.lookup(_key(1))["options"] == {"minibatch_rows": 3072}
    assert cache.lookup(_key(1))["speedup"] == 1.04
    assert cache.lookup(_key(2))["options"] == {"ring_slots": 3}


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 0, "entries": {}}), "[]", b"\xff\xfe\x00bad"])
def test_a_corrupt_or_stale_cache_is_ignored_with_a_warning(tmp_path, content):
    path = tmp_path / "tuning.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    cache = tune.TuningCache(path)
    with pytest.warns(UserWarning, match="mok: ignoring the tuning cache"):
        assert cache.lookup(_key()) is None
    # A store over it rewrites the file whole.
    with pytest.warns(UserWarning, match="mok: ignoring the tuning cache"):
        cache.store(_key(), {"lookahead": 1})
    assert cache.lookup(_key())["options"] == {"lookahead": 1}


def test_a_newer_versions_cache_is_kept_aside_not_overwritten(tmp_path):
    path = tmp_path / "tuning.json"
    newer = json.dumps({"version": tune.CACHE_VERSION + 1, "entries": {"theirs": {"options": {}}}})
    path.write_text(newer)
    cache = tune.TuningCache(path)
    with pytest.warns(UserWarning, match="newer version"):
        cache.store(_key(), {"lookahead": 1})
    assert (tmp_path / f"tuning.json.v{tune.CACHE_VERSION + 1}").read_text() == newer
    assert cache.lookup(_key())["options"] == {"lookahead": 1}


def test_a_malformed_entry_is_ignored_with_a_warning(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"version": tune.CACHE_VERSION, "entries": {_key().id(): 3}}))
    with pytest.warns(UserWarning, match="malformed entry"):
        assert tune.TuningCache(path).lookup(_key()) is None


# What mok_cli tune's cache writer (tools/tune/tuning_cache.cpp) writes for
# this key; tests/cpu/tuning_cache_fixtures.hpp's kCppFile, which the C++
# test checks byte for byte against that writer: change both.
_CPP_FILE = """{
 "entries": {
  "NVIDIA H200|132|13.0|13000|7168|2048|32|8|2048|4096|1|bf16|forward": {
   "options": {
    "lookahead": 3,
    "minibatch_rows": 3072
   },
   "speedup": 1.04,
   "tool": "mok_cli tune",
   "tuning_seconds": 12.5,
   "when": "2026-12-03T10:00:00"
  }
 },
 "version": 1
}"""


def test_an_entry_mok_cli_tune_wrote_is_read_and_kept(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(_CPP_FILE)
    key = tune.TuneKey("NVIDIA H200", 132, "13.0", "13000", 7168, 2048, 32, 8, 2048, tune.tokens_bucket(4096), 1)
    entry = tune.TuningCache(path).lookup(key)
    assert entry["options"] == {"lookahead": 3, "minibatch_rows": 3072}
    assert entry["speedup"] == 1.04 and entry["tool"] == "mok_cli tune"
    # The two writers lay the file out alike: Python's rewrite of it is the same text.
    assert json.dumps(json.loads(_CPP_FILE), indent=1, sort_keys=True) == _CPP_FILE
    tune.TuningCache(path).store(_key(2), {"ring_slots": 3})
    assert tune.TuningCache(path).lookup(key) == entry


def test_the_grid_is_read_from_the_file_mok_cli_has_built_in():
    grid_file = pathlib.Path(tune.__file__).with_name("tuning_grid.txt")
    assert tune.DEFAULT_GRID == tune.read_grid(grid_file.read_text())
    assert list(tune.DEFAULT_GRID) == ["minibatch_rows", "comm_ctas_per_rank", "ring_slots", "lookahead"]
    assert tune.read_grid("# why\nring_slots 2 3  # note\n\n") == {"ring_slots": [2, 3]}
    assert tune.DEFAULT_GRID["comm_ctas_per_rank"] == [2, 3, 4, 5, 6, 7, 8, "x0.5", "x0.67", "x0.8", "x1.25", "x1.5",
                                                       "x2"]
    assert GRID == {"minibatch_rows": [512, 1024, 2048, 3072, 4096, 6144, 8192],
                    "comm_ctas_per_rank": [2, 3, 4, 5, 6, 7, 8], "ring_slots": [2, 3, 4, 6], "lookahead": [1, 2, 3]}
    for bad in ("ring_slots 2 x\n", "ring_slots x0\n", "ring_slots x-1\n", "ring_slots 1.5\n", "ring_slots xinf\n"):
        with pytest.raises(ValueError, match="line 1"):
            tune.read_grid(bad)


def test_factors_bracket_the_librarys_value_on_any_layer():
    def comm(library):
        return tune.resolve_grid(tune.DEFAULT_GRID, {"comm_ctas_per_rank": library})["comm_ctas_per_rank"]
    # The same values as tests/cpu/test_tune_search.cpp's.
    assert comm(30) == [2, 3, 4, 5, 6, 7, 8, 15, 20, 24, 38, 45, 60]
    assert comm(9) == [2, 3, 4, 5, 6, 7, 8, 11, 14, 18]
    assert comm(1) == [2, 3, 4, 5, 6, 7, 8]
    with pytest.raises(ValueError, match="comm_ctas_per_rank"):
        tune.resolve_grid(tune.DEFAULT_GRID, {})
    assert tune.resolve_grid({"ring_slots": [2, 3]}, {}) == {"ring_slots": [2, 3]}


def test_the_library_value_the_factors_scale_is_the_rule_of_the_c_plus_plus_library():
    # No GPU needed: the rule is host arithmetic (plan/sm_split.cpp; its CPU
    # test expects these counts on 132 SMs).
    assert tune.library_values(7168, 2048, 32, 8, 2048, 4096, sms=132) == {"comm_ctas_per_rank": 4}
    assert tune.library_values(2048, 768, 128, 8, 0, 4096, sms=132) == {"comm_ctas_per_rank": 30}
    with pytest.raises(RuntimeError, match="ctas_per_rank"):
        tune.library_values(7168, 2048, 32, 8, 2048, 4096, sms=1)


def _store_many(path, world):
    cache = tune.TuningCache(path)
    for i in range(20):
        cache.store(_key(world), {"minibatch_rows": 1024 + i})


def test_concurrent_writers_leave_a_valid_file_with_every_entry(tmp_path):
    path = str(tmp_path / "tuning.json")
    procs = [multiprocessing.get_context("fork").Process(target=_store_many, args=(path, w)) for w in range(1, 7)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    data = json.loads(open(path).read())
    assert data["version"] == tune.CACHE_VERSION
    assert sorted(data["entries"]) == sorted(_key(w).id() for w in range(1, 7))
    assert all(e["options"] == {"minibatch_rows": 1043} for e in data["entries"].values())
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tuning.")]  # no temporary left behind


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    result = tune.search({}, GRID, lambda a, b: _cost(a) / _cost(b), budget_s=30, progress=False)
    out = tmp_path / "sweep.png"
    tune.plot(result, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_driver_version_is_read_from_libcuda_or_is_zero_without_one(monkeypatch):
    import ctypes

    from mok.tune import driver_version

    class FakeLibcuda:
        def cuDriverGetVersion(self, out):  # noqa: N802 (the driver API's name)
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int)).contents.value = 12080
            return 0

    driver_version.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeLibcuda())
    assert driver_version() == "12080"
    driver_version.cache_clear()

    def missing(name):
        raise OSError(name + ": cannot open shared object file")
    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert driver_version() == "0"
    driver_version.cache_clear()


def test_a_candidate_the_library_refuses_is_never_faster():
    # paired_compare's first call of the candidate raises (as the op does
    # for an option this layer cannot run): infinity, before any timing. The
    # baseline runs first, once; a baseline the library refuses (a layer it
    # cannot run at all) ends the search with the op's error.
    calls = []

    def forward(*args, num_experts, **options):
        calls.append(options["minibatch_rows"])
        if options["minibatch_rows"] in (512, 1024):
            raise RuntimeError(f"minibatch_rows = {options['minibatch_rows']} refused")

    compare = tune.paired_compare((), 4, forward=forward)
    assert compare({"minibatch_rows": 512}, {}) == math.inf
    assert compare({"minibatch_rows": 1024}, {}) == math.inf
    assert calls == [0, 512, 1024]  # the baseline once, each candidate once, nothing timed
    with pytest.raises(RuntimeError, match="1024 refused"):
        compare({"minibatch_rows": 512}, {"minibatch_rows": 1024})
