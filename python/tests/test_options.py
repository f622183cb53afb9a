"""The tuning options are written once (python/csrc/tuning_options.hpp): the
Python keywords, the op's `tuning` list and the op cache key all come from
that list."""

import torch

import mok
from mok.options import TUNING_OPTIONS, tuning_list


def test_the_names_come_from_the_library():
    assert TUNING_OPTIONS == tuple(torch.ops.mok.tuning_option_names())
    assert set(TUNING_OPTIONS) == {"minibatch_rows", "ring_slots", "lookahead", "ctas_per_rank",
                                   "comm_ctas_per_rank"}
    assert mok.TUNING_OPTIONS == TUNING_OPTIONS


def test_the_list_follows_the_library_order_and_defaults_to_zero():
    values = tuning_list({"ring_slots": 3, "minibatch_rows": 256})
    assert len(values) == len(TUNING_OPTIONS)
    assert values[TUNING_OPTIONS.index("ring_slots")] == 3
    assert values[TUNING_OPTIONS.index("minibatch_rows")] == 256
    assert sum(values) == 259


def test_the_process_world_takes_the_same_list():
    schema = str(torch.ops.mok.process_world_create.default._schema)
    assert "int[] tuning" in schema
    assert "int[] tuning" in str(torch.ops.mok.fused_forward.default._schema)


def test_the_cache_reports_its_bound():
    held, capacity = torch.ops.mok.forward_cache_info()
    assert 0 <= held <= capacity and capacity >= 1
