"""The fused forward's tuning options, by name.

The names come from the library (torch.ops.mok.tuning_option_names(), the one
list in python/csrc/tuning_options.hpp), so that the Python keywords, the op's
`tuning` argument and the op cache key cannot disagree. Each is a field of
FusedForwardOptions (include/mok/fused_forward.hpp); 0 keeps the library's
default (for the CTA counts, its automatic choice).
"""

from __future__ import annotations

import torch

TUNING_OPTIONS: tuple[str, ...] = tuple(torch.ops.mok.tuning_option_names())


def tuning_list(options: dict) -> list[int]:
    """The op's `tuning` argument from keyword arguments (missing ones: 0).
    Unknown names raise TypeError, as an unknown keyword does."""
    unknown = sorted(set(options) - set(TUNING_OPTIONS))
    if unknown:
        raise TypeError("mok: unknown tuning option(s) %s; the options are %s"
                        % (", ".join(unknown), ", ".join(TUNING_OPTIONS)))
    return [int(options.get(name, 0)) for name in TUNING_OPTIONS]


def token_capacity(max_tokens) -> int:
    """The ops' token_capacity for a layer's max_tokens (mok.nn.MoE,
    mok.hf.register): a positive integer, or None for no capacity (0).
    Anything else raises ValueError naming it."""
    import numbers
    if max_tokens is None:
        return 0
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) or max_tokens < 1:
        raise ValueError(f"max_tokens = {max_tokens!r}: must be a positive int (or None)")
    return int(max_tokens)
