"""The ``in_place`` check: what a call writes, and what it must leave alone.

The new keys and values land in the caller's caches at ``cache_seqlens`` (through the page table
and ``cache_batch_idx``), keys rotated when rotary tables are given; every other cache entry keeps
its value; no other input changes (``out``, when given, is the one other tensor written). Caches
are compared exactly with the oracle's, rotated keys up to one rounding of their fp32 value.
:func:`check_out_buffer` checks the ``out=`` buffer: written, and returned as itself.
"""

from __future__ import annotations

import torch

from .call import Outcome, cpu_copy, raised
from .calls import make_case
from .oracle import kvcache_oracle
from .tolerance import rounding_error
from .values import check_values, oracle_args
from .verdict import Verdict, failed, measured, passed

WRITTEN = ("k_cache", "v_cache", "out")


def check_in_place(before: dict, after: dict, outcome: Outcome) -> Verdict:
    """The caches in ``after`` (the arguments after the call) against the oracle's caches for
    ``before``; every other tensor of ``after`` equal to ``before``."""
    problem = raised(outcome)
    if problem:
        return failed(problem)
    for name, old in before.items():
        if (
            isinstance(old, torch.Tensor)
            and name not in WRITTEN
            and not torch.equal(cpu_copy(after[name]), old)
        ):
            return failed(f"input {name} was modified by the call")
    expected = kvcache_oracle(**oracle_args(before))
    rotated = before.get("rotary_cos") is not None
    ratio, details = 0.0, []  # ratio: the rotated keys' (the rest is exact)
    for name, want in (("v_cache", expected.v_cache), ("k_cache", expected.k_cache)):
        if before.get(name) is None:
            continue
        got = cpu_copy(after[name])
        if name == "k_cache" and rotated:
            ratio, detail = rounding_error(got, want)
            details.append(f"k_cache (rotated keys): {detail}")
            continue
        problem = _first_difference(name, got, want, before[name])
        if problem:
            return failed(problem)
        details.append(f"{name} exact")
    return measured(ratio, "; ".join(details)) if rotated else passed("; ".join(details))


def _first_difference(
    name: str, got: torch.Tensor, want: torch.Tensor, old: torch.Tensor
) -> str | None:
    """None when ``got`` equals ``want`` exactly; else where they differ, and whether the entry is
    one the call should have written (differs from ``old``) or one it should have left alone."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return (
            f"{name} changed shape or dtype: {got.dtype} {tuple(got.shape)}, "
            f"expected {want.dtype} {tuple(want.shape)}"
        )
    # (rows or pages, tokens): any head or channel
    differ = (got.float() != want.float()).flatten(2).any(-1)
    if not differ.any():
        return None
    slots = differ.nonzero().tolist()
    appended = (want.float() != old.float()).flatten(2).any(-1)
    stray = [s for s in slots if not appended[s[0], s[1]]]
    kind = (
        f"{len(stray)} slot(s) the call must not touch were written, first {tuple(stray[0])}"
        if stray
        else f"{len(slots)} appended slot(s) hold wrong values, first {tuple(slots[0])}"
    )
    return f"{name} (row or page, token): {kind}"


def out_buffer_case(**case) -> dict:
    """:func:`calls.make_case` plus ``out``: a NaN-filled buffer of the output's shape and dtype."""
    args = make_case(**case)
    ref = args["qv"] if args.get("only_qv") else args["q"]
    dtype = torch.bfloat16 if ref.dtype == torch.float8_e4m3fn else ref.dtype
    args["out"] = torch.full(
        (*ref.shape[:-1], args["v_cache"].shape[-1]), float("nan"), dtype=dtype, device=ref.device
    )
    return args


def check_out_buffer(before: dict, after: dict, outcome: Outcome) -> Verdict:
    """The returned output is the caller's ``out`` tensor itself, holding the right values."""
    problem = raised(outcome)
    if problem:
        return failed(problem)
    if outcome[0] is not after["out"]:
        return failed("the returned output is not the out= tensor that was passed")
    return check_values(before, after, outcome)
