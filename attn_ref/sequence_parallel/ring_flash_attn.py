"""ring-flash-attention's entry points on this package's ring: code written for it runs unchanged.

``ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None)``
and its ``_kvpacked_func(q, kv, ...)`` / ``_qkvpacked_func(qkv, ...)`` variants, with the same
names, order, defaults and return convention as ring-flash-attention
(zhuzilin/ring-flash-attention):

* layout ``[b, S / P, h, d]``, this rank's block of the sequence; ``kv [b, S / P, 2, h_k, d]`` and
  ``qkv [b, S / P, 3, h, d]`` (k, v or q, k, v stacked on dim 2);
* ``group=None`` rings over the default group (the whole world);
* returns ``out [b, S / P, h, d]`` (q's dtype), or ``(out, softmax_lse [b, h, S / P] fp32, None)``
  with ``return_attn_probs=True`` (ring-flash-attention returns no probabilities either).

``zigzag_ring_flash_attn_*`` expect the zigzag layout (rank ``r`` holds chunks ``r`` and
``2P-1-r`` of ``2P``, :func:`~.layout.shard_sequence` with ``zigzag=True``); ``ring_flash_attn_*``
the contiguous one (rank ``r`` holds block ``r``).

What differs (also on the docs page "ring-flash-attention"):

* ``dropout_p != 0`` and ``alibi_slopes`` raise ``NotImplementedError`` (ring-flash-attention
  asserts ``alibi_slopes is None`` and passes dropout to FlashAttention per block);
* ``window_size`` must mask nothing beyond ``causal`` (``(-1, -1)``, or FlashAttention's causal
  ``(-1, 0)``, or sides covering the whole sequence); any other window raises: ring-flash-attention
  applies it inside each block, which is not the global window;
* ``zigzag_ring_flash_attn_*`` also accept ``causal=False`` (ring-flash-attention asserts causal):
  without a mask the layout does not matter;
* ``deterministic`` is accepted and has no effect (forward and backward are deterministic);
* the backward is the ring backward of :mod:`.ring`, with ``dq``/``dk``/``dv`` in the inputs' dtype
  (ring-flash-attention returns ``dq`` as bf16 whatever the input dtype), accumulated in fp32.

Every rank's checks run before the first exchange, with the cross-rank agreement of
:mod:`.agreement`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import torch

from ..error_notes import catalogued
from .agreement import describe, run_checks_on_every_rank
from .backend import REFERENCE_BACKEND, AttentionBackend
from .checks import check_no_dropout, check_tensors
from .comm import Group, group_size
from .ring import check_ring_inputs, ring_attention_unchecked


def _unpack(packed: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` from ``{q, k, v}``, ``{q, kv}`` or ``{qkv}``, checking the packed layout
    first."""
    if "qkv" in packed:
        check_tensors(qkv=packed["qkv"])
        check_packed("qkv", packed["qkv"], 3)
        return packed["qkv"].unbind(2)
    if "kv" in packed:
        check_tensors(q=packed["q"], kv=packed["kv"])
        check_packed("kv", packed["kv"], 2)
        return (packed["q"], *packed["kv"].unbind(2))
    return packed["q"], packed["k"], packed["v"]


def call_fields(packed: dict, softmax_scale, causal, window_size, **more) -> dict:
    """What every rank's call of a ring-flash-attention entry point must agree on (for
    :func:`~.agreement.run_checks_on_every_rank`): the packed tensors described, ``more`` (the
    entry point's own arguments, already described), the scale, ``causal`` and the window."""
    fields = {name: describe(x) for name, x in packed.items()}
    fields.update(more)
    fields.update(softmax_scale=softmax_scale, causal=causal, window_size=describe(window_size))
    return fields


def batched_result(out: torch.Tensor, lse: torch.Tensor, return_attn_probs):
    """ring-flash-attention's return convention for ``[b, S / P, h, d]`` inputs: ``out``, or
    ``(out, softmax_lse [b, h, S / P], None)`` (the ring's LSE ``[b, S / P, h]`` transposed)."""
    if not return_attn_probs:
        return out
    return out, lse.transpose(1, 2).contiguous(), None


def _ring_flash_attn(
    call: str,
    zigzag: bool,
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
    """The body of every entry point: the checks (upstream's order: layout, ALiBi, then this
    package's), the ring, the return convention. ``packed``: ``{q, k, v}``, ``{q, kv}`` or
    ``{qkv}``; the keywords are the entry point's own arguments (``deterministic``, which has no
    effect, is not passed)."""

    def checks():
        q, k, v = _unpack(packed)
        check_no_alibi(alibi_slopes)
        check_no_dropout("dropout_p", dropout_p)
        check_ring_inputs(q, k, v, zigzag)
        return q, k, v, check_ring_window(window_size, causal, q.shape[1] * group_size(group))

    fields = call_fields(packed, softmax_scale, causal, window_size)
    q, k, v, causal = run_checks_on_every_rank(group, call, fields, checks)
    out, lse = ring_attention_unchecked(q, k, v, group, softmax_scale, causal, zigzag, backend)
    return batched_result(out, lse, return_attn_probs)


# The entry points: upstream's signatures (names, order, defaults; annotated here, which upstream's
# are not), each the body above for its layout, its arguments passed by name.


@catalogued
def ring_flash_attn_func(
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
    """Ring attention of this rank's block ``q [b, S / P, h, d]`` over every rank's ``k, v [b, S /
    P, h_k, d]``.

    Contiguous layout: rank ``r`` of ``group`` holds tokens ``[r·S / P, (r+1)·S / P)``. See the
    module docstring.

    Args:
        q (torch.Tensor): ``[b, S / P, h, d]``, this rank's queries.
        k (torch.Tensor): ``[b, S / P, h_k, d]``, this rank's keys (``h % h_k == 0``).
        v (torch.Tensor): ``[b, S / P, h_k, d]``, this rank's values.
        dropout_p (float): must be 0 (``NotImplementedError`` otherwise).
        softmax_scale (float | None): default ``d ** -0.5``.
        causal (bool): causal over the global sequence.
        window_size (tuple[int, int]): ``(left, right)``; only windows that mask nothing beyond
            ``causal``.
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
    return _ring_flash_attn(
        "ring_flash_attn_func",
        False,
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
def ring_flash_attn_kvpacked_func(
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
    """:func:`ring_flash_attn_func` with ``kv [b, S / P, 2, h_k, d]`` (k and v stacked on dim 2)."""
    return _ring_flash_attn(
        "ring_flash_attn_kvpacked_func",
        False,
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
def ring_flash_attn_qkvpacked_func(
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
    """:func:`ring_flash_attn_func` with ``qkv [b, S / P, 3, h, d]`` (q, k, v stacked on dim 2)."""
    return _ring_flash_attn(
        "ring_flash_attn_qkvpacked_func",
        False,
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


@catalogued
def zigzag_ring_flash_attn_func(
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
    """:func:`ring_flash_attn_func` on the zigzag layout (rank ``r``: chunks ``r`` and ``2P-1-r`` of
    ``2P``)."""
    return _ring_flash_attn(
        "zigzag_ring_flash_attn_func",
        True,
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
def zigzag_ring_flash_attn_kvpacked_func(
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
    """:func:`zigzag_ring_flash_attn_func` with ``kv [b, S / P, 2, h_k, d]``."""
    return _ring_flash_attn(
        "zigzag_ring_flash_attn_kvpacked_func",
        True,
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
def zigzag_ring_flash_attn_qkvpacked_func(
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
    """:func:`zigzag_ring_flash_attn_func` with ``qkv [b, S / P, 3, h, d]``."""
    return _ring_flash_attn(
        "zigzag_ring_flash_attn_qkvpacked_func",
        True,
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


#: The six entry points, for :func:`with_backend` users (``kernels.sequence_parallel``).
RING_FLASH_ATTN_FUNCS = (
    ring_flash_attn_func,
    ring_flash_attn_kvpacked_func,
    ring_flash_attn_qkvpacked_func,
    zigzag_ring_flash_attn_func,
    zigzag_ring_flash_attn_kvpacked_func,
    zigzag_ring_flash_attn_qkvpacked_func,
)


def with_backend(func: Callable, backend: AttentionBackend) -> Callable:
    """``func`` (an entry point of this module, or :func:`~.ring.ring_attention`: a function with a
    ``backend`` keyword) computing with ``backend``: same arguments but ``backend``, same errors.
    Its signature (``inspect.signature``, ``help``) is ``func``'s without ``backend``."""

    @functools.wraps(func)
    def bound(*args, **kwargs):
        return func(*args, backend=backend, **kwargs)

    signature = inspect.signature(func)
    bound.__signature__ = signature.replace(
        parameters=[p for name, p in signature.parameters.items() if name != "backend"]
    )
    return bound


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_packed(name: str, x: torch.Tensor, parts: int) -> None:
    """ring-flash-attention's packed layouts: ``kv [b, S / P, 2, h_k, d]``, ``qkv [b, S / P, 3, h,
    d]``."""
    if x.dim() != 5 or x.shape[2] != parts:
        raise ValueError(
            f"{name} must be a [batch, seq, {parts}, heads, head_dim] tensor, got shape "
            f"{tuple(x.shape)}"
        )


def check_no_alibi(alibi_slopes: object) -> None:
    """ring-flash-attention asserts ``alibi_slopes is None``; ALiBi biases are not implemented here
    either."""
    if alibi_slopes is not None:
        raise NotImplementedError(
            "alibi_slopes is not supported by the ring (ring-flash-attention asserts alibi_slopes "
            "is None); pass alibi_slopes=None"
        )


def check_ring_window(window_size: object, causal: bool, seq_len: int) -> bool:
    """``window_size = (left, right)`` as FlashAttention reads it; returns whether the call is
    causal.

    A negative side is unlimited; FlashAttention treats ``(-1, 0)`` as causal. The ring masks whole
    blocks by their place in the global sequence of ``seq_len`` tokens, so it honours a window only
    where it masks nothing beyond ``causal``: each side unlimited or covering the whole sequence.
    """
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or any(isinstance(w, bool) or not isinstance(w, int) for w in window_size)
    ):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    # A side covering the whole sequence is unlimited; then FlashAttention's rule for a causal
    # window.
    left, right = (-1 if w >= seq_len - 1 else w for w in window_size)
    causal = bool(causal) or (left < 0 and right == 0)
    if left >= 0 or (not causal and right >= 0):
        raise NotImplementedError(
            f"window_size={tuple(window_size)} is not supported by the ring: a sliding window over "
            "the global "
            f"sequence of {seq_len} tokens needs per-token positions across ranks; pass "
            "window_size=(-1, -1) (with causal=True for a causal mask)"
        )
    return causal
