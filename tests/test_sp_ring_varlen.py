"""ring-flash-attention's varlen ring, zigzag varlen and stripe functions on real gloo ranks.

Each (implementation, rank count) is spawned once (:mod:`rank_spawns`): the reference on 2 and 4
ranks runs every case, the Triton kernels (interpreted on CPU) one small ring varlen case (2 ranks).
Every rank builds its part of one global problem from the case's seed (a packed batch of documents
of uneven lengths, among them an empty one, which every rank holds empty, and one longer than a
rank's share of the batch; the stripe cases a batch of two sequences), calls the entry point with
upstream's per-rank layout (ring-flash-attention's tests: each document cut into ``P`` blocks, or
``2P`` zigzag chunks; tokens ``r, r + P, ...`` for stripe), and runs the backward with its rows of
one global upstream gradient of ``out`` (and of the LSE, for some cases).

Checked against a single-process dense formula over the whole packed batch (each document on its
own, float64 autograd; FlashAttention's rule with the case's dtype as the low-precision baseline):
``out``, the LSE, ``dq``, ``dk``, ``dv`` (as the packed leaves ``dkv`` / ``dqkv`` for the packed
variants). The bytes each rank sends (counted at ``batch_isend_irecv``) equal the formulas of
``docs/concepts/sequence-parallel.md``, forward and backward. Upstream's refusals (zigzag and stripe
with ``causal=False``), this package's (ALiBi, dropout, windows, layouts, offsets) and a call that
only one rank gets wrong raise the same catalogued error on every rank, and the group still works
afterwards (the cases run after them).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from backward_cases import dense_forward
from rank_spawns import Spawn, each_spawn_and, spawned_ranks
from tolerance import assert_close_fa, assert_lse_close

CATALOG = Path(__file__).resolve().parents[1] / "errors" / "catalog.json"
D = 16
SCALE = D**-0.5
FAMILIES = {"ring": "ring_flash_attn_varlen", "zigzag": "zigzag_ring_flash_attn_varlen"}
FAMILIES["stripe"] = "stripe_flash_attn"


@dataclass(frozen=True)
class Case:
    """One call: ``family`` (ring / zigzag / stripe), ``variant`` (func / kvpacked / qkvpacked)."""

    family: str
    variant: str
    causal: bool = True
    dtype: str = "float32"
    lse_grad: bool = False
    window: tuple[int, int] = (-1, -1)
    small: bool = False

    @property
    def id(self) -> str:
        parts = [self.family, self.variant, "causal" if self.causal else "full", self.dtype]
        parts += ["dlse"] if self.lse_grad else []
        parts += [f"window{self.window[0]}_{self.window[1]}"] if self.window != (-1, -1) else []
        parts += ["small"] if self.small else []
        return "-".join(parts)

    @property
    def heads(self) -> tuple[int, int]:
        """``(h, h_k)``: GQA, except qkvpacked (one head count)."""
        return (2, 2) if self.variant == "qkvpacked" else (4, 2)


def documents(case: Case, world: int) -> list[int]:
    """Global document lengths: uneven, one empty, one longer than a rank's share ``T / P``.

    Ring: multiples of ``P``; zigzag: of ``2P``. Stripe: two sequences of ``S`` tokens. ``small``
    (the kernels' case): two documents and the empty one."""
    if case.family == "stripe":
        return [4 * world, 4 * world]
    unit = 2 * world if case.family == "zigzag" else world
    return [unit, 0, 3 * unit] if case.small else [unit, 0, 5 * unit, 2 * unit]


def _cases() -> list[Case]:
    cases = []
    for family in FAMILIES:
        cases += [Case(family, variant) for variant in ("func", "kvpacked", "qkvpacked")]
    cases += [
        Case("ring", "func", causal=False),
        Case("ring", "kvpacked", causal=False, lse_grad=True),
        Case("ring", "func", dtype="bfloat16", lse_grad=True),
        Case("zigzag", "func", dtype="float16", lse_grad=True),
        Case("stripe", "func", dtype="bfloat16", lse_grad=True),
        # windows that cover the longest document (5 * 2P tokens at most): no mask beyond causal
        Case("ring", "func", causal=False, window=(40, 40)),
        Case("zigzag", "func", window=(40, 0)),
        Case("stripe", "qkvpacked", window=(-1, 0)),
        Case("ring", "func", small=True),
    ]
    return cases


CASES = _cases()
KERNEL_CASE_IDS = ["ring-func-causal-float32-small"]
#: Cases that also check ``return_attn_probs=False`` (out alone, the same values).
PLAIN_CASE_IDS = {
    "ring-kvpacked-causal-float32",
    "zigzag-qkvpacked-causal-float32",
    "stripe-func-causal-float32",
}
SPAWNS = [Spawn("attn_ref", 2), Spawn("attn_ref", 4), Spawn("kernels", 2)]


def spawn_cases(spawn: Spawn) -> list[Case]:
    if spawn.impl == "attn_ref":
        return CASES
    return [case for case in CASES if case.id in KERNEL_CASE_IDS]


# --------------------------------------------------------------------------------------------------
# The global problem and each rank's part of it
# --------------------------------------------------------------------------------------------------


def global_problem(case: Case, world: int) -> dict[str, torch.Tensor]:
    """``q [N, h, d]``, ``k``/``v [N, h_k, d]``, ``dout [N, h, d]``, ``dlse [h, N]`` over the
    ``N`` tokens of the whole batch (stripe: the two sequences one after the other), fp32 values
    rounded to the case's dtype."""
    h, hk = case.heads
    n = sum(documents(case, world))
    gen = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    dtype = getattr(torch, case.dtype)
    shapes = dict(q=(n, h, D), k=(n, hk, D), v=(n, hk, D), dout=(n, h, D))
    x = {name: torch.randn(shape, generator=gen).to(dtype) for name, shape in shapes.items()}
    x["dlse"] = torch.randn(h, n, generator=gen)
    return x


def local_rows(case: Case, world: int, rank: int) -> torch.Tensor:
    """The global token indices this rank holds, in its local order (upstream's tests' layout)."""
    starts = torch.tensor([0, *documents(case, world)]).cumsum(0).tolist()
    rows = []
    for start, stop in zip(starts, starts[1:]):
        tokens = torch.arange(start, stop)
        if case.family == "stripe":
            rows.append(tokens[rank::world])
        elif case.family == "ring":
            rows.append(tokens.chunk(world)[rank] if stop > start else tokens)
        elif stop > start:
            chunks = tokens.chunk(2 * world)
            rows += [chunks[rank], chunks[2 * world - 1 - rank]]
    return torch.cat(rows)


def local_cu_seqlens(case: Case, world: int) -> torch.Tensor:
    """Upstream's local offsets: the global ones divided by ``P``."""
    lengths = torch.tensor([0, *documents(case, world)]) // world
    return lengths.cumsum(0).to(torch.int32)


# --------------------------------------------------------------------------------------------------
# What each rank runs
# --------------------------------------------------------------------------------------------------


class SentBytes:
    """Bytes this rank sends to other ranks, counted at ``dist.batch_isend_irecv`` (the ring's
    only point-to-point call; the cross-rank check is an all-gather, not counted)."""

    def __init__(self):
        self.total = 0
        self._batch_isend_irecv = dist.batch_isend_irecv

    def __enter__(self):
        def counted(ops):
            self.total += sum(
                op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend
            )
            return self._batch_isend_irecv(ops)

        dist.batch_isend_irecv = counted
        return self

    def __exit__(self, *exc):
        dist.batch_isend_irecv = self._batch_isend_irecv


def call(api, case: Case, leaves: dict, cu_seqlens, max_seqlen, causal=None, **kwargs):
    """The case's entry point on ``leaves`` (upstream's positional arguments)."""
    suffix = "_func" if case.variant == "func" else f"_{case.variant}_func"
    names = {"func": ("q", "k", "v"), "kvpacked": ("q", "kv"), "qkvpacked": ("qkv",)}
    varlen = [cu_seqlens, max_seqlen] if case.family != "stripe" else []
    causal = case.causal if causal is None else causal
    func = getattr(api, FAMILIES[case.family] + suffix)
    return func(*[leaves[n] for n in names[case.variant]], *varlen, causal=causal, **kwargs)


def run_case(api, case: Case, world: int, rank: int) -> dict:
    """Forward and backward of ``case`` on this rank: its outputs, gradients and bytes sent."""
    x = global_problem(case, world)
    rows = local_rows(case, world, rank)
    local = {name: x[name][rows] for name in ("q", "k", "v", "dout")}
    leaves = {name: local[name].clone().requires_grad_() for name in ("q", "k", "v")}
    if case.variant == "kvpacked":
        leaves["kv"] = torch.stack([leaves.pop("k"), leaves.pop("v")], dim=1).detach()
    if case.variant == "qkvpacked":
        leaves = {"qkv": torch.stack([leaves[n] for n in "qkv"], dim=1).detach()}
    if case.family == "stripe":  # [2 S / P, ...] -> [b=2, S / P, ...]; packed on dim 2
        leaves = {name: t.unflatten(0, (2, -1)) for name, t in leaves.items()}
        local["dout"] = local["dout"].unflatten(0, (2, -1))
    leaves = {name: t.detach().requires_grad_() for name, t in leaves.items()}
    cu = local_cu_seqlens(case, world)
    max_seqlen = int((cu[1:] - cu[:-1]).max())
    with SentBytes() as forward:
        out, lse, probs = call(
            api, case, leaves, cu, max_seqlen, window_size=case.window, return_attn_probs=True
        )
    assert probs is None
    grads = [local["dout"]]
    if case.lse_grad:
        dlse = x["dlse"][:, rows]
        grads.append(
            dlse.unflatten(1, (2, -1)).transpose(0, 1) if case.family == "stripe" else dlse
        )
    with SentBytes() as backward:
        torch.autograd.backward([out, lse][: len(grads)], grads)
    return dict(
        out=out.detach(),
        lse=lse.detach(),
        grad={name: t.grad for name, t in leaves.items()},
        sent=(forward.total, backward.total),
    ) | (
        {"plain": call(api, case, {n: t.detach() for n, t in leaves.items()}, cu, max_seqlen)}
        if case.id in PLAIN_CASE_IDS
        else {}
    )


def refusals(api, world: int, rank: int) -> dict[str, str]:
    """Bad calls, each on every rank: ``{name: "<type>: <message>"}`` of the error each raised."""
    ring, zig, stripe = Case("ring", "func"), Case("zigzag", "func"), Case("stripe", "func")

    def inputs(case):
        x = global_problem(case, world)
        rows = local_rows(case, world, rank)
        leaves = {n: x[n][rows] for n in ("q", "k", "v")}
        if case.family == "stripe":
            leaves = {n: t.unflatten(0, (2, -1)) for n, t in leaves.items()}
        cu = local_cu_seqlens(case, world)
        return leaves, cu, int((cu[1:] - cu[:-1]).max())

    r, z, s = inputs(ring), inputs(zig), inputs(stripe)
    odd = torch.tensor([0, 1, z[1][-1]], dtype=torch.int32)
    qkv_z = {"qkv": torch.stack([z[0]["q"][:, :2], z[0]["k"], z[0]["v"]], dim=1)}
    attempts = {
        "zigzag-not-causal": lambda: call(api, zig, *z, causal=False),
        "zigzag-qkvpacked-not-causal": lambda: call(
            api, Case("zigzag", "qkvpacked"), qkv_z, *z[1:], causal=False
        ),
        "stripe-not-causal": lambda: call(api, stripe, *s, causal=False),
        "stripe-kvpacked-not-causal": lambda: call(
            api,
            Case("stripe", "kvpacked"),
            {"q": s[0]["q"], "kv": torch.stack([s[0]["k"], s[0]["v"]], dim=2)},
            None,
            None,
            causal=False,
        ),
        "zigzag-odd-document": lambda: call(api, zig, z[0], odd, 1),
        "ring-alibi": lambda: call(api, ring, *r, alibi_slopes=torch.ones(4)),
        "stripe-dropout": lambda: call(api, stripe, *s, dropout_p=0.1),
        "ring-window": lambda: call(api, ring, *r, window_size=(2, 0)),
        "ring-kv-layout": lambda: call(
            api, Case("ring", "kvpacked"), {"q": r[0]["q"], "kv": r[0]["k"]}, *r[1:]
        ),
        "ring-cu-seqlens-int64": lambda: call(api, ring, r[0], r[1].long(), r[2]),
        "ring-cu-seqlens-total": lambda: call(api, ring, r[0], r[1] + (r[1] > 0), r[2]),
        # only the last rank is wrong: every rank raises the agreement error
        "ring-one-rank-not-causal": lambda: call(api, ring, *r, causal=rank != world - 1),
        "zigzag-one-rank-alibi": lambda: call(
            api, zig, *z, alibi_slopes=torch.ones(4) if rank == 0 else None
        ),
    }
    errors = {}
    for name, attempt in attempts.items():
        try:
            attempt()
        except (ValueError, TypeError, NotImplementedError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
        else:
            errors[name] = "no error"
    return errors


def run_rank(api_name: str, case_ids: list[str], world: int) -> dict:
    """Body of every rank: the refusals, then the cases ``case_ids`` (so the group must still
    work)."""
    import importlib

    api = importlib.import_module(f"{api_name}.sequence_parallel")
    # the errors' catalog notes (a schema check of the catalog, seconds) are checked elsewhere
    os.environ["ATTN_REF_ERROR_NOTES"] = "0"
    rank = dist.get_rank()
    report = {"refusals": refusals(api, world, rank) if api_name == "attn_ref" else {}}
    by_id = {case.id: case for case in CASES}
    for case_id in case_ids:
        report[case_id] = run_case(api, by_id[case_id], world, rank)
    return report


# --------------------------------------------------------------------------------------------------
# The single-process dense formula and the checks
# --------------------------------------------------------------------------------------------------


def dense_expected(case: Case, world: int, compute: torch.dtype) -> dict[str, torch.Tensor]:
    """``out [N, h, d]``, ``lse [h, N]`` and ``dq``, ``dk``, ``dv`` of the whole batch by dense
    attention of each document on its own, in ``compute`` (autograd)."""
    x = global_problem(case, world)
    leaves = [x[n].to(compute).requires_grad_() for n in ("q", "k", "v")]
    starts = torch.tensor([0, *documents(case, world)]).cumsum(0).tolist()
    outs, lses = [], []
    for start, stop in zip(starts, starts[1:]):
        if stop == start:
            continue
        doc = [t[start:stop].unsqueeze(0) for t in leaves]
        out, lse = dense_forward(*doc, SCALE, upcast=False, causal=case.causal)
        outs.append(out[0])
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)
    loss = (out.double() * x["dout"].double()).sum()
    if case.lse_grad:
        loss = loss + (lse.double() * x["dlse"].double()).sum()
    dq, dk, dv = torch.autograd.grad(loss, leaves)
    return dict(out=out.detach(), lse=lse.detach(), q=dq, k=dk, v=dv)


def local_view(case: Case, name: str, full: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """This rank's part of a global result, in the entry point's layout."""
    if name == "lse":
        part = full[:, rows]
        return part.unflatten(1, (2, -1)).transpose(0, 1) if case.family == "stripe" else part
    part = full[rows]
    return part.unflatten(0, (2, -1)) if case.family == "stripe" else part


def expected_grads(case: Case, e: dict, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The leaves' expected gradients (packed as the leaves are)."""
    g = {n: local_view(case, "grad", e[n], rows) for n in ("q", "k", "v")}
    dim = 2 if case.family == "stripe" else 1
    if case.variant == "kvpacked":
        return {"q": g["q"], "kv": torch.stack([g["k"], g["v"]], dim=dim)}
    if case.variant == "qkvpacked":
        return {"qkv": torch.stack([g["q"], g["k"], g["v"]], dim=dim)}
    return g


def sent_bytes(case: Case, world: int) -> tuple[int, int]:
    """The formulas of docs/concepts/sequence-parallel.md: forward ``(P - 1) · N · 2 h_k d · e``,
    backward that plus ``P · N · 2 h_k d · 4`` (the fp32 dK/dV accumulator, ``P`` hops), with ``N
    = T / P`` local tokens (stripe ``b · S / P``) and ``e`` the inputs' element size."""
    n = sum(documents(case, world)) // world
    h_k, e = case.heads[1], getattr(torch, case.dtype).itemsize
    kv = n * 2 * h_k * D
    return (world - 1) * kv * e, (world - 1) * kv * e + world * kv * 4


ranks = spawned_ranks(run_rank, spawn_cases)


@each_spawn_and("case", spawn_cases, SPAWNS)
def test_outputs_lse_and_gradients_match_the_dense_formula(ranks, case):
    world = len(ranks)
    ref, lowp = (
        dense_expected(case, world, torch.float64),
        dense_expected(case, world, getattr(torch, case.dtype)),
    )
    dtype = getattr(torch, case.dtype)
    for rank, report in enumerate(ranks):
        r, rows = report[case.id], local_rows(case, world, rank)
        try:
            assert r["out"].dtype == dtype and r["lse"].dtype == torch.float32
            assert_close_fa(
                r["out"], *(local_view(case, "out", e["out"], rows) for e in (ref, lowp))
            )
            assert_lse_close(r["lse"], local_view(case, "lse", ref["lse"], rows))
            if case.id in PLAIN_CASE_IDS:  # return_attn_probs=False: out alone
                assert torch.equal(r["plain"], r["out"])
            want_ref, want_lowp = expected_grads(case, ref, rows), expected_grads(case, lowp, rows)
            assert r["grad"].keys() == want_ref.keys()
            for name, grad in r["grad"].items():
                assert grad.dtype == dtype, f"d{name}: {grad.dtype}"
                assert_close_fa(grad, want_ref[name], want_lowp[name])
        except AssertionError as exc:
            raise AssertionError(f"rank {rank}: {exc}") from None


@each_spawn_and("case", spawn_cases, SPAWNS)
def test_bytes_sent_equal_the_formulas(ranks, case):
    expected = sent_bytes(case, len(ranks))
    assert [report[case.id]["sent"] for report in ranks] == [expected] * len(ranks)


REFUSED = {
    "zigzag-not-causal": "ValueError: zigzag ring is meaningless for causal=False",
    "zigzag-qkvpacked-not-causal": "ValueError: zigzag ring is meaningless for causal=False",
    "stripe-not-causal": "ValueError: stripe flash attn only supports causal attention, if not "
    "causal, use ring flash attn instead",
    "stripe-kvpacked-not-causal": "ValueError: stripe flash attn only supports causal attention",
    "zigzag-odd-document": "ValueError: the zigzag layout needs an even number of rows per ring "
    "block (document 0's local length), got 1",
    "ring-alibi": "NotImplementedError: alibi_slopes is not supported by the ring",
    "stripe-dropout": "NotImplementedError: dropout_p=0.1 is not supported",
    "ring-window": "NotImplementedError: window_size=(2, 0) is not supported by the ring",
    "ring-kv-layout": "ValueError: kv must be a [total, 2, heads, head_dim] tensor",
    "ring-cu-seqlens-int64": "ValueError: cu_seqlens_q must have dtype torch.int32",
    "ring-cu-seqlens-total": "ValueError: cu_seqlens must start at 0, never decrease and end at",
    "ring-one-rank-not-causal": "ValueError: the ranks of the sequence-parallel group disagree "
    "on causal",
    "zigzag-one-rank-alibi": "ValueError: the ranks of the sequence-parallel group disagree on "
    "the outcome of the argument checks",
}


@each_spawn_and("name", lambda spawn: list(REFUSED), SPAWNS[:2], item_id=str)
def test_refusals_raise_the_same_catalogued_error_on_every_rank(ranks, name):
    errors = [report["refusals"][name] for report in ranks]
    assert errors == [errors[0]] * len(ranks), errors
    assert errors[0].startswith(REFUSED[name]), errors[0]
    kind, message = errors[0].split(": ", 1)
    entries = json.loads(CATALOG.read_text(encoding="utf-8"))["errors"]
    assert any(
        e["status"] == "active"
        and e["exception"]["type"] == kind
        and re.fullmatch(e["message"]["regex"], message)
        for e in entries
    ), f"not in the catalog: {errors[0]}"


# --------------------------------------------------------------------------------------------------
# One process: upstream's signatures
# --------------------------------------------------------------------------------------------------

#: Upstream's parameters (ring-flash-attention 899628238f2f), after the tensors.
UPSTREAM_TAIL = [
    ("dropout_p", 0.0),
    ("softmax_scale", None),
    ("causal", False),
    ("window_size", (-1, -1)),
    ("alibi_slopes", None),
    ("deterministic", False),
    ("return_attn_probs", False),
    ("group", None),
]
EMPTY = inspect.Parameter.empty
UPSTREAM_HEADS = {
    "func": ["q", "k", "v"],
    "kvpacked_func": ["q", "kv"],
    "qkvpacked_func": ["qkv"],
}


@pytest.mark.parametrize("family", list(FAMILIES.values()))
@pytest.mark.parametrize("variant", list(UPSTREAM_HEADS))
@pytest.mark.parametrize("impl", ["attn_ref", "kernels"])
def test_signatures_are_upstreams(impl, family, variant):
    import importlib

    api = importlib.import_module(f"{impl}.sequence_parallel")
    name = f"{family}_{variant}"
    head = UPSTREAM_HEADS[variant] + (["cu_seqlens", "max_seqlen"] if "varlen" in family else [])
    params = [
        (p.name, p.default)
        for p in inspect.signature(getattr(api, name)).parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    assert params == [(n, EMPTY) for n in head] + UPSTREAM_TAIL
    assert name in api.__all__
