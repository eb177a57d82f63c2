"""ring-flash-attention's llama3 schedule: ``llama3_flash_attn_varlen_func`` (and its packed forms)
with ``llama3_flash_attn_prepare_cu_seqlens``, on one process and on 2 and 4 gloo ranks.

Single process: the offsets ``llama3_flash_attn_prepare_cu_seqlens`` returns (upstream's values,
written out by hand from its code at the pinned commit), upstream's positional arguments, and the
refusals.

Across ranks (one spawn of 2 and one of 4 ranks, every case in each): every rank holds ``S / P``
tokens of a packed batch whose documents straddle the ranks' edges, include an empty document at
an edge, or are longer than a rank's share. Each rank's output, LSE and the gradients of its q, k,
v (a loss on the output and the LSE) equal a dense float64 formula over the whole batch, one
document at a time, by FlashAttention's rule (the baseline: the same formula in the inputs'
dtype): causal, not causal, and a causal sliding window; all KV heads at once and one per stride.
The bytes each rank receives (the all-gathers of the forward and backward, the backward's
reduce-scatters) equal the formula of the module docstring. Upstream's asserts and this package's
checks raise on every rank before any exchange, and the group still works after them. The kernels'
entry point runs one case on 2 ranks.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from attn_ref import dense, sequence_parallel as sp
from tolerance import assert_close_fa, assert_lse_close

H, H_K, D = 4, 2, 8
SPAWN_TIMEOUT_S = 480
DISAGREE = "the ranks of the sequence-parallel group disagree on "


@dataclass(frozen=True)
class Case:
    """One call: the documents of the packed batch, the mask, the KV-head stride, the entry point
    (``func``, ``kvpacked``, ``qkvpacked``; qkvpacked has ``h == h_k``) and the inputs' dtype."""

    docs: tuple[int, ...]
    causal: bool
    window: tuple[int, int]
    stride: int
    variant: str
    dtype: str = "float32"

    @property
    def id(self) -> str:
        mask = ("causal" if self.causal else "full") + ("" if self.window == (-1, -1) else "-win")
        docs = "-".join(map(str, self.docs))
        return f"{docs}-{mask}-stride{self.stride}-{self.variant}-{self.dtype}"

    @property
    def heads(self) -> tuple[int, int]:
        return (H_K, H_K) if self.variant == "qkvpacked" else (H, H_K)


def layouts(world: int) -> list[tuple[int, ...]]:
    """Documents of ``8 P`` tokens (shares of 8): straddling the edges; an empty document at an edge
    (and one inside a share); one document longer than a share."""
    if world == 2:
        return [(5, 7, 4), (8, 0, 3, 0, 5), (2, 13, 1)]
    return [(5, 7, 9, 6, 5), (8, 0, 8, 3, 0, 13), (3, 20, 1, 8)]


def cases(world: int) -> list[Case]:
    runs = [
        ((True, (-1, -1)), 1, "func"),
        ((False, (-1, -1)), 2, "kvpacked"),
        ((True, (3, 0)), 1, "qkvpacked"),
    ]
    found = [
        Case(docs, causal, window, stride, variant)
        for docs in layouts(world)
        for (causal, window), stride, variant in runs
    ]
    return found + [Case(layouts(world)[0], True, (-1, -1), 2, "func", "bfloat16")]


KERNEL_CASE = Case((5, 7, 4), True, (-1, -1), 1, "func")


def cu_seqlens_of(docs) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32)


def problem(case: Case):
    """The whole batch: ``q [S, h, d]``, ``k``, ``v [S, h_k, d]`` in the case's dtype, ``dout [S, h,
    d]`` and ``dlse [h, S]`` fp32."""
    h, h_k = case.heads
    total = sum(case.docs)
    gen = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    q, k, v, dout = (torch.randn(total, n, D, generator=gen) for n in (h, h_k, h_k, h))
    dtype = getattr(torch, case.dtype)
    return (
        q.to(dtype),
        k.to(dtype),
        v.to(dtype),
        dout.to(dtype),
        torch.randn(h, total, generator=gen),
    )


def call(api, case: Case, q, k, v, *offsets, **kwargs):
    """The case's entry point of ``api`` on this rank's q, k, v, packed as upstream."""
    if case.variant == "qkvpacked":
        return api.llama3_flash_attn_varlen_qkvpacked_func(
            torch.stack([q, k, v], dim=1), *offsets, **kwargs
        )
    if case.variant == "kvpacked":
        return api.llama3_flash_attn_varlen_kvpacked_func(
            q, torch.stack([k, v], dim=1), *offsets, **kwargs
        )
    return api.llama3_flash_attn_varlen_func(q, k, v, *offsets, **kwargs)


def dense_packed(q, k, v, docs, causal, window, upcast=True):
    """The oracle: dense attention of each document on its own (:mod:`attn_ref.dense`),
    concatenated: ``out [S, h, d]``, ``lse [h, S]``."""
    outs, lses = [], []
    bounds = cu_seqlens_of(docs).tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            out, lse = dense.attention(
                *(x[start:end][None] for x in (q, k, v)),
                causal=causal,
                window_size=window,
                upcast=upcast,
            )
            outs.append(out[0])
            lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def expected(case: Case, compute: torch.dtype) -> dict:
    """Output, LSE and the gradients of q, k, v of the whole batch, by autograd through
    :func:`dense_packed` in ``compute`` (float64, or the inputs' dtype: FA's baseline)."""
    q, k, v, dout, dlse = problem(case)
    leaves = [x.to(compute).requires_grad_() for x in (q, k, v)]
    out, lse = dense_packed(*leaves, case.docs, case.causal, case.window, upcast=False)
    loss = (out.double() * dout.double()).sum() + (lse.double() * dlse.double()).sum()
    dq, dk, dv = torch.autograd.grad(loss, leaves)
    return dict(out=out.detach(), lse=lse.detach(), dq=dq, dk=dk, dv=dv)


# --------------------------------------------------------------------------------------------------
# The rank function
# --------------------------------------------------------------------------------------------------


class ByteCounter:
    """Bytes this rank receives from the others in the llama3 schedule's collectives, by wrapping
    ``torch.distributed``'s one-tensor all-gather and reduce-scatter (the schedule looks them up at
    each call)."""

    NAMES = ("all_gather_single", "reduce_scatter_single")

    def __init__(self):
        self.received = 0
        self.originals = {name: getattr(dist, name) for name in self.NAMES}

    def __enter__(self):
        world = dist.get_world_size()

        def all_gather(output, x, *args, **kwargs):
            self.received += (world - 1) * x.numel() * x.element_size()
            return self.originals["all_gather_single"](output, x, *args, **kwargs)

        def reduce_scatter(output, x, *args, **kwargs):
            self.received += (world - 1) * output.numel() * output.element_size()
            return self.originals["reduce_scatter_single"](output, x, *args, **kwargs)

        dist.all_gather_single, dist.reduce_scatter_single = all_gather, reduce_scatter
        return self

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(dist, name, original)


def run_case(api, case: Case, world: int, rank: int) -> dict:
    """This rank's outputs and gradients of the case, and the bytes it received (forward,
    backward)."""
    q, k, v, dout, dlse = problem(case)
    share = q.shape[0] // world
    rows = slice(rank * share, (rank + 1) * share)
    offsets = sp.llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens_of(case.docs), case.causal, rank, world
    )
    leaves = [x[rows].clone().requires_grad_() for x in (q, k, v)]
    with ByteCounter() as forward_bytes:
        out, lse, probs = call(
            api,
            case,
            *leaves,
            *offsets[:4],
            case.stride,
            offsets[4],
            causal=case.causal,
            window_size=case.window,
            return_attn_probs=True,
        )
    with ByteCounter() as backward_bytes:
        torch.autograd.backward([out, lse], [dout[rows], dlse[:, rows]])
    return dict(
        out=out.detach(),
        lse=lse.detach(),
        probs=probs,
        dq=leaves[0].grad,
        dk=leaves[1].grad,
        dv=leaves[2].grad,
        bytes=(forward_bytes.received, backward_bytes.received),
    )


def refusals(world: int, rank: int) -> dict:
    """Bad calls made on every rank (or by rank 0 only); every rank reports ``(type, message)``."""
    case = Case(layouts(world)[0], True, (-1, -1), 1, "func")
    q, k, v, _, _ = problem(case)
    share = q.shape[0] // world
    q, k, v = (x[rank * share : (rank + 1) * share] for x in (q, k, v))
    cu = cu_seqlens_of(case.docs)
    *offsets, keys = sp.llama3_flash_attn_prepare_cu_seqlens(cu, True, rank, world)
    *full_offsets, full_keys = sp.llama3_flash_attn_prepare_cu_seqlens(cu, False, rank, world)
    calls = {
        "heads_k_stride": lambda: sp.llama3_flash_attn_varlen_func(
            q, k, v, *offsets, 3, keys, causal=True
        ),
        "total_length": lambda: sp.llama3_flash_attn_prepare_cu_seqlens(
            cu_seqlens_of((5, 7, 4, 1)), True, rank, world
        ),
        "one rank's slice": lambda: sp.llama3_flash_attn_varlen_func(
            q, k, v, *offsets, 1, slice(0, 999) if rank == 0 else keys, causal=True
        ),
        "causal call on full-document offsets": lambda: sp.llama3_flash_attn_varlen_func(
            q, k, v, *full_offsets, 1, full_keys, causal=True
        ),
        "dropout": lambda: sp.llama3_flash_attn_varlen_func(
            q, k, v, *offsets, 1, keys, dropout_p=0.1, causal=True
        ),
    }
    report = {}
    for name, bad in calls.items():
        try:
            bad()
            report[name] = None
        # reported to the parent, which checks type and text
        except Exception as exc:  # noqa: BLE001
            report[name] = (type(exc), str(exc))
    # the group still works: one more call on every rank
    report["after"] = sp.llama3_flash_attn_varlen_func(q, k, v, *offsets, 1, keys, causal=True)
    return report


def run_rank(world: int) -> dict:
    """Body of every rank: the reference cases, the refusals, the kernels' case on 2 ranks."""
    rank = dist.get_rank()
    report = {
        "cases": {case: run_case(sp, case, world, rank) for case in cases(world)},
        "refusals": refusals(world, rank),
    }
    if world == 2:
        import kernels.sequence_parallel as kernel_sp

        report["kernels"] = run_case(kernel_sp, KERNEL_CASE, world, rank)
    return report


# --------------------------------------------------------------------------------------------------
# One process
# --------------------------------------------------------------------------------------------------


def _prepared(cu_seqlens, causal, rank, world):
    cu_q, cu_k, max_q, max_k, keys = sp.llama3_flash_attn_prepare_cu_seqlens(
        torch.tensor(cu_seqlens, dtype=torch.int32), causal, rank, world
    )
    assert cu_q.dtype == cu_k.dtype == torch.int32
    return cu_q.tolist(), cu_k.tolist(), max_q, max_k, keys


@pytest.mark.parametrize(
    "cu_seqlens, causal, rank, world, expected",
    [
        # a document straddles the edge at 8: rank 1's queries start inside it, its keys at 5
        ([0, 5, 12, 16], True, 1, 2, ([0, 4, 8], [0, 7, 11], 4, 7, slice(5, 16))),
        ([0, 5, 12, 16], True, 0, 2, ([0, 5, 8], [0, 5, 8], 5, 5, slice(0, 8))),
        # not causal: rank 0's last document is whole (keys up to 12)
        ([0, 5, 12, 16], False, 0, 2, ([0, 5, 8], [0, 5, 12], 5, 7, slice(0, 12))),
        # an empty document at the edge belongs to the next rank's share, as upstream
        ([0, 8, 8, 11, 11, 16], True, 0, 2, ([0, 8], [0, 8], 8, 8, slice(0, 8))),
        ([0, 8, 8, 11, 11, 16], True, 1, 2, ([0, 0, 3, 3, 8], [0, 0, 3, 3, 8], 5, 5, slice(8, 16))),
        # one document over three shares: rank 1 holds only its middle
        ([0, 3, 23, 24, 32], True, 1, 4, ([0, 8], [0, 13], 8, 13, slice(3, 16))),
        ([0, 3, 23, 24, 32], False, 1, 4, ([0, 8], [0, 20], 8, 20, slice(3, 23))),
    ],
)
def test_prepare_cu_seqlens_gives_upstreams_offsets(cu_seqlens, causal, rank, world, expected):
    assert _prepared(cu_seqlens, causal, rank, world) == expected


@pytest.mark.parametrize("variant", ["func", "kvpacked", "qkvpacked"])
@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (False, (-1, -1)), (True, (2, 0))])
def test_one_rank_is_varlen_attention_of_the_documents(variant, causal, window):
    case = Case((5, 0, 9, 2), causal, window, 1, variant)
    q, k, v, _, _ = problem(case)
    offsets = sp.llama3_flash_attn_prepare_cu_seqlens(cu_seqlens_of(case.docs), causal, 0, 1)
    out, lse, probs = call(
        sp,
        case,
        q,
        k,
        v,
        *offsets[:4],
        1,
        offsets[4],
        causal=causal,
        window_size=window,
        return_attn_probs=True,
    )
    ref = dense_packed(q, k, v, case.docs, causal, window)
    assert probs is None and lse.shape == (case.heads[0], 16)
    torch.testing.assert_close((out, lse), ref)
    plain = call(sp, case, q, k, v, *offsets[:4], 1, offsets[4], causal=causal, window_size=window)
    assert torch.equal(plain, out)


def test_upstreams_positional_arguments():
    case = Case((5, 11), True, (-1, -1), 2, "func")
    q, k, v, _, _ = problem(case)
    cu_q, cu_k, max_q, max_k, keys = sp.llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens_of(case.docs), True, 0, 1
    )
    # (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
    # local_k_slice, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic,
    # return_attn_probs, group)
    out, lse, _ = sp.llama3_flash_attn_varlen_func(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_q,
        max_k,
        2,
        keys,
        0.0,
        0.5,
        True,
        (-1, -1),
        None,
        True,
        True,
        None,
    )
    ref = [
        dense.attention(x[None], y[None], z[None], 0.5, True)
        for x, y, z in ((q[:5], k[:5], v[:5]), (q[5:], k[5:], v[5:]))
    ]
    torch.testing.assert_close(out, torch.cat([r[0][0] for r in ref]))
    torch.testing.assert_close(lse, torch.cat([r[1][0] for r in ref], dim=1))


@pytest.mark.parametrize(
    "bad, exc, message",
    [
        (
            dict(heads_k_stride=3),
            ValueError,
            "nheads_k % heads_k_stride == 0 does not hold: 2 KV "
            "heads cannot be gathered in strides of 3",
        ),
        (dict(heads_k_stride=0), ValueError, "heads_k_stride must be >= 1, got 0"),
        (
            dict(local_k_slice=slice(0, 17)),
            ValueError,
            "local_k_slice must be slice(start, stop) "
            "with 0 <= start <= stop <= 16 (the gathered tokens), got slice(0, 17, None)",
        ),
        (dict(alibi_slopes=torch.ones(4)), NotImplementedError, "alibi_slopes is not supported"),
        (dict(dropout_p=0.1), NotImplementedError, "dropout_p=0.1 is not supported"),
        (
            dict(cu_seqlens_k=torch.tensor([0, 7, 16], dtype=torch.int32)),
            NotImplementedError,
            "causal=True, window_size=(-1, -1) needs every document's keys to end where its "
            "queries end, got query ends [5, 16] and key ends [7, 16]",
        ),
    ],
)
def test_refusals(bad, exc, message):
    case = Case((5, 11), True, (-1, -1), 1, "func")
    q, k, v, _, _ = problem(case)
    cu_q, cu_k, max_q, max_k, keys = sp.llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens_of(case.docs), True, 0, 1
    )
    args = dict(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max_q,
        max_seqlen_k=max_k,
        heads_k_stride=1,
        local_k_slice=keys,
        causal=True,
    )
    with pytest.raises(exc, match=re.escape(message)):
        sp.llama3_flash_attn_varlen_func(**{**args, **bad})


def test_packed_layouts_are_checked_before_anything_else():
    q, k, v, _, _ = problem(Case((5, 11), True, (-1, -1), 1, "func"))
    offsets = sp.llama3_flash_attn_prepare_cu_seqlens(cu_seqlens_of((5, 11)), True, 0, 1)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "kv must be a [tokens, 2, heads, head_dim] tensor, got shape (2, 16, 2, 8)"
        ),
    ):
        sp.llama3_flash_attn_varlen_kvpacked_func(
            q, torch.stack([k, v]), *offsets[:4], 1, offsets[4], alibi_slopes=torch.ones(4)
        )
    ring_only = sp.AttentionBackend(
        "ring-only",
        sp.REFERENCE_BACKEND.flash_attn_with_kvcache,
        sp.REFERENCE_BACKEND.merge_attention_states,
    )
    with pytest.raises(
        NotImplementedError, match="'ring-only' attention backend has no flash_attn_varlen_func"
    ):
        sp.llama3_flash_attn_varlen_func(q, k, v, *offsets[:4], 1, offsets[4], backend=ring_only)


def test_prepare_refuses_an_uneven_share():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "total_length % world_size == 0 does not hold: the packed batch has 16 tokens "
            "(cu_seqlens[-1]), which 3 ranks cannot share equally"
        ),
    ):
        sp.llama3_flash_attn_prepare_cu_seqlens(cu_seqlens_of((5, 11)), True, 0, 3)


# --------------------------------------------------------------------------------------------------
# Across ranks
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks():
    return {
        world: sp.launch(run_rank, world, (world,), timeout_s=SPAWN_TIMEOUT_S) for world in (2, 4)
    }


def _check_case(reports: list[dict], case: Case, world: int) -> None:
    ref, lowp = expected(case, torch.float64), expected(case, getattr(torch, case.dtype))
    share = sum(case.docs) // world
    for rank, r in enumerate(reports):
        rows = slice(rank * share, (rank + 1) * share)
        assert r["probs"] is None and r["out"].dtype == getattr(torch, case.dtype)
        assert_close_fa(r["out"], ref["out"][rows], lowp["out"][rows])
        assert_lse_close(r["lse"], ref["lse"][:, rows])
        for name in ("dq", "dk", "dv"):
            assert r[name].dtype == r["out"].dtype
            assert_close_fa(r[name], ref[name][rows], lowp[name][rows])


def bytes_formula(world: int, tokens: int, h_k: int, d: int, e: int) -> tuple[int, int]:
    """The module docstring's bytes per rank: forward all-gathers, backward all-gathers plus fp32
    reduce-scatters."""
    kv = (world - 1) * (tokens // world) * 2 * h_k * d
    return kv * e, kv * (e + 4)


@pytest.mark.timeout(2 * SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world", [2, 4])
def test_outputs_lse_and_gradients_equal_dense_attention_of_the_whole_batch(ranks, world):
    for case in cases(world):
        _check_case([r["cases"][case] for r in ranks[world]], case, world)


@pytest.mark.timeout(2 * SPAWN_TIMEOUT_S + 60)
def test_the_kernels_entry_point(ranks):
    _check_case([r["kernels"] for r in ranks[2]], KERNEL_CASE, 2)


@pytest.mark.timeout(2 * SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world", [2, 4])
def test_bytes_received_equal_the_formula(ranks, world):
    for case in cases(world):
        e = torch.finfo(getattr(torch, case.dtype)).bits // 8
        formula = bytes_formula(world, sum(case.docs), case.heads[1], D, e)
        for report in ranks[world]:
            assert report["cases"][case]["bytes"] == formula, case.id


@pytest.mark.timeout(2 * SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("world", [2, 4])
def test_refusals_reach_every_rank_and_the_group_survives(ranks, world):
    reports = [r["refusals"] for r in ranks[world]]
    starts = {
        "heads_k_stride": (ValueError, "nheads_k % heads_k_stride == 0 does not hold"),
        "total_length": (ValueError, "total_length % world_size == 0 does not hold"),
        "one rank's slice": (ValueError, DISAGREE + "the outcome of the argument checks"),
        "dropout": (NotImplementedError, "dropout_p=0.1 is not supported"),
    }
    for name, (exc_type, start) in starts.items():
        outcomes = {report[name] for report in reports}
        assert len(outcomes) == 1, f"{name}: the ranks raised different errors: {outcomes}"
        got_type, message = outcomes.pop()
        assert got_type is exc_type and message.startswith(start), message
    # full-document offsets: some ranks' keys run past their queries; every rank refuses
    outcomes = {report["causal call on full-document offsets"] for report in reports}
    assert len(outcomes) == 1 and None not in outcomes
    for report in reports:
        assert report["after"].shape == (sum(layouts(world)[0]) // world, H, D)
