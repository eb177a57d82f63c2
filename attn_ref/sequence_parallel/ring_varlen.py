"""ring-flash-attention's varlen entry points: a packed batch of documents on this package's ring.

``ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
causal=False, window_size=(-1, -1), alibi_slopes=None, deterministic=False,
return_attn_probs=False, group=None)``, its ``_kvpacked_func(q, kv, ...)`` /
``_qkvpacked_func(qkv, ...)`` variants and the three ``zigzag_ring_flash_attn_varlen_*``, with the
names, order, defaults and return convention of ring-flash-attention
(zhuzilin/ring-flash-attention at commit ``899628238f2f5bb8c028579c89b7cd56ea451d2a``, files
``ring_flash_attn/ring_flash_attn_varlen.py`` and ``zigzag_ring_flash_attn_varlen.py``; layouts
from ``test/test_ring_flash_attn_varlen_func.py`` and
``test/test_zigzag_ring_flash_attn_varlen_func.py``).

**Layout of a packed batch.** The whole batch is ``B`` documents of lengths ``n_0 .. n_{B-1}``
(``T = Σ n_i`` tokens). Every document is cut into pieces of its own, so each rank holds a part of
*every* document, in document order:

* ring varlen: rank ``r`` holds block ``r`` of ``P`` equal blocks of each document, ``n_i / P``
  tokens;
* zigzag varlen: each document is cut into ``2P`` equal chunks and rank ``r`` holds chunks ``r``
  and ``2P-1-r``, ``2 n_i / (2P)`` tokens (first chunk ``r``, then chunk ``2P-1-r``).

Every rank passes the same *local* offsets ``cu_seqlens = [0, n_0 / P, (n_0 + n_1) / P, ...]``
(int32, ``B + 1`` values; the global offsets divided by ``P``) and ``max_seqlen`` (upstream passes
it to FlashAttention; here it is checked to be an int, as FlashAttention's varlen call checks it).
Tensors are ``q [T / P, h, d]``, ``k``/``v [T / P, h_k, d]``, ``kv [T / P, 2, h_k, d]``, ``qkv [T /
P, 3, h, d]``. Returns ``out [T / P, h, d]`` (q's dtype), or ``(out, softmax_lse [h, T / P] fp32,
None)`` with ``return_attn_probs=True`` (the LSE layout of flash-attn >= 2.6, which upstream
returns as it gets it).

**Computation.** The ring of :mod:`.ring`, unchanged: each document piece is a :class:`~.ring.Chunk`
tagged with its document, so a query attends only keys of its own document, and the causal mask
follows the pieces' order inside the document. Forward and backward (autograd) are the ring's,
with the local attention of the backend (one call per document and chunk pair).

What differs from ring-flash-attention (also on the docs page "Sequence parallelism: usage"):

* ``dropout_p != 0`` and ``alibi_slopes`` raise ``NotImplementedError``; ``window_size`` must mask
  nothing beyond ``causal`` (each side unlimited or covering the longest document), as in
  :mod:`.ring_flash_attn`;
* ``zigzag_ring_flash_attn_varlen_*`` with ``causal=False`` raise upstream's assertion as a
  ``ValueError``, on every rank before any exchange; an odd local document length raises (upstream
  halves it silently);
* the arguments are checked as FlashAttention's varlen call checks them (``cu_seqlens`` in the role
  of ``cu_seqlens_q`` and ``cu_seqlens_k``), and the offsets' values too;
* ``dq`` is in the inputs' dtype (upstream: bf16 whatever the input), gradients accumulate in fp32,
  and the LSE output carries a gradient.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch

from ..argument_checks import _require_cu_seqlens
from ..error_notes import catalogued
from ..fa3_checks import check_varlen_inputs
from .agreement import describe, run_checks_on_every_rank
from .backend import REFERENCE_BACKEND, AttentionBackend
from .checks import check_attention_inputs, check_no_dropout, check_tensors, check_zigzag_rows
from .comm import Group, group_rank, group_size
from .ring import Chunk, block_chunks, ring_attention_states
from .ring_flash_attn import call_fields, check_no_alibi, check_ring_window


def unpack_varlen(
    packed: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` from ``{q, k, v}``, ``{q, kv}`` or ``{qkv}`` (packed on dim 1), checking the
    packed layout first."""
    if "qkv" in packed:
        check_tensors(qkv=packed["qkv"])
        check_varlen_packed("qkv", packed["qkv"], 3)
        return packed["qkv"].unbind(1)
    if "kv" in packed:
        check_tensors(q=packed["q"], kv=packed["kv"])
        check_varlen_packed("kv", packed["kv"], 2)
        return (packed["q"], *packed["kv"].unbind(1))
    return packed["q"], packed["k"], packed["v"]


def document_chunks(
    ring_rank: int, ring_size: int, cu_seqlens: list[int], zigzag: bool
) -> tuple[Chunk, ...]:
    """The chunks of ring rank ``ring_rank``'s rows: per non-empty document ``i`` (local rows
    ``cu_seqlens[i] .. cu_seqlens[i + 1]``) its block (contiguous) or its two chunks (zigzag) of
    :func:`~.ring.block_chunks`, tagged with ``document=i``."""
    return tuple(
        replace(chunk, document=doc)
        for doc, (start, stop) in enumerate(zip(cu_seqlens, cu_seqlens[1:]))
        if stop > start
        for chunk in block_chunks(ring_rank, ring_size, stop - start, zigzag, offset=start)
    )


def _ring_flash_attn_varlen(
    call: str,
    zigzag: bool,
    packed: dict[str, torch.Tensor],
    cu_seqlens,
    max_seqlen,
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
    """The body of every entry point: the checks (upstream's order: layout, ALiBi, zigzag's causal
    assertion, then this package's), the ring over the documents, the return convention."""

    def checks():
        q, k, v = unpack_varlen(packed)
        check_no_alibi(alibi_slopes)
        if zigzag:
            check_zigzag_causal(causal)
        check_no_dropout("dropout_p", dropout_p)
        offsets = check_varlen_ring_inputs(q, k, v, cu_seqlens, max_seqlen, zigzag)
        longest = max((b - a for a, b in zip(offsets, offsets[1:])), default=0) * size
        return q, k, v, offsets, check_ring_window(window_size, causal, longest)

    size, rank = group_size(group), group_rank(group)
    fields = call_fields(
        packed,
        softmax_scale,
        causal,
        window_size,
        cu_seqlens=describe(cu_seqlens),
        cu_seqlens_values=_offsets_or_none(cu_seqlens),
        max_seqlen=describe(max_seqlen),
    )
    q, k, v, offsets, causal = run_checks_on_every_rank(group, call, fields, checks)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out, lse = ring_attention_states(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        document_chunks(rank, size, offsets, zigzag),
        lambda src: document_chunks(src, size, offsets, zigzag),
        group=group,
        backend=backend,
        softmax_scale=scale,
        causal=causal,
    )
    out = out[0].to(q.dtype)
    if not return_attn_probs:
        return out
    # [1, T / P, h] -> flash-attn's varlen [h, T / P]
    return out, lse[0].transpose(0, 1).contiguous(), None


def _offsets_or_none(cu_seqlens: object) -> Optional[list]:
    """The offsets' values, which every rank must pass alike, when ``cu_seqlens`` is a 1-D
    tensor."""
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1:
        return cu_seqlens.tolist()
    return None


# The entry points: upstream's signatures (names, order, defaults; annotated here, which upstream's
# are not), each the body above for its layout, its arguments passed by name.


@catalogued
def ring_flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
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
    """Ring attention of a packed batch: this rank's block ``1 / P`` of every document.

    See the module docstring for the layout.

    Args:
        q (torch.Tensor): ``[T / P, h, d]``, this rank's queries, documents in order.
        k (torch.Tensor): ``[T / P, h_k, d]`` (``h % h_k == 0``).
        v (torch.Tensor): ``[T / P, h_k, d]``.
        cu_seqlens (torch.Tensor): ``[B + 1]`` int32 local offsets, the same on every rank.
        max_seqlen (int): the longest local document (FlashAttention's argument; checked, not
            read).
        dropout_p (float): must be 0 (``NotImplementedError`` otherwise).
        softmax_scale (float | None): default ``d ** -0.5``.
        causal (bool): causal inside each document (over its global order).
        window_size (tuple[int, int]): only windows that mask nothing beyond ``causal``.
        alibi_slopes (None): must be None (``NotImplementedError`` otherwise).
        deterministic (bool): accepted, no effect (forward and backward are deterministic).
        return_attn_probs (bool): also return the LSE (and None for the probabilities).
        group (ProcessGroup | None): the ring; None is the default group (the whole world).
        backend (AttentionBackend): local attention + merge (the kernels' in
            :mod:`kernels.sequence_parallel`).

    Returns:
        ``out [T / P, h, d]`` in q's dtype, or ``(out, lse [h, T / P] fp32, None)`` with
        ``return_attn_probs=True``.
    """
    return _ring_flash_attn_varlen(
        "ring_flash_attn_varlen_func",
        False,
        dict(q=q, k=k, v=v),
        cu_seqlens,
        max_seqlen,
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
def ring_flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
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
    """:func:`ring_flash_attn_varlen_func` with ``kv [T / P, 2, h_k, d]`` (k and v stacked on
    dim 1)."""
    return _ring_flash_attn_varlen(
        "ring_flash_attn_varlen_kvpacked_func",
        False,
        dict(q=q, kv=kv),
        cu_seqlens,
        max_seqlen,
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
def ring_flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
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
    """:func:`ring_flash_attn_varlen_func` with ``qkv [T / P, 3, h, d]`` (q, k, v stacked on
    dim 1)."""
    return _ring_flash_attn_varlen(
        "ring_flash_attn_varlen_qkvpacked_func",
        False,
        dict(qkv=qkv),
        cu_seqlens,
        max_seqlen,
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
def zigzag_ring_flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
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
    """:func:`ring_flash_attn_varlen_func` on the zigzag layout (per document, rank ``r`` holds
    chunks ``r`` and ``2P-1-r`` of ``2P``); ``causal=True`` only, as upstream asserts."""
    return _ring_flash_attn_varlen(
        "zigzag_ring_flash_attn_varlen_func",
        True,
        dict(q=q, k=k, v=v),
        cu_seqlens,
        max_seqlen,
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
def zigzag_ring_flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
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
    """:func:`zigzag_ring_flash_attn_varlen_func` with ``kv [T / P, 2, h_k, d]``."""
    return _ring_flash_attn_varlen(
        "zigzag_ring_flash_attn_varlen_kvpacked_func",
        True,
        dict(q=q, kv=kv),
        cu_seqlens,
        max_seqlen,
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
def zigzag_ring_flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
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
    """:func:`zigzag_ring_flash_attn_varlen_func` with ``qkv [T / P, 3, h, d]``."""
    return _ring_flash_attn_varlen(
        "zigzag_ring_flash_attn_varlen_qkvpacked_func",
        True,
        dict(qkv=qkv),
        cu_seqlens,
        max_seqlen,
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


def check_varlen_ring_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: object,
    zigzag: bool,
) -> list[int]:
    """The local tensors and offsets, checked as FlashAttention's varlen call checks them with
    ``cu_seqlens`` as both offsets (its words), then the offsets' values against q and k, the dtype
    the ring computes in, and (zigzag) an even local length per document. Returns the offsets."""
    check_varlen_inputs(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, *[None] * 7)
    for name, x in (("q", q), ("k", k)):
        _require_cu_seqlens("cu_seqlens", cu_seqlens, x.shape[0], f"{name}.shape[0]", True)
    check_attention_inputs(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))
    offsets = cu_seqlens.tolist()
    if zigzag:
        for doc, (start, stop) in enumerate(zip(offsets, offsets[1:])):
            check_zigzag_rows(stop - start, f"document {doc}'s local length")
    return offsets


def check_varlen_packed(name: str, x: torch.Tensor, parts: int) -> None:
    """ring-flash-attention's packed varlen layouts: ``kv [total, 2, h_k, d]``, ``qkv [total, 3,
    h, d]`` (``total``: this rank's tokens)."""
    if x.dim() != 4 or x.shape[1] != parts:
        raise ValueError(
            f"{name} must be a [total, {parts}, heads, head_dim] tensor, got shape {tuple(x.shape)}"
        )


def check_zigzag_causal(causal: object) -> None:
    """Upstream's ``assert causal == True, "zigzag ring is meaningless for causal=False"``: the
    zigzag layout only balances a causal mask."""
    if not causal:
        raise ValueError(
            "zigzag ring is meaningless for causal=False; pass causal=True, or call "
            "ring_flash_attn_varlen_func (the contiguous layout) for attention without a mask"
        )
