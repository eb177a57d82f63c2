"""The ``odd_shapes`` checks: calls at the edges of the shapes the API allows, judged on values and
in-place effects together (:func:`check_call`).

Zero-length keys (out 0, LSE +inf for zero-length KV tensors; -inf for rows with no cached key),
empty batches and packed queries with no rows, one-token caches, and inputs that are strided views
(only the last dimension has to be contiguous in the API): :func:`strided_case` puts the values of
a random call into views of larger buffers, so the caches the call must write are views too.
"""

from __future__ import annotations

import torch

from .call import Outcome
from .calls import make_case
from .in_place import check_in_place
from .values import check_values
from .verdict import Verdict, worst

STRIDED = ("q", "k", "v", "qv", "k_cache", "v_cache")


def check_call(before: dict, after: dict, outcome: Outcome) -> Verdict:
    """:func:`values.check_values` and :func:`in_place.check_in_place` of one call."""
    return worst(check_values(before, after, outcome), check_in_place(before, after, outcome))


def strided_case(**case) -> dict:
    """:func:`calls.make_case` with q, k, v, qv and the caches replaced by views of buffers with one
    more head (``buffer[..., :h, :]``): same values, last dimension contiguous, the rest not."""
    args = make_case(**case)
    for name in STRIDED:
        x = args.get(name)
        if isinstance(x, torch.Tensor):
            buffer = torch.zeros(
                *x.shape[:-2], x.shape[-2] + 1, x.shape[-1], dtype=x.dtype, device=x.device
            )
            buffer[..., :-1, :] = x
            args[name] = buffer[..., :-1, :]
    return args
