"""Sequence-parallel attention across real ranks (gloo on CPU): every scheme equals one device.

Each (implementation, rank count) is spawned once (the module-scoped ``ranks`` fixture of
:mod:`rank_spawns`): every rank runs the collectives, the cases of that world size
(:func:`spawn_cases`) and the error cases with ``attn_ref.sequence_parallel`` or
``kernels.sequence_parallel`` (the shared SP code bound to the Triton kernels, interpreted on
CPU), and reports its tensors and exceptions; the tests
check the reports. For each case, every rank's rows (sharded and replicated) must match
single-process attention over the whole sequence (FlashAttention's tolerance rule for the output,
fp32 noise for the LSE; the low-precision reference is FA's ``upcast=False`` oracle). A hang fails
the fixture through the launcher's timeout instead of blocking the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from attn_ref import sequence_parallel as sp
from rank_spawns import REFERENCE_SPAWNS, each_spawn, each_spawn_and, spawned_ranks
from sp_cases import (
    BATCH,
    HEAD_DIM,
    N_REP,
    SEQ,
    Case,
    _attention,
    _attention_lowp,
    _full_inputs,
    _global_sequence,
    _my_positions,
    _varlen_lens,
)
from tolerance import assert_close_fa, assert_lse_close


def _cases_two_ranks() -> list[Case]:
    cases = [
        Case("ulysses", 2, 1, gqa, causal, replicated=rep)
        for gqa in (False, True)
        for causal in (False, True)
        for rep in ("", "suffix")
    ]
    cases += [Case("ulysses", 2, 1, True, causal, varlen=True) for causal in (False, True)]
    cases += [
        Case("kv_gather", 2, 1, gqa, replicated=rep)
        for gqa in (False, True)
        for rep in ("", "suffix")
    ]
    cases += [
        Case("auto", 2, 1, True, True, replicated="suffix"),
        Case("auto", 2, 1, True, varlen=True),
    ]
    cases += [Case("ring", 1, 2, gqa, causal) for gqa in (False, True) for causal in (False, True)]
    cases += [Case("ring", 1, 2, gqa, True, zigzag=True) for gqa in (False, True)]
    cases += [Case("ring", 1, 2, True, False, zigzag=True)]
    masks = ((False, False), (True, False), (True, True))  # (causal, zigzag)
    cases += [
        Case("usp", 1, 2, True, causal, zigzag, rep)
        for rep in ("prefix", "suffix", "kv_prefix")
        for causal, zigzag in masks
    ]
    cases += [
        Case("usp", 2, 1, gqa, causal, replicated=rep)
        for gqa, rep in ((False, ""), (True, "prefix"), (False, "suffix"), (True, "kv_prefix"))
        for causal in (False, True)
    ]
    cases += [
        Case("ulysses", 2, 1, True, True, replicated="suffix", dtype="float16"),
        Case("ring", 1, 2, True, True, zigzag=True, dtype="float16"),
        Case("usp", 1, 2, True, True, True, "prefix", dtype="float16"),
    ]
    return cases


def _cases_four_ranks() -> list[Case]:
    cases = [
        Case("usp", 2, 2, gqa, causal, zigzag, rep)
        for gqa in (False, True)
        for rep in ("", "prefix", "suffix", "kv_prefix")
        for causal, zigzag in ((False, False), (True, False), (True, True))
    ]
    cases += [
        Case("ulysses", 4, 1, gqa, causal, replicated="suffix")
        for gqa in (False, True)
        for causal in (False, True)
    ]
    cases += [Case("ulysses", 4, 1, True, True, varlen=True)]
    cases += [Case("kv_gather", 4, 1, gqa, replicated="suffix") for gqa in (False, True)]
    cases += [Case("ring", 1, 4, True, True, zigzag) for zigzag in (False, True)]
    cases += [
        Case("usp", 1, 4, True, True, True, "suffix"),
        Case("usp", 4, 1, True, True, False, "prefix"),
    ]
    cases += [Case("usp", 2, 2, True, True, True, "prefix", dtype="float16")]
    # two SP groups of 2 ranks ({0, 1} and {2, 3}: data-parallel replicas) in a world of 4
    cases += [
        Case("ulysses", 2, 1, True, True, replicated="suffix"),
        Case("usp", 2, 1, True, True, replicated="prefix"),
    ]
    return cases


CASES = {2: _cases_two_ranks(), 4: _cases_four_ranks()}


def spawn_cases(spawn) -> list[Case]:
    """The cases a spawn runs: every case for the reference; for the kernels (interpreted on a
    CPU, several times slower) the first case of each layout (scheme, degrees, replicated tokens,
    zigzag, varlen, dtype). GQA and causality are the local attention's, which the kernels' own
    tests cover; the sequence-parallel code around it is the same for both."""
    if spawn.impl != "kernels":
        return CASES[spawn.world]
    layouts: dict[tuple, Case] = {}
    for case in CASES[spawn.world]:
        layout = (
            case.scheme,
            case.ulysses_degree,
            case.ring_degree,
            case.replicated,
            case.zigzag,
            case.varlen,
            case.dtype,
        )
        layouts.setdefault(layout, case)
    return list(layouts.values())


# --------------------------------------------------------------------------------------------------
# Inputs and single-device references
# --------------------------------------------------------------------------------------------------


def _my_rows(case: Case, positions: torch.Tensor) -> torch.Tensor:
    """Rows of the single-device output this rank returns, in its order."""
    if case.replicated == "prefix":
        return torch.cat([torch.arange(N_REP), positions + N_REP])
    if case.replicated == "suffix":
        return torch.cat([positions, torch.arange(SEQ, SEQ + N_REP)])
    return positions


# --------------------------------------------------------------------------------------------------
# What each rank runs
# --------------------------------------------------------------------------------------------------


def run_case(api, case: Case, groups: sp.SequenceParallelGroups) -> dict[str, torch.Tensor]:
    """Run ``case`` with ``api`` (attn_ref.sequence_parallel or kernels.sequence_parallel) on this
    rank.

    Returns this rank's ``out``/``lse`` rows next to the fp32 reference rows and the reference
    computed in the case's dtype; ``replicated`` is the replicated output of a UlyssesAttention
    case.
    """
    x = _full_inputs(case)
    positions = _my_positions(case, groups)
    h, hkv = case.heads
    q, k, v = (x[n][:, positions] for n in "qkv")
    rq, rk, rv = x["rq"], x["rk"], x["rv"]
    replicated, same_without_lse = None, True
    if case.scheme in ("ulysses", "kv_gather", "auto"):
        attn = api.UlyssesAttention(
            h, HEAD_DIM, hkv, causal=case.causal, sp_attention_mode=case.scheme, groups=groups
        )
        reps = (rq, rk, rv) if case.replicated else (None, None, None)
        seq_lens = _varlen_lens(groups.sp_size) if case.varlen else None
        out, replicated, lse, rep_lse = attn(
            q, k, v, *reps, seq_lens=seq_lens, return_softmax_lse=True
        )
        # fewer collectives, same (out, replicated)
        without_lse = attn(q, k, v, *reps, seq_lens=seq_lens)
        same_without_lse = len(without_lse) == 2 and all(
            (a is None and b is None) or torch.equal(a, b)
            for a, b in zip(without_lse, (out, replicated))
        )
        if case.replicated:
            out, lse = torch.cat([out, replicated], 1), torch.cat([lse, rep_lse], 1)
    elif case.scheme == "ring":
        out, lse = api.ring_attention(
            q, k, v, groups.ring_group, causal=case.causal, zigzag=case.zigzag
        )
    else:
        attn = api.USPAttention(
            h, HEAD_DIM, hkv, causal=case.causal, groups=groups, zigzag=case.zigzag
        )
        counts = {"num_replicated_" + case.replicated: N_REP} if case.replicated else {}
        if case.replicated == "prefix":
            q, k, v = (torch.cat([r, t], 1) for r, t in ((rq, q), (rk, k), (rv, v)))
        elif case.replicated == "suffix":
            q, k, v = (torch.cat([t, r], 1) for r, t in ((rq, q), (rk, k), (rv, v)))
        elif case.replicated == "kv_prefix":
            k, v = torch.cat([rk, k], 1), torch.cat([rv, v], 1)
        out, lse = attn(q, k, v, **counts, return_softmax_lse=True)
        same_without_lse = torch.equal(attn(q, k, v, **counts), out)
    gq, gk, gv = _global_sequence(case, x)
    out_ref, lse_ref = _attention(gq.float(), gk.float(), gv.float(), case.causal)
    out_lowp = _attention_lowp(gq, gk, gv, case.causal)
    rows = _my_rows(case, positions)
    return dict(
        out=out,
        lse=lse,
        out_ref=out_ref[:, rows],
        lse_ref=lse_ref[:, rows],
        out_lowp=out_lowp[:, rows],
        replicated=replicated,
        same_without_lse=same_without_lse,
    )


@dataclass(frozen=True)
class ErrorCase:
    """A bad call every rank makes; each must raise ``exc`` with a message matching ``pattern``."""

    name: str
    exc: type
    pattern: str
    call: Callable  # (api, groups_for) -> None; groups_for(U, R) gives this rank's groups


def _qkv(h=4, hkv=4, seq=8, batch=1, dim=HEAD_DIM):
    return (
        torch.randn(batch, seq, h, dim),
        torch.randn(batch, seq, hkv, dim),
        torch.randn(batch, seq, hkv, dim),
    )


def _ulysses(api, groups_for, world, h=4, hkv=4, **kw):
    return api.UlyssesAttention(h, HEAD_DIM, hkv, groups=groups_for(world, 1), **kw)


TOGETHER = re.escape("Replicated Q, K, and V must be provided together.")
NOT_RING_AWARE = r"UlyssesAttention's all-to-all spans the combined sequence parallel group"
ZIGZAG_ODD = r"the zigzag layout needs an even number of rows per ring block"


def error_cases(world: int) -> list[ErrorCase]:
    """The bad calls of a ``world``-rank run (the same on every rank)."""
    w = world
    odd = 3 * w // 2  # a head count the world size does not divide
    rep = _qkv(seq=2)
    kv_gather = dict(sp_attention_mode="kv_gather")
    cases = [
        ErrorCase(
            "ulysses-non-4d",
            ValueError,
            r"Expected 4D tensors",
            lambda api, g: _ulysses(api, g, w)(torch.randn(8, 4, HEAD_DIM), *_qkv()[1:]),
        ),
        ErrorCase(
            "ulysses-replicated-partial",
            ValueError,
            TOGETHER,
            lambda api, g: _ulysses(api, g, w)(*_qkv(), rep[0], None, rep[2]),
        ),
        ErrorCase(
            "kv-gather-replicated-partial",
            ValueError,
            TOGETHER,
            lambda api, g: _ulysses(api, g, w, **kv_gather)(*_qkv(), None, rep[1], None),
        ),
        ErrorCase(
            "kv-gather-varlen",
            NotImplementedError,
            re.escape("K/V-gather SP does not support varlen UlyssesAttention."),
            lambda api, g: _ulysses(api, g, w, **kv_gather)(*_qkv(), seq_lens=[8] * w),
        ),
        ErrorCase(
            "kv-gather-causal",
            ValueError,
            re.escape("K/V-gather SP does not support causal attention."),
            lambda api, g: _ulysses(api, g, w, causal=True, **kv_gather),
        ),
        ErrorCase(
            "ulysses-varlen-replicated",
            ValueError,
            "Varlen Ulysses attention does not support replicated QKV",
            lambda api, g: _ulysses(api, g, w)(*_qkv(), *rep, seq_lens=[8] * w),
        ),
        # sglang's AllToAll4D text, before the replicated tensors are checked (sglang's order)
        ErrorCase(
            "ulysses-heads-not-divisible",
            ValueError,
            rf"\Ahead dimension \({odd}\) must be divisible by sequence parallel world size "
            rf"\({w}\)\Z",
            lambda api, g: _ulysses(api, g, w, h=odd, hkv=odd)(*_qkv(odd, odd), rep[0], None, None),
        ),
        # varlen: usp.py's order, length, then this rank's entry, then its heads text
        ErrorCase(
            "ulysses-varlen-heads",
            ValueError,
            rf"\Ah_global \({odd}\) must be divisible by world_size \({w}\)\Z",
            lambda api, g: _ulysses(api, g, w, h=odd, hkv=odd)(*_qkv(odd, odd), seq_lens=[8] * w),
        ),
        ErrorCase(
            "ulysses-varlen-length-before-heads",
            ValueError,
            rf"seq_lens must have length {w}, got 1",
            lambda api, g: _ulysses(api, g, w, h=odd, hkv=odd)(*_qkv(odd, odd), seq_lens=[8]),
        ),
        ErrorCase(
            "ulysses-seq-lens-not-list",
            TypeError,
            r"seq_lens must be a list of ints, got str",
            lambda api, g: _ulysses(api, g, w)(*_qkv(), seq_lens="8"),
        ),
        ErrorCase(
            "ulysses-seq-lens-not-ints",
            ValueError,
            r"seq_lens must hold non-negative ints, got \[8\.0, 8",
            lambda api, g: _ulysses(api, g, w)(*_qkv(), seq_lens=[8.0] + [8] * (w - 1)),
        ),
        # USP: the replicated-mode check comes before usp.py's heads assert
        ErrorCase(
            "usp-modes-before-heads",
            ValueError,
            re.escape("USPAttention supports at most one replicated-token mode per call."),
            lambda api, g: api.USPAttention(odd, HEAD_DIM, groups=g(w, 1))(
                *_qkv(odd, odd), num_replicated_prefix=1, num_replicated_suffix=1
            ),
        ),
        ErrorCase(
            "usp-heads",
            ValueError,
            rf"\Ah_global \({odd}\) must be divisible by world_size \({w}\)\Z",
            lambda api, g: api.USPAttention(odd, HEAD_DIM, groups=g(w, 1))(*_qkv(odd, odd)),
        ),
        ErrorCase(
            "ulysses-kv-heads-not-divisible",
            ValueError,
            r"num_kv_heads \(1\) must be divisible by the sequence parallel world size",
            lambda api, g: _ulysses(api, g, w, h=4, hkv=1)(*_qkv(4, 1)),
        ),
        ErrorCase(
            "ulysses-seq-lens-length",
            ValueError,
            rf"seq_lens must have length {w}, got {w + 1}",
            lambda api, g: _ulysses(api, g, w)(*_qkv(), seq_lens=[8] * (w + 1)),
        ),
        ErrorCase(
            "ulysses-seq-lens-local",
            ValueError,
            r"s_local \(8\) must equal seq_lens\[\d\] \(7\)",
            lambda api, g: _ulysses(api, g, w)(*_qkv(), seq_lens=[7] * w),
        ),
        ErrorCase(
            "ulysses-shapes",
            ValueError,
            r"k and v must have q's sequence length",
            lambda api, g: _ulysses(api, g, w)(*_qkv()[:2], torch.randn(1, 7, 4, HEAD_DIM)),
        ),
        ErrorCase(
            "usp-modes",
            ValueError,
            re.escape("USPAttention supports at most one replicated-token mode per call."),
            lambda api, g: api.USPAttention(4, HEAD_DIM, groups=g(1, w))(
                *_qkv(), num_replicated_prefix=1, num_replicated_suffix=1
            ),
        ),
        ErrorCase(
            "usp-count-bool",
            TypeError,
            r"num_replicated_prefix must be an int, got bool",
            lambda api, g: api.USPAttention(4, HEAD_DIM, groups=g(1, w))(
                *_qkv(), num_replicated_prefix=True
            ),
        ),
        ErrorCase(
            "usp-count-negative",
            ValueError,
            r"num_replicated_suffix must be >= 0, got -2",
            lambda api, g: api.USPAttention(4, HEAD_DIM, groups=g(1, w))(
                *_qkv(), num_replicated_suffix=-2
            ),
        ),
        ErrorCase(
            "usp-kv-prefix-rows",
            ValueError,
            re.escape(
                "k and v must have q's sequence length + 3 K/V-only prefix rows (dim 1): q 8, k 8, "
                "v 8"
            ),
            lambda api, g: api.USPAttention(4, HEAD_DIM, groups=g(1, w))(
                *_qkv(), num_replicated_kv_prefix=3
            ),
        ),
        ErrorCase(
            "usp-zigzag-odd-block",
            ValueError,
            ZIGZAG_ODD,
            lambda api, g: api.USPAttention(4, HEAD_DIM, causal=True, groups=g(1, w), zigzag=True)(
                *_qkv(seq=7)
            ),
        ),
        ErrorCase(
            "usp-replicated-too-long",
            ValueError,
            r"num_replicated_suffix \(8\) must be smaller than q's local sequence length \(8\)",
            lambda api, g: api.USPAttention(4, HEAD_DIM, groups=g(1, w))(
                *_qkv(), num_replicated_suffix=8
            ),
        ),
        ErrorCase(
            "ring-zigzag-odd",
            ValueError,
            ZIGZAG_ODD,
            lambda api, g: api.ring_attention(
                *_qkv(seq=7), g(1, w).ring_group, causal=True, zigzag=True
            ),
        ),
        ErrorCase(
            "ring-non-4d",
            ValueError,
            r"Expected 4D tensors",
            lambda api, g: api.ring_attention(
                torch.randn(8, 4, HEAD_DIM), *_qkv()[1:], g(1, w).ring_group
            ),
        ),
        ErrorCase(
            "all-to-all-heads",
            ValueError,
            r"head dimension \(3\) must be divisible by sequence parallel world size "
            rf"\({w}\)",
            lambda api, g: sp.all_to_all_4d(torch.randn(1, 4, 3, 2), 2, 1, g(w, 1).sp_group),
        ),
        ErrorCase(
            "all-to-all-seq",
            ValueError,
            r"sequence dimension \(5\) must be divisible by sequence parallel world size "
            rf"\({w}\)",
            lambda api, g: sp.all_to_all_4d(torch.randn(1, 5, 4, 2), 1, 2, g(w, 1).sp_group),
        ),
        ErrorCase(
            "all-to-all-dims",
            ValueError,
            r"Invalid scatter_dim=1, gather_dim=3",
            lambda api, g: sp.all_to_all_4d(torch.randn(1, 4, 4, 2), 1, 3, g(w, 1).sp_group),
        ),
        ErrorCase(
            "all-to-all-non-4d",
            ValueError,
            r"input must be 4D tensor, got 3",
            lambda api, g: sp.all_to_all_4d(torch.randn(4, 4, 2), 2, 1, g(w, 1).sp_group),
        ),
        ErrorCase(
            "all-gather-dim",
            ValueError,
            r"Invalid dim \(3\) for input tensor with shape",
            lambda api, g: sp.all_gather(torch.randn(2, 2, 2), 3, g(w, 1).sp_group),
        ),
    ]
    if world == 4:
        cases += [
            ErrorCase(
                "ulysses-under-ring",
                NotImplementedError,
                NOT_RING_AWARE,
                lambda api, g: api.UlyssesAttention(4, HEAD_DIM, groups=g(2, 2)),
            ),
            ErrorCase(
                "usp-heads-not-divisible",
                ValueError,
                r"h_global \(1\) must be divisible by world_size \(2\)",
                lambda api, g: api.USPAttention(4, HEAD_DIM, 1, groups=g(2, 2))(*_qkv(4, 1)),
            ),
        ]
    else:
        cases.append(
            ErrorCase(
                "ulysses-under-ring",
                NotImplementedError,
                NOT_RING_AWARE,
                lambda api, g: api.UlyssesAttention(4, HEAD_DIM, groups=g(1, 2)),
            )
        )
    return cases


def run_collectives(groups: sp.SequenceParallelGroups, ring_group) -> dict[str, torch.Tensor]:
    """Each collective applied to a tensor whose values name their rank, token and head.

    ``x [B, 3, 2P, D]`` (equal shards) and ``x_varlen [B, S_rank, 2P, D]`` (``_varlen_lens``).
    """
    world, rank, group = groups.sp_size, groups.sp_rank, groups.sp_group

    def tokens(n):
        shape = (BATCH, n, 2 * world, 4)
        return rank * 1000 + torch.arange(BATCH * n * 2 * world * 4, dtype=torch.float32).reshape(
            shape
        )

    x, x_varlen = tokens(3), tokens(_varlen_lens(world)[rank])
    heads = sp.all_to_all_4d(x, 2, 1, group)
    heads_varlen = sp.all_to_all_4d(x_varlen, 2, 1, group, seq_lens=_varlen_lens(world))
    exchange = sp.RingExchange(ring_group)
    received = exchange.start(x)
    exchange.wait()
    return dict(
        x=x,
        heads=heads,
        back=sp.all_to_all_4d(heads, 1, 2, group),
        x_varlen=x_varlen,
        heads_varlen=heads_varlen,
        back_varlen=sp.all_to_all_4d(heads_varlen, 1, 2, group, seq_lens=_varlen_lens(world)),
        gathered=sp.all_gather(x, dim=1, group=group),
        received=received,
    )


def run_rank(api_name: str, case_ids: list[str], world: int) -> dict:
    """Body of every rank: the collectives, the cases named ``case_ids`` and all error cases."""
    import importlib

    api = importlib.import_module(f"{api_name}.sequence_parallel")
    groups: dict[tuple[int, int], sp.SequenceParallelGroups] = {}

    def groups_for(u, r):
        if (u, r) not in groups:  # the same creation order on every rank (new_group is collective)
            groups[(u, r)] = sp.init_sequence_parallel_groups(u, r)
        return groups[(u, r)]

    for u, r in [(world, 1), (1, world)] + ([(2, 2)] if world == 4 else []):
        groups_for(u, r)
    by_id = {case.id: case for case in CASES[world]}
    torch.manual_seed(0)
    report: dict = {
        "collectives": run_collectives(groups_for(world, 1), groups_for(1, world).ring_group),
        "cases": {},
        "errors": {},
    }
    for case_id in case_ids:
        case = by_id[case_id]
        report["cases"][case_id] = run_case(
            api, case, groups_for(case.ulysses_degree, case.ring_degree)
        )
    for error in error_cases(world):
        try:
            error.call(api, groups_for)
            report["errors"][error.name] = None
        # reported to the parent, which checks type and text
        except Exception as exc:  # noqa: BLE001
            report["errors"][error.name] = (type(exc), str(exc))
    return report


# --------------------------------------------------------------------------------------------------
# Checks of the reports
# --------------------------------------------------------------------------------------------------


def check_case(reports: list[dict], case: Case) -> None:
    """Every rank's rows match the single-device reference; replicated outputs agree across
    ranks."""
    for rank, report in enumerate(reports):
        r = report["cases"][case.id]
        assert r["out"].dtype == getattr(torch, case.dtype), f"rank {rank}"
        assert r["same_without_lse"], f"rank {rank}: return_softmax_lse=False changed the result"
        assert_close_fa(r["out"], r["out_ref"], r["out_lowp"])
        assert_lse_close(r["lse"], r["lse_ref"])
    if case.scheme in ("ulysses", "kv_gather", "auto") and case.replicated:
        first = reports[0]["cases"][case.id]["replicated"]
        for report in reports[1:]:
            # all-gathered / same inputs
            assert torch.equal(report["cases"][case.id]["replicated"], first)


def check_error(reports: list[dict], error: ErrorCase) -> None:
    """Every rank raised ``error.exc`` with the expected text."""
    for rank, report in enumerate(reports):
        got = report["errors"][error.name]
        assert got is not None, f"rank {rank}: {error.name} raised nothing"
        exc_type, message = got
        assert exc_type is error.exc, f"rank {rank}: {exc_type.__name__}: {message}"
        assert re.search(error.pattern, message), f"rank {rank}: {message!r}"


def check_collectives(reports: list[dict]) -> None:
    """Layouts of every collective, from all ranks' inputs; all-to-all round trips are bit-exact."""
    world = len(reports)
    views = [r["collectives"] for r in reports]
    for rank, view in enumerate(views):
        hp = view["x"].shape[2] // world
        mine = slice(rank * hp, (rank + 1) * hp)  # the heads all-to-all gives this rank
        assert torch.equal(view["heads"], torch.cat([v["x"][:, :, mine] for v in views], 1))
        assert torch.equal(
            view["heads_varlen"], torch.cat([v["x_varlen"][:, :, mine] for v in views], 1)
        )
        assert torch.equal(view["back"], view["x"]) and torch.equal(
            view["back_varlen"], view["x_varlen"]
        )
        assert torch.equal(view["gathered"], torch.cat([v["x"] for v in views], 1))
        assert torch.equal(view["received"], views[(rank - 1) % world]["x"])


ranks = spawned_ranks(run_rank, spawn_cases)


@each_spawn(REFERENCE_SPAWNS)
def test_collectives(ranks):
    """The collectives are ``attn_ref.sequence_parallel``'s in every spawn: checked on the
    reference's."""
    check_collectives(ranks)


@each_spawn_and("case", spawn_cases)
def test_match_single_device(ranks, case):
    check_case(ranks, case)


@each_spawn_and("error", lambda spawn: error_cases(spawn.world), item_id=lambda error: error.name)
def test_errors_on_every_rank(ranks, error):
    check_error(ranks, error)
