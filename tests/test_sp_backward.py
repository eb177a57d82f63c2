"""Gradients through sequence-parallel attention on real gloo ranks equal single-device gradients.

Each (implementation, rank count) is spawned once (the module-scoped ``ranks`` fixture of
:mod:`rank_spawns`): the reference runs every case, the Triton kernels (the ring backward and the
collectives' adjoints over the Triton backward, interpreted on CPU) a few. Every rank builds its
shard of one global problem (the layouts of :mod:`test_sequence_parallel_ranks`), runs an SP entry
point, and calls ``torch.autograd.backward`` on its outputs (and LSEs, when the entry point returns
them) with its rows of one global upstream gradient, passed **non-contiguous** (gloo scrambles
non-contiguous buffers silently, which is why the collectives' backwards make gradients
contiguous first). Replicated rows get the same upstream gradient on every rank.

The expected gradients are float64 autograd of dense attention over the whole sequence, for the
single-device loss ``Σ out·dO + Σ lse·dLSE`` in which the replicated rows appear once. Each rank's
gradients of its q/k/v (and of its replicated inputs, which must be the full gradient on every rank)
must match them by FlashAttention's rule: the baseline is autograd through dense attention in the
case's dtype (so fp32 cases are held to fp32 noise). A naive sum of the ranks' replicated gradients
counts the replicated rows ``P`` times, and must fail that same check.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import pytest
import torch

from attn_ref import sequence_parallel as sp
from backward_cases import dense_forward
from rank_spawns import REFERENCE_SPAWNS, each_spawn_and, spawned_ranks
from sp_cases import (
    BATCH,
    HEAD_DIM,
    N_REP,
    SEQ,
    Case,
    _full_inputs,
    _global_sequence,
    _my_positions,
    _varlen_lens,
)
from tolerance import assert_close_fa

SCALE = HEAD_DIM**-0.5


@dataclass(frozen=True)
class GradCase(Case):
    """A :class:`~test_sequence_parallel_ranks.Case`; schemes also ``"rfa"``
    (``ring_flash_attn_func`` / ``zigzag_ring_flash_attn_func``) and ``"rfa_kv"`` (their
    ``_kvpacked_func``), which return no LSE."""


def _cases_two_ranks() -> list[GradCase]:
    return [
        GradCase("ulysses", 2, 1, True, True, replicated="suffix"),
        GradCase("ulysses", 2, 1, False, False, replicated="suffix"),
        GradCase("ulysses", 2, 1, True, True, varlen=True),
        GradCase("ulysses", 2, 1, True, True, replicated="suffix", dtype="float16"),
        GradCase("kv_gather", 2, 1, True, replicated="suffix"),
        GradCase("kv_gather", 2, 1, False),
        GradCase("ring", 1, 2, True, False),
        GradCase("ring", 1, 2, True, True),
        GradCase("ring", 1, 2, True, True, zigzag=True),
        GradCase("ring", 1, 2, True, True, zigzag=True, dtype="bfloat16"),
        GradCase("rfa", 1, 2, True, True),
        GradCase("rfa", 1, 2, False, True, zigzag=True),
        GradCase("rfa_kv", 1, 2, True, True, zigzag=True, dtype="float16"),
        GradCase("usp", 1, 2, True, True, True, "prefix"),
        GradCase("usp", 1, 2, True, True, False, "kv_prefix"),
        GradCase("usp", 1, 2, True, False, False, "suffix", dtype="float16"),
        GradCase("usp", 2, 1, True, True, replicated="prefix"),
        GradCase("usp", 2, 1, False, True, replicated="kv_prefix"),
    ]


def _cases_four_ranks() -> list[GradCase]:
    return [
        GradCase("usp", 2, 2, True, True, True, "prefix"),
        GradCase("usp", 2, 2, True, True, False, "kv_prefix"),
        GradCase("usp", 2, 2, False, False, False, "suffix"),
        GradCase("usp", 2, 2, True, True, True, ""),
        GradCase("usp", 2, 2, True, True, True, "suffix", dtype="bfloat16"),
        GradCase("usp", 1, 4, True, True, True, "suffix"),
        GradCase("ulysses", 4, 1, True, True, replicated="suffix"),
        GradCase("ulysses", 4, 1, True, True, varlen=True),
        GradCase("kv_gather", 4, 1, True, replicated="suffix"),
        GradCase("ring", 1, 4, True, True, zigzag=True),
        GradCase("ring", 1, 4, True, True, dtype="float16"),
        GradCase("rfa", 1, 4, True, True, zigzag=True),
    ]


CASES = {2: _cases_two_ranks(), 4: _cases_four_ranks()}

#: The cases the kernels run (interpreter: a few, one per scheme), by world size; the reference runs
#: all.
KERNEL_CASE_IDS = {
    2: [
        "ulysses2x1-gqa-causal-rep-suffix-float16",
        "kv_gather2x1-gqa-full-rep-suffix",
        "ring1x2-gqa-causal-zigzag-bfloat16",
        "usp1x2-gqa-causal-zigzag-rep-prefix",
    ],
    4: ["usp2x2-gqa-causal-zigzag-rep-prefix"],
}


def spawn_cases(spawn) -> list[GradCase]:
    """The cases one :class:`~rank_spawns.Spawn` runs, in ``CASES`` order."""
    cases = CASES[spawn.world]
    return (
        cases
        if spawn.impl == "attn_ref"
        else [c for c in cases if c.id in KERNEL_CASE_IDS[spawn.world]]
    )


# --------------------------------------------------------------------------------------------------
# Rows: where each rank's tensors sit in the single-device problem
# --------------------------------------------------------------------------------------------------


def _rows(case: GradCase, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the global q and of the global k/v that this rank's local q and k/v hold.

    Ulysses' replicated tensors are separate inputs (rows ``SEQ..SEQ+N_REP``, a suffix), not listed.
    """
    rep = torch.arange(N_REP)
    if case.scheme == "usp" and case.replicated == "prefix":
        rows = torch.cat([rep, positions + N_REP])
        return rows, rows
    if case.scheme == "usp" and case.replicated == "suffix":
        rows = torch.cat([positions, SEQ + rep])
        return rows, rows
    if case.replicated == "kv_prefix":
        return positions, torch.cat([rep, positions + N_REP])
    return positions, positions


def _non_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous tensor (every other element of a buffer twice as
    long)."""
    y = torch.stack([x, torch.zeros_like(x)], dim=-1)[..., 0]
    assert not y.is_contiguous()
    return y


# --------------------------------------------------------------------------------------------------
# What each rank runs
# --------------------------------------------------------------------------------------------------


def _call(api, case: GradCase, groups, leaves: dict[str, torch.Tensor]):
    """The entry point of ``case`` on this rank's leaves: ``[(output, its global rows or 'rep'),
    ...]``.

    LSEs are listed as ``("lse", rows)``; every output's rows are this rank's q rows unless
    ``"rep"``.
    """
    h, hkv = case.heads
    q, k, v = leaves.get("q"), leaves.get("k"), leaves.get("v")
    if case.scheme in ("ulysses", "kv_gather"):
        attn = api.UlyssesAttention(
            h, HEAD_DIM, hkv, causal=case.causal, sp_attention_mode=case.scheme, groups=groups
        )
        reps = (leaves["rq"], leaves["rk"], leaves["rv"]) if case.replicated else (None, None, None)
        seq_lens = _varlen_lens(groups.sp_size) if case.varlen else None
        out, rep_out, lse, rep_lse = attn(
            q, k, v, *reps, seq_lens=seq_lens, return_softmax_lse=True
        )
        results = [("out", out, "local"), ("lse", lse, "local")]
        if case.replicated:
            results += [("out", rep_out, "rep"), ("lse", rep_lse, "rep")]
        return results
    if case.scheme == "ring":
        out, lse = api.ring_attention(
            q, k, v, groups.ring_group, causal=case.causal, zigzag=case.zigzag
        )
        return [("out", out, "local"), ("lse", lse, "local")]
    if case.scheme in ("rfa", "rfa_kv"):
        prefix = "zigzag_ring_flash_attn" if case.zigzag else "ring_flash_attn"
        if case.scheme == "rfa":
            out = getattr(api, prefix + "_func")(
                q, k, v, causal=case.causal, group=groups.ring_group
            )
        else:
            out = getattr(api, prefix + "_kvpacked_func")(
                q, leaves["kv"], causal=case.causal, group=groups.ring_group
            )
        return [("out", out, "local")]
    attn = api.USPAttention(h, HEAD_DIM, hkv, causal=case.causal, groups=groups, zigzag=case.zigzag)
    counts = {"num_replicated_" + case.replicated: N_REP} if case.replicated else {}
    out, lse = attn(q, k, v, **counts, return_softmax_lse=True)
    return [("out", out, "local"), ("lse", lse, "local")]


def run_grad_case(api, case: GradCase, groups) -> dict:
    """Forward and backward of ``case`` on this rank; its gradients next to the expected ones."""
    dtype = getattr(torch, case.dtype)
    x = _full_inputs(case)
    gq, gk, gv = _global_sequence(case, x)
    positions = _my_positions(case, groups)
    q_rows, kv_rows = _rows(case, positions)
    gen = torch.Generator().manual_seed(zlib.crc32(case.id.encode()) + 1)  # the same on every rank
    d_out = torch.randn(BATCH, gq.shape[1], gq.shape[2], HEAD_DIM, generator=gen).to(dtype)
    d_lse = torch.randn(BATCH, gq.shape[1], gq.shape[2], generator=gen)

    leaves = {"q": gq[:, q_rows], "k": gk[:, kv_rows], "v": gv[:, kv_rows]}
    if case.scheme in ("ulysses", "kv_gather") and case.replicated:
        leaves.update(rq=x["rq"], rk=x["rk"], rv=x["rv"])
    if case.scheme == "rfa_kv":
        leaves["kv"] = torch.stack([leaves.pop("k"), leaves.pop("v")], dim=2)
    leaves = {name: t.clone().requires_grad_() for name, t in leaves.items()}
    results = _call(api, case, groups, leaves)
    rep_rows = torch.arange(SEQ, SEQ + N_REP)
    tensors, grads = [], []
    for kind, t, where in results:
        rows = rep_rows if where == "rep" else q_rows
        tensors.append(t)
        grads.append(_non_contiguous((d_out if kind == "out" else d_lse)[:, rows]))
    torch.autograd.backward(tensors, grads)
    with_lse = any(kind == "lse" for kind, _, _ in results)

    def expected(compute):
        """Global gradients of q, k, v for the single-device loss, by autograd in ``compute``."""
        g_leaves = [t.detach().clone().requires_grad_() for t in (gq, gk, gv)]
        # float64, or FA's low-precision baseline: the dense attention computed in the case's dtype
        out, lse = dense_forward(
            *(t.to(compute) for t in g_leaves), SCALE, upcast=False, causal=case.causal
        )
        lse = lse.transpose(1, 2)  # FA's [b, h, s] -> the SP layers' [b, s, h]
        loss = (out.double() * d_out.double()).sum()
        if with_lse:
            loss = loss + (lse.double() * d_lse.double()).sum()
        return torch.autograd.grad(loss, g_leaves)

    report = {}
    for label, compute in (("ref", torch.float64), ("lowp", dtype)):
        dq, dk, dv = expected(compute)
        report[label] = _local_grads(case, dq, dk, dv, q_rows, kv_rows, rep_rows)
    report["grad"] = {name: t.grad for name, t in leaves.items()}
    return report


def _local_grads(case, dq, dk, dv, q_rows, kv_rows, rep_rows) -> dict[str, torch.Tensor]:
    """This rank's share of the global gradients, named as its leaves."""
    grads = {"q": dq[:, q_rows], "k": dk[:, kv_rows], "v": dv[:, kv_rows]}
    if case.scheme in ("ulysses", "kv_gather") and case.replicated:
        grads.update(rq=dq[:, rep_rows], rk=dk[:, rep_rows], rv=dv[:, rep_rows])
    if case.scheme == "rfa_kv":
        grads["kv"] = torch.stack([grads.pop("k"), grads.pop("v")], dim=2)
    return grads


def run_rank(api_name: str, case_ids: list[str], world: int) -> dict:
    """Body of every rank: the cases ``case_ids`` of this world size, with
    ``api_name.sequence_parallel``."""
    import importlib

    api = importlib.import_module(f"{api_name}.sequence_parallel")
    groups: dict = {}
    by_id = {case.id: case for case in CASES[world]}
    reports = {}
    for case_id in case_ids:
        case = by_id[case_id]
        key = (case.ulysses_degree, case.ring_degree)
        if key not in groups:  # the same creation order on every rank (new_group is collective)
            groups[key] = sp.init_sequence_parallel_groups(*key)
        reports[case_id] = run_grad_case(api, case, groups[key])
    return reports


# --------------------------------------------------------------------------------------------------
# Checks of the reports
# --------------------------------------------------------------------------------------------------


def check_grads(reports: list[dict], case: GradCase) -> None:
    """Every rank's gradients match the single-device ones; replicated gradients are equal on all
    ranks."""
    dtype = getattr(torch, case.dtype)
    for rank, report in enumerate(reports):
        r = report[case.id]
        for name, grad in r["grad"].items():
            assert grad.dtype == dtype, f"rank {rank} d{name}: {grad.dtype}"
            try:
                assert_close_fa(grad, r["ref"][name], r["lowp"][name])
            except AssertionError as exc:
                raise AssertionError(f"rank {rank} d{name}: {exc}") from None
    replicated = [n for n in ("rq", "rk", "rv") if n in reports[0][case.id]["grad"]]
    # the replicated rows of q/k/v: the same full gradient
    if case.scheme == "usp" and case.replicated:
        n = N_REP
        replicated_rows = {
            "prefix": slice(0, n),
            "suffix": slice(-n, None),
            "kv_prefix": slice(0, n),
        }[case.replicated]
        names = "kv" if case.replicated == "kv_prefix" else "qkv"
        views = [{m: r[case.id]["grad"][m][:, replicated_rows] for m in names} for r in reports]
    else:
        views = [{m: r[case.id]["grad"][m] for m in replicated} for r in reports]
    for rank, view in enumerate(views[1:], start=1):
        for name, grad in view.items():
            assert torch.equal(grad, views[0][name]), f"rank {rank} d{name} differs from rank 0's"


ranks = spawned_ranks(run_rank, spawn_cases)


@each_spawn_and("case", spawn_cases)
def test_gradients_match_single_device(ranks, case):
    check_grads(ranks, case)


#: A replicated input's gradient per case whose naive sum over the ranks is checked, by world size.
NAIVE_SUM_INPUT = {
    2: {"ulysses2x1-gqa-causal-rep-suffix": "rk", "kv_gather2x1-gqa-full-rep-suffix": "rq"},
    4: {"ulysses4x1-gqa-causal-rep-suffix": "rv"},
}


@each_spawn_and(
    "case_id", lambda spawn: NAIVE_SUM_INPUT[spawn.world], REFERENCE_SPAWNS, item_id=str
)
def test_naive_sum_of_replicated_gradients_double_counts(ranks, case_id):
    """Each rank holds the full gradient of a replicated input; their sum counts it ``P`` times."""
    name = NAIVE_SUM_INPUT[len(ranks)][case_id]
    total = sum(r[case_id]["grad"][name] for r in ranks)
    ref, lowp = ranks[0][case_id]["ref"][name], ranks[0][case_id]["lowp"][name]
    assert_close_fa(ranks[0][case_id]["grad"][name], ref, lowp)
    with pytest.raises(AssertionError, match="max error"):
        assert_close_fa(total, ref, lowp)
    assert_close_fa(total / len(ranks), ref, lowp)  # it is exactly P copies of the right gradient
