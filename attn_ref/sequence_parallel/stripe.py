"""ring-flash-attention's stripe entry points: causal ring attention on the striped token layout.

``stripe_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None)``
and its ``_kvpacked_func(q, kv, ...)`` / ``_qkvpacked_func(qkv, ...)`` variants, with the names,
order, defaults and return convention of ring-flash-attention (zhuzilin/ring-flash-attention at
commit ``899628238f2f5bb8c028579c89b7cd56ea451d2a``, ``ring_flash_attn/stripe_flash_attn.py``;
layout from ``test/test_stripe_flash_attn_func.py``).

**Layout.** Rank ``r`` of ``P`` holds the tokens ``r, r + P, r + 2P, ...`` of each sequence of ``S``
tokens (``S / P`` rows, every rank the same count): ``q [b, S / P, h, d]``, ``k``/``v [b, S / P,
h_k, d]``, ``kv [b, S / P, 2, h_k, d]``, ``qkv [b, S / P, 3, h, d]``. Returns ``out [b, S / P, h,
d]`` (q's dtype), or ``(out, softmax_lse [b, h, S / P] fp32, None)`` with ``return_attn_probs``.

**Computation.** The ring of :mod:`.ring` with one interleaved :class:`~.ring.Chunk` per rank:
local query row ``i`` of rank ``r`` (token ``iP + r``) sees local key row ``j`` of rank ``s`` (token
``jP + s``) iff ``jP + s <= iP + r``, i.e. ``j <= i`` when ``s <= r`` (a causal square) and ``j <
i`` when ``s > r`` (the square shifted by one token: rows ``1..`` over keys ``..-1``). Every step
costs about the same on every rank, as with zigzag.

What differs from ring-flash-attention: ``causal=False`` raises upstream's assertion as a
``ValueError`` on every rank before any exchange; the rest as :mod:`.ring_flash_attn` (no dropout,
no ALiBi, only windows that mask nothing beyond ``causal``, gradients in the inputs' dtype).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..error_notes import catalogued
from .agreement import run_checks_on_every_rank
from .backend import REFERENCE_BACKEND, AttentionBackend
from .checks import check_no_dropout
from .comm import Group, group_rank, group_size
from .ring import Chunk, check_ring_inputs, ring_attention_states
from .ring_flash_attn import (
    _unpack,
    batched_result,
    call_fields,
    check_no_alibi,
    check_ring_window,
)


def stripe_chunks(ring_rank: int, rows: int) -> tuple[Chunk, ...]:
    """Ring rank ``ring_rank``'s ``rows`` rows: one interleaved chunk at position ``ring_rank``."""
    return (Chunk(slice(0, rows), ring_rank, interleaved=True),) if rows else ()


def _stripe_flash_attn(
    call: str,
    packed: dict[str, torch.Tensor],
    *,
    dropout_p,
    softmax_scale,
    causal,
    window_size,
    alibi_slopes,
    return_attn_probs,
    group: Group,
    backend: AttentionBackend,
):
    """The body of every entry point: the checks (upstream's order: layout, ALiBi, the causal
    assertion, then this package's), the ring, the return convention."""

    def checks():
        q, k, v = _unpack(packed)
        check_no_alibi(alibi_slopes)
        check_stripe_causal(causal)
        check_no_dropout("dropout_p", dropout_p)
        check_ring_inputs(q, k, v, False)
        check_ring_window(window_size, causal, q.shape[1] * size)
        return q, k, v

    size, rank = group_size(group), group_rank(group)
    fields = call_fields(packed, softmax_scale, causal, window_size)
    q, k, v = run_checks_on_every_rank(group, call, fields, checks)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    rows = q.shape[1]
    out, lse = ring_attention_states(
        q,
        k,
        v,
        stripe_chunks(rank, rows),
        lambda src: stripe_chunks(src, rows),
        group=group,
        backend=backend,
        softmax_scale=scale,
        causal=True,
    )
    return batched_result(out.to(q.dtype), lse, return_attn_probs)


# The entry points: upstream's signatures (names, order, defaults; annotated here, which upstream's
# are not), each the body above for its layout, its arguments passed by name.


@catalogued
def stripe_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group: Group = None,
    *,
    backend: AttentionBackend = REFERENCE_BACKEND,
):
    """Causal ring attention of this rank's striped tokens ``q [b, S / P, h, d]`` (tokens ``r, r +
    P, ...``) over every rank's ``k, v [b, S / P, h_k, d]``. See the module docstring.

    Args:
        q (torch.Tensor): ``[b, S / P, h, d]``, this rank's queries.
        k (torch.Tensor): ``[b, S / P, h_k, d]`` (``h % h_k == 0``).
        v (torch.Tensor): ``[b, S / P, h_k, d]``.
        dropout_p (float): must be 0 (``NotImplementedError`` otherwise).
        softmax_scale (float | None): default ``d ** -0.5``.
        causal (bool): must be True (upstream asserts it; ``ValueError`` otherwise).
        window_size (tuple[int, int]): only windows that mask nothing beyond ``causal``.
        alibi_slopes (None): must be None (``NotImplementedError`` otherwise).
        deterministic (bool): accepted, no effect (forward and backward are deterministic).
        return_attn_probs (bool): also return the LSE (and None for the probabilities).
        group (ProcessGroup | None): the ring; None is the default group (the whole world).
        backend (AttentionBackend): local attention + merge (the kernels' in
            :mod:`kernels.sequence_parallel`).

    Returns:
        ``out [b, S / P, h, d]`` in q's dtype, or ``(out, lse [b, h, S / P] fp32, None)`` with
        ``return_attn_probs=True``.
    """
    return _stripe_flash_attn(
        "stripe_flash_attn_func",
        dict(q=q, k=k, v=v),
        dropout_p=dropout_p,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        alibi_slopes=alibi_slopes,
        return_attn_probs=return_attn_probs,
        group=group,
        backend=backend,
    )


@catalogued
def stripe_flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group: Group = None,
    *,
    backend: AttentionBackend = REFERENCE_BACKEND,
):
    """:func:`stripe_flash_attn_func` with ``kv [b, S / P, 2, h_k, d]`` (k and v stacked on
    dim 2)."""
    return _stripe_flash_attn(
        "stripe_flash_attn_kvpacked_func",
        dict(q=q, kv=kv),
        dropout_p=dropout_p,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        alibi_slopes=alibi_slopes,
        return_attn_probs=return_attn_probs,
        group=group,
        backend=backend,
    )


@catalogued
def stripe_flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group: Group = None,
    *,
    backend: AttentionBackend = REFERENCE_BACKEND,
):
    """:func:`stripe_flash_attn_func` with ``qkv [b, S / P, 3, h, d]`` (q, k, v stacked on
    dim 2)."""
    return _stripe_flash_attn(
        "stripe_flash_attn_qkvpacked_func",
        dict(qkv=qkv),
        dropout_p=dropout_p,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        alibi_slopes=alibi_slopes,
        return_attn_probs=return_attn_probs,
        group=group,
        backend=backend,
    )


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_stripe_causal(causal: object) -> None:
    """Upstream's ``assert causal``, with its message: the stripe layout only balances a causal
    mask."""
    if not causal:
        raise ValueError(
            "stripe flash attn only supports causal attention, if not causal, use ring flash attn "
            "instead"
        )
