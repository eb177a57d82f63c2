"""Every feature of the suite, family by family, with its probe variants.

Value-like probes are random valid calls of :func:`calls.make_case`: :data:`BASE` (3 sequences of
3 queries, 2 query and 2 key/value heads of dim 16, a 16-token cache with random lengths, the
``--dtype``) changed only by what the feature is about, so that a bug shows up in the feature it
belongs to. A size scales the cache capacity (and ``seqlen_q`` by the square root) and takes the
first variant (``quick``) or all of them. The error features run every case of their table at
every size (they raise before any attention is computed). The prefill section's features are
:data:`prefill.PREFILL`.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .calls import make_case
from .error_cases import UPSTREAM_ORDER, UPSTREAM_REJECTS
from .errors_contract import check_error, check_rejected, error_case
from .grid import Feature, Probe, Size
from .in_place import check_in_place, check_out_buffer, out_buffer_case
from .odd_shapes import check_call, strided_case
from .prefill import PREFILL
from .values import check_values, check_values_and_partials

BASE = dict(batch=3, seqlen_q=3, capacity=16, heads=2, heads_k=2, d=16)
LSE = {"return_softmax_lse": True}
ROTARY = dict(d=32, rotary_dim=16, seqlen_new=2)
FP8 = torch.float8_e4m3fn


def _scaled(case: dict, scale: int) -> dict:
    grown = dict(case)
    grown["capacity"] = case["capacity"] * scale
    if case["seqlen_q"] > 1:
        grown["seqlen_q"] = case["seqlen_q"] * math.isqrt(scale)
    return grown


def _label(variant: dict) -> str:
    return ", ".join(f"{key}={val}" for key, val in variant.items()) or "base"


def call_feature(
    name: str,
    summary: str,
    needs: tuple[str, ...],
    variants: list[dict],
    check: Callable,
    knobs: dict = LSE,
    builder: Callable = make_case,
    scaled: bool = True,
) -> Feature:
    """A feature whose probes are ``builder(**BASE, dtype=..., **variant, seed=..., device=...)``
    (``BASE`` scaled by the size unless ``scaled`` is False), called with ``knobs``."""

    def probes(size: Size, dtype: torch.dtype, seed: int, device: str) -> list[Probe]:
        chosen = variants if size.variants is None else variants[: size.variants]
        found = []
        for variant in chosen:
            case = {**BASE, "dtype": dtype, **variant}
            case = _scaled(case, size.scale) if scaled else case
            for offset in range(size.seeds):
                build = dict(case, seed=seed + offset, device=device)
                found.append(Probe(name, _label(variant), builder, build, check, dict(knobs)))
        return found

    return Feature(name, summary, needs, probes)


def error_feature(
    name: str,
    summary: str,
    needs: tuple[str, ...],
    table: str,
    cases: tuple[str, ...],
    check: Callable,
) -> Feature:
    """A feature whose probes are the ``cases`` of an error table, all of them at every size."""

    def probes(size: Size, dtype: torch.dtype, seed: int, device: str) -> list[Probe]:
        return [
            Probe(
                name,
                case,
                error_case,
                dict(table=table, case=case, device=device),
                check,
                check_args=dict(table=table, case=case)
                if check is check_error
                else dict(case=case),
            )
            for case in cases
        ]

    return Feature(name, summary, needs, probes)


VALUES = [
    call_feature(
        "values/basic",
        "contiguous cache, as many key/value heads as query heads, default scale",
        (),
        [{}, dict(seqlen_q=1), dict(heads=4, heads_k=4, d=64)],
        check_values,
    ),
    call_feature(
        "values/softmax_scale",
        "an explicit softmax_scale",
        (),
        [dict(softmax_scale=0.7), dict(softmax_scale=0.05, seqlen_q=1)],
        check_values,
    ),
    call_feature(
        "values/append",
        "new keys and values appended at cache_seqlens and attended",
        (),
        [dict(seqlen_new=2), dict(seqlen_new=1, seqlen_q=1)],
        check_values,
    ),
    call_feature(
        "values/paged",
        "paged caches (page sizes 1 to 256), shuffled page tables",
        ("paged",),
        [dict(page_size=p) for p in (3, 1, 16, 64, 256)],
        check_values,
    ),
    call_feature(
        "values/cache_batch_idx",
        "cache rows picked by cache_batch_idx",
        ("cache_batch_idx",),
        [dict(batch_idx=True), dict(batch_idx=True, seqlen_q=1)],
        check_values,
    ),
    call_feature(
        "values/leftpad",
        "cache_leftpad: keys before it are invisible",
        ("leftpad",),
        [dict(leftpad=True, batch=4), dict(leftpad=True, batch=4, seqlen_new=2)],
        check_values,
    ),
    call_feature(
        "values/varlen_q",
        "packed queries (cu_seqlens_q, max_seqlen_q)",
        ("varlen_q",),
        [dict(varlen_q=True, batch=4), dict(varlen_q=True, batch=4, seqlen_new=2)],
        check_values,
    ),
    call_feature(
        "values/varlen_new",
        "packed new keys and values (cu_seqlens_k_new)",
        ("varlen_new",),
        [
            dict(varlen_new=True, seqlen_new=3, batch=4),
            dict(varlen_new=True, seqlen_new=4, seqlen_q=1),
        ],
        check_values,
    ),
    call_feature(
        "values/gqa",
        "grouped-query attention: query head j reads key/value head j // (h / h_k)",
        ("gqa",),
        [dict(heads=6, heads_k=2), dict(heads=8, heads_k=2, seqlen_q=1, seqlen_new=1)],
        check_values,
    ),
    call_feature(
        "values/mqa",
        "multi-query attention: one key/value head",
        ("gqa",),
        [dict(heads=4, heads_k=1), dict(heads=8, heads_k=1, seqlen_q=1)],
        check_values,
    ),
    call_feature(
        "values/causal",
        "causal mask aligned to the bottom-right corner",
        ("causal",),
        [dict(causal=True), dict(causal=True, seqlen_q=1), dict(causal=True, seqlen_new=2)],
        check_values,
    ),
    call_feature(
        "values/window",
        "sliding windows (left, right), -1 unbounded",
        ("window",),
        [dict(window=(2, 1)), dict(window=(3, -1)), dict(window=(-1, 0))],
        check_values,
    ),
    call_feature(
        "values/chunk",
        "attention_chunk: keys of the query's own chunk only",
        ("chunk",),
        [dict(chunk=3), dict(chunk=5, seqlen_q=6)],
        check_values,
    ),
    call_feature(
        "values/softcap",
        "softcap * tanh(scores * scale / softcap), before masking",
        ("softcap",),
        [dict(softcap=1.5), dict(softcap=0.5, softmax_scale=2.0)],
        check_values,
    ),
    call_feature(
        "values/sinks",
        "a sink logit per query head in the softmax and the LSE",
        ("sinks",),
        [dict(sinks=True), dict(sinks=True, seqlen_q=1)],
        check_values,
    ),
    call_feature(
        "values/qv",
        "qv (scores q.k + qv.v), default scale over d + dv",
        ("qv",),
        [dict(qv=True, d=64, dv=256), dict(qv=True, d=64, dv=256, seqlen_q=1, seqlen_new=1)],
        check_values,
    ),
    call_feature(
        "values/only_qv",
        "only_qv: scores qv.v alone, q and k_cache may be None",
        ("only_qv", "gqa"),
        [
            dict(
                only_qv=True,
                placeholders=True,
                heads=8,
                heads_k=1,
                d=64,
                dv=512,
                seqlen_q=1,
                seqlen_new=1,
            ),
            dict(only_qv=True, heads=8, heads_k=1, d=64, dv=512, seqlen_q=2),
        ],
        check_values,
    ),
    call_feature(
        "values/rotary_interleaved",
        "rotary embedding, GPT-J layout (queries and new keys)",
        ("rotary",),
        [
            dict(ROTARY, rotary_interleaved=True),
            dict(ROTARY, rotary_interleaved=True, rotary_dim=32),
        ],
        check_values,
    ),
    call_feature(
        "values/rotary_neox",
        "rotary embedding, GPT-NeoX layout (queries and new keys)",
        ("rotary",),
        [
            dict(ROTARY, rotary_interleaved=False),
            dict(ROTARY, rotary_interleaved=False, rotary_dim=32),
        ],
        check_values,
    ),
    call_feature(
        "values/rotary_seqlens",
        "rotary positions from rotary_seqlens",
        ("rotary", "rotary_seqlens"),
        [dict(ROTARY, rotary_seqlens=True), dict(ROTARY, rotary_seqlens=True, seqlen_q=1)],
        check_values,
    ),
    call_feature(
        "values/num_splits",
        "num_splits=3: out, LSE and the partials' LSE-weighted combination",
        ("num_splits",),
        [dict(capacity=48), dict(capacity=48, seqlen_q=1)],
        check_values_and_partials,
        knobs=dict(LSE, num_splits=3),
    ),
    call_feature(
        "values/fp8",
        "float8_e4m3fn inputs with q/k/v_descale (bf16 output)",
        ("fp8",),
        [dict(dtype=FP8, descale=True), dict(dtype=FP8, descale=True, seqlen_new=1)],
        check_values,
    ),
]

IN_PLACE = [
    call_feature(
        "in_place/append",
        "new tokens written at cache_seqlens, nothing else changed",
        (),
        [dict(seqlen_new=2), dict(seqlen_new=1, seqlen_q=1)],
        check_in_place,
        knobs={},
    ),
    call_feature(
        "in_place/append_leftpad",
        "with cache_leftpad, written at cache_seqlens (absolute)",
        ("leftpad",),
        [dict(seqlen_new=2, leftpad=True, batch=4)],
        check_in_place,
        knobs={},
    ),
    call_feature(
        "in_place/append_paged",
        "written through a shuffled page table",
        ("paged",),
        [dict(seqlen_new=2, page_size=p) for p in (3, 1, 16)],
        check_in_place,
        knobs={},
    ),
    call_feature(
        "in_place/append_cache_batch_idx",
        "written into the rows cache_batch_idx picks",
        ("cache_batch_idx",),
        [dict(seqlen_new=2, batch_idx=True)],
        check_in_place,
        knobs={},
    ),
    call_feature(
        "in_place/append_varlen",
        "packed new tokens written per sequence",
        ("varlen_new",),
        [dict(seqlen_new=3, varlen_new=True, batch=4)],
        check_in_place,
        knobs={},
    ),
    call_feature(
        "in_place/append_rotary",
        "new keys stored rotated (both layouts)",
        ("rotary",),
        [dict(ROTARY, rotary_interleaved=True), dict(ROTARY, rotary_interleaved=False)],
        check_in_place,
        knobs={},
    ),
    call_feature(
        "in_place/out_buffer",
        "out= written and returned as itself",
        ("out",),
        [dict(seqlen_new=1)],
        check_out_buffer,
        builder=out_buffer_case,
    ),
]

ERRORS = [
    error_feature(
        "errors/ver",
        "SGL-B: ver != 3 rejected before anything else",
        ("ver",),
        "UPSTREAM_ORDER",
        tuple(case for case in UPSTREAM_ORDER if case.startswith("ver")),
        check_error,
    ),
    error_feature(
        "errors/sglang_order",
        "sglang's ValueErrors: conditions, exact text and order, caches untouched",
        ("sglang_errors",),
        "UPSTREAM_ORDER",
        tuple(case for case in UPSTREAM_ORDER if not case.startswith("ver")),
        check_error,
    ),
    error_feature(
        "errors/caches_untouched",
        "calls upstream refuses raise and leave the caches as they were",
        (),
        "PACKAGE_CHECKS",
        UPSTREAM_REJECTS,
        check_rejected,
    ),
]

ODD_SHAPES = [
    call_feature(
        "odd_shapes/zero_length_keys",
        "no keys: zero-length KV tensors (LSE +inf), empty sequences (-inf)",
        (),
        [dict(capacity=0), dict(cached_tokens=0)],
        check_call,
        scaled=False,
    ),
    call_feature(
        "odd_shapes/empty_batch",
        "no sequences, or no query rows",
        (),
        [dict(batch=0), dict(seqlen_q=0)],
        check_call,
        scaled=False,
    ),
    call_feature(
        "odd_shapes/one_token_cache",
        "a cache of one token: appended into, or full",
        (),
        [dict(capacity=1, seqlen_new=1, seqlen_q=1), dict(capacity=1, full_cache=True, seqlen_q=1)],
        check_call,
        scaled=False,
    ),
    call_feature(
        "odd_shapes/non_contiguous",
        "q, k, v and the caches as strided views (last dim contiguous)",
        (),
        [dict(seqlen_new=2), dict(seqlen_new=1, seqlen_q=1)],
        check_call,
        builder=strided_case,
    ),
]

FEATURES = [*VALUES, *IN_PLACE, *ERRORS, *ODD_SHAPES, *PREFILL]
