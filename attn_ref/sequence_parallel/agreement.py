"""Ranks that make different calls get the same error, instead of one of them aborting inside a
collective.

Every rank of a sequence-parallel group must make the same call: the same function, dtypes, shapes
(apart from the varlen sequence dim), heads, replicated counts and group layout. When one rank
passes, say, a float16 ``q`` and the others float32, the first all-to-all sends buffers of different
sizes: gloo aborts that rank ("Received data size doesn't match expected size", on stderr only),
NCCL hangs or reads garbage, and a check that fails on one rank only leaves the others waiting.

:func:`run_checks_on_every_rank` prevents that with **one small all-gather per call**, before the
call's first collective. Each rank runs its own argument checks, then contributes three CRC-32s:
of the call's name, of its metadata (the fields that must agree) and of the error its checks raised
(if any). When all rows agree, each rank returns (or raises its own error, the same on every rank).
When they differ, every rank sees the same gathered rows, so all of them take a second, rare step:
an ``all_gather_object`` of the readable metadata, and the same :func:`check_ranks_agree`
error on every rank, naming the first field that differs and each rank's value.

Ranks whose groups have different members cannot meet in one collective; that call still waits
until the process group's timeout. (Groups with the same members are shared, :mod:`.groups`.)

Cost: one single-tensor all-gather of ``3 x P`` int64 values (plus a device-to-host copy on NCCL).
Measured on gloo (CPU): see ``docs/concepts/sequence-parallel-usage.md``. Turn it off with the
environment variable ``ATTN_REF_SP_CHECK_RANKS=0`` (or ``false``, ``no``, ``off``): each rank then
only checks its own arguments, as before.
"""

from __future__ import annotations

import zlib
from typing import Callable, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

from ..switches import switch_on
from .comm import Group, group_size

#: Environment variable that turns the cross-rank check off.
CHECK_RANKS_ENV = "ATTN_REF_SP_CHECK_RANKS"

T = TypeVar("T")

#: ``torch.distributed``'s one-tensor all-gather (named ``all_gather_into_tensor`` before torch
#: 2.13).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def rank_check_enabled() -> bool:
    """Whether :func:`run_checks_on_every_rank` compares the ranks (``ATTN_REF_SP_CHECK_RANKS``)."""
    return switch_on(CHECK_RANKS_ENV)


def describe(x: object, varlen_dim: Optional[int] = None) -> object:
    """What must agree about an argument: a tensor's shape, dtype and device type, else its value.

    ``varlen_dim``: a dim whose size may differ between ranks (the local length of a varlen call).
    """
    if not isinstance(x, torch.Tensor):
        return (
            x
            if x is None or isinstance(x, (bool, int, float, str, tuple, list))
            else type(x).__name__
        )
    shape = ["*" if d == varlen_dim else n for d, n in enumerate(x.shape)]
    return (tuple(shape), str(x.dtype), x.device.type)


def run_checks_on_every_rank(group: Group, call: str, fields: dict, checks: Callable[[], T]) -> T:
    """``checks()`` on this rank, then the same outcome on every rank of ``group`` (module
    docstring).

    Args:
        group: the group the call communicates over (None: the default group).
        call: the entry point, e.g. ``"USPAttention.forward"``.
        fields: name -> value of everything the ranks must agree on (see :func:`describe`).
        checks: the call's argument checks; raises the call's own error, or returns its result.
    """
    if group_size(group) == 1 or not rank_check_enabled():
        return checks()
    try:
        result, error = checks(), None
    except (ValueError, TypeError, NotImplementedError) as exc:
        result, error = None, exc
    outcome = None if error is None else f"{type(error).__name__}: {error}"
    mine = [_crc(call), _crc(repr(sorted(fields.items()))), _crc(repr(outcome))]
    if _rows_differ(mine, group):
        summaries: list = [None] * group_size(group)
        dist.all_gather_object(summaries, (call, fields, outcome), group=group)
        check_ranks_agree(summaries)
    if error is not None:
        raise error
    return result


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "backslashreplace"))


def _rows_differ(mine: list[int], group: Group) -> bool:
    """All-gather ``mine`` over ``group``; whether any rank's row differs (the same answer on every
    rank)."""
    device = _collective_device(group)
    row = torch.tensor(mine, dtype=torch.int64, device=device)
    # rank r: [3r, 3r + 3)
    rows = torch.empty(group_size(group) * len(mine), dtype=torch.int64, device=device)
    _all_gather_single(rows, row, group=group)
    return bool((rows.view(-1, len(mine)) != row).any().item())


def _collective_device(group: Group) -> torch.device:
    """Where the group's collectives take their tensors: the current CUDA device for NCCL, else the
    CPU."""
    if "nccl" in str(dist.get_backend(group)).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_ranks_agree(summaries: Sequence[tuple[str, dict, Optional[str]]]) -> None:
    """Every rank of the group made the same call: ``(call, fields, error or None)`` per rank,
    gathered.

    Names the first thing that differs: the entry point, a field (in the call's order), or the error
    the ranks' own checks raised. Every rank holds the same list, so every rank raises the same
    error.
    """
    calls, fields, outcomes = zip(*summaries)
    names = list(fields[0]) if len(set(calls)) == 1 else []
    candidates = [("the call", list(calls))]
    candidates += [(name, [f.get(name) for f in fields]) for name in names]
    candidates += [("the outcome of the argument checks", [o or "no error" for o in outcomes])]
    for what, values in candidates:
        if any(value != values[0] for value in values):
            per_rank = ", ".join(f"rank {rank}: {value}" for rank, value in enumerate(values))
            raise ValueError(
                f"the ranks of the sequence-parallel group disagree on {what} ({per_rank}); every "
                "rank must make the same call (same dtypes, shapes, heads, replicated counts and "
                "group layout)"
            )
