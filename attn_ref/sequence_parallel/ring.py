"""Ring attention: K/V blocks travel around a ring of ranks; partial states merge through the LSE.

Each of the ``R`` ranks of a ring holds one block of queries and the matching block of keys/values
(same heads, different tokens). At step ``t = 0..R-1`` rank ``r`` holds the K/V block of ring rank
``s = (r - t) mod R``; it posts the exchange that passes this block on to ``r + 1`` (and receives
``r - 1``'s), computes its queries against the block it holds, and folds the result into its
running state with ⊕ (see :mod:`attn_ref.merge`)::

    lse = logaddexp(lse_acc, lse_blk)
    out = e^{lse_acc - lse} out_acc + e^{lse_blk - lse} out_blk        (fp32, stable: -inf rows stay
    0)

⊕ is associative and commutative, so after ``R`` steps every query has seen every key exactly once
and the state equals single-device attention over the whole sequence.

**Causal masks by chunk order.** A block is a list of :class:`Chunk` s, each a run of rows with a
*position*: where that run sits in the global sequence. For queries of chunk ``a`` and keys of chunk
``b``: ``b`` before ``a`` is fully visible, ``b == a`` is the diagonal (a causal square), ``b``
after ``a`` is skipped. With contiguous blocks (chunk = rank) rank ``r`` computes ``r + 1`` of the
``R`` steps, so the last rank does ``R`` times the work of the first. **Zigzag** balances it: rank
``r`` holds chunks ``r`` and ``2R-1-r`` of ``2R``, and every step then costs the same half block
(see :mod:`.layout`). Replicated (text) tokens are chunks at position ``-inf`` (a prefix) or
``+inf`` (a suffix) that every rank holds, attended once and never rotated, so each is counted
exactly once.

**Backward.** :func:`ring_attention_states` is an autograd Function whose backward is the ring again
(:func:`_ring_backward`): the K/V blocks travel in the same order, and each block's ``dK``/``dV``
accumulator (fp32) travels with it and arrives back at its owner after ``R`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Callable, Optional, Sequence

import torch
from torch.autograd.function import once_differentiable

from ..error_notes import catalogued
from ..masks import CAUSAL, NO_MASK, AttentionMask
from .agreement import describe, run_checks_on_every_rank
from .backend import REFERENCE_BACKEND, AttentionBackend
from .checks import check_4d, check_attention_inputs, check_tensors, check_zigzag_rows
from .comm import Group, RingExchange, group_rank, group_size

#: Position of a replicated prefix / suffix chunk: before / after every sharded token.
PREFIX_POSITION = float("-inf")
SUFFIX_POSITION = float("inf")


@dataclass(frozen=True)
class Chunk:
    """Rows ``rows`` (dim 1) of a local tensor, holding the tokens of chunk ``position``.

    ``document``: the packed document the rows belong to (varlen); rows of different documents
    never attend each other. ``interleaved``: the stripe layout, where row ``j`` of the chunk at
    position ``p`` is global token ``j·R + p`` (every interleaved chunk of a ring has the same
    number of rows).
    """

    rows: slice
    position: float
    document: int = 0
    interleaved: bool = False


@dataclass(frozen=True)
class _Block:
    """One local attention call: query rows × key rows, causal (a diagonal square) or full."""

    q_rows: slice
    k_rows: slice
    causal: bool

    @property
    def mask(self) -> AttentionMask:
        """The block's mask: causal on the diagonal square, none otherwise."""
        return CAUSAL if self.causal else NO_MASK


def block_chunks(
    ring_rank: int, ring_size: int, rows: int, zigzag: bool, offset: int = 0
) -> tuple[Chunk, ...]:
    """The chunks of ring rank ``ring_rank``'s block of ``rows`` rows, starting at local row
    ``offset``.

    Contiguous: one chunk at position ``ring_rank``. Zigzag: chunks ``ring_rank`` and
    ``2·ring_size - 1 - ring_rank``, ``rows / 2`` rows each.
    """
    if not zigzag:
        return (Chunk(slice(offset, offset + rows), ring_rank),)
    half = rows // 2
    return (
        Chunk(slice(offset, offset + half), ring_rank),
        Chunk(slice(offset + half, offset + rows), 2 * ring_size - 1 - ring_rank),
    )


@catalogued
def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Group = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    zigzag: bool = False,
    backend: AttentionBackend = REFERENCE_BACKEND,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of this rank's queries over the K/V of every rank of the ring ``group``.

    Args:
        q: ``[b, S / P, h, d]`` this rank's block of queries; k ``[b, S / P, h_k, d]``, v ``[b, S /
            P, h_k, d_v]`` the same tokens' keys and values (``h % h_k == 0``). Every rank passes
            the same shapes.
        group: the ring; None is the default group (the whole world), as in ``torch.distributed``;
            this rank alone without torch.distributed, or with :data:`~.comm.SELF_GROUP`.
        softmax_scale: default ``d ** -0.5``.
        causal: causal over the global sequence, whose layout is given by ``zigzag``: rank ``r``
            holds block ``r`` (contiguous), or chunks ``r`` and ``2R-1-r`` of ``2R`` (zigzag; ``S``
            even). See :func:`attn_ref.sequence_parallel.shard_sequence`.
        backend: local attention + merge (:data:`REFERENCE_BACKEND` or the kernels').

    Returns:
        ``out [b, S / P, h, d_v]`` in q's dtype and ``lse [b, S / P, h]`` fp32 (natural log), equal
        to single-device attention of these rows over the whole sequence.
    """
    fields = dict(
        q=describe(q),
        k=describe(k),
        v=describe(v),
        softmax_scale=softmax_scale,
        causal=causal,
        zigzag=zigzag,
    )
    run_checks_on_every_rank(
        group, "ring_attention", fields, lambda: check_ring_inputs(q, k, v, zigzag)
    )
    return ring_attention_unchecked(q, k, v, group, softmax_scale, causal, zigzag, backend)


def check_ring_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, zigzag: bool) -> None:
    """The checks of :func:`ring_attention` (and of the ring-flash-attention entry points)."""
    check_tensors(q=q, k=k, v=v)
    check_4d(q=q, k=k, v=v)
    check_attention_inputs(q, k, v)
    if zigzag:
        check_zigzag_rows(q.shape[1], "q's local sequence length")


def ring_attention_unchecked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Group,
    softmax_scale: Optional[float],
    causal: bool,
    zigzag: bool,
    backend: AttentionBackend,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ring_attention` after its checks: ``(out in q's dtype, lse [b, S / P, h] fp32)``."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    size, rank, rows = group_size(group), group_rank(group), q.shape[1]
    out, lse = ring_attention_states(
        q,
        k,
        v,
        block_chunks(rank, size, rows, zigzag),
        lambda src: block_chunks(src, size, rows, zigzag),
        group=group,
        backend=backend,
        softmax_scale=scale,
        causal=causal,
    )
    return out.to(q.dtype), lse


def ring_attention_states(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_chunks: Sequence[Chunk],
    kv_chunks: Callable[[int], Sequence[Chunk]],
    *,
    group: Group,
    backend: AttentionBackend,
    softmax_scale: float,
    causal: bool,
    fixed_kv: Optional[tuple[torch.Tensor, torch.Tensor, Sequence[Chunk]]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ring (no argument checks; callers check first), differentiable with the ring backward.

    Args:
        q: ``[b, s_q, h, d]`` local queries, laid out as ``q_chunks``.
        k: ``[b, s_k, h_k, d]`` this rank's key block, the one that rotates; ``kv_chunks(s)`` gives
            the chunks of ring rank ``s``'s block.
        v: ``[b, s_k, h_k, d_v]`` this rank's value block, rotating with ``k``.
        fixed_kv: ``(k, v, chunks)`` attended once, at step 0, and never sent (replicated tokens).

    Returns:
        fp32 ``out [b, s_q, h, d_v]`` and ``lse [b, s_q, h]``.
    """
    k_fixed, v_fixed, fixed_chunks = fixed_kv if fixed_kv is not None else (None, None, ())
    plan = _RingPlan(q_chunks, kv_chunks, group, backend, softmax_scale, causal, fixed_chunks)
    return _RingAttention.apply(plan, q, k, v, k_fixed, v_fixed)


@dataclass(frozen=True)
class _RingPlan:
    """Everything of one ring call that is not a tensor."""

    q_chunks: Sequence[Chunk]
    kv_chunks: Callable[[int], Sequence[Chunk]]
    group: Group
    backend: AttentionBackend
    softmax_scale: float
    causal: bool
    fixed_chunks: Sequence[Chunk]


class _RingAttention(torch.autograd.Function):
    """The ring forward (:func:`_ring_forward`) with the ring backward (:func:`_ring_backward`)."""

    @staticmethod
    def forward(ctx, plan: _RingPlan, q, k, v, k_fixed, v_fixed):
        out, lse = _ring_forward(plan, q, k, v, k_fixed, v_fixed)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, k_fixed, v_fixed, out, lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, k_fixed, v_fixed, out, lse = ctx.saved_tensors
        grads = _ring_backward(ctx.plan, dout, dlse, q, k, v, k_fixed, v_fixed, out, lse)
        return (None, *grads)


def _ring_forward(plan: _RingPlan, q, k, v, k_fixed, v_fixed) -> tuple[torch.Tensor, torch.Tensor]:
    """The ring loop: fp32 ``(out [b, s_q, h, d_v], lse [b, s_q, h])``."""
    b, sq, h = q.shape[:3]
    out = torch.zeros(b, sq, h, v.shape[-1], dtype=torch.float32, device=q.device)
    # ⊕'s identity
    lse = torch.full((b, sq, h), float("-inf"), dtype=torch.float32, device=q.device)
    backend = plan.backend

    def accumulate(k_blk: torch.Tensor, v_blk: torch.Tensor, k_chunks: Sequence[Chunk]) -> None:
        for blk in _blocks(plan.q_chunks, k_chunks, plan.causal):
            q_blk = q[:, blk.q_rows]
            o, l = backend.attend_forward(
                q_blk, k_blk[:, blk.k_rows], v_blk[:, blk.k_rows], plan.softmax_scale, blk.mask
            )
            out[:, blk.q_rows], lse[:, blk.q_rows] = backend.merge(
                out[:, blk.q_rows], lse[:, blk.q_rows], o, l
            )

    size, rank = group_size(plan.group), group_rank(plan.group)
    exchange = RingExchange(plan.group) if size > 1 else None
    kv = torch.cat([k.reshape(-1), v.reshape(-1)])  # one message per step carries K and V
    for step in range(size):
        incoming = exchange.start(kv) if step < size - 1 else None  # overlaps the compute below
        k_blk, v_blk = kv[: k.numel()].view(k.shape), kv[k.numel() :].view(v.shape)
        accumulate(k_blk, v_blk, plan.kv_chunks((rank - step) % size))
        if step == 0 and k_fixed is not None:
            accumulate(k_fixed, v_fixed, plan.fixed_chunks)
        if incoming is not None:
            exchange.wait()
            kv = incoming
    return out, lse


def _ring_backward(plan: _RingPlan, dout, dlse, q, k, v, k_fixed, v_fixed, out, lse) -> tuple:
    """The ring backward: ``(dq, dk, dv, dk_fixed, dv_fixed)`` in the inputs' dtypes.

    The K/V blocks travel the ring again, in the forward's order. At step ``t`` rank ``r`` holds
    block ``s = (r - t) mod R`` together with that block's fp32 ``dK``/``dV`` accumulator; it adds
    the block's contribution to its own ``dQ`` and its queries' contribution to the accumulator,
    then passes the accumulator on with the block. Each block's gradient is exact on its own,
    because it is computed with the rows' *final* ``out`` and ``lse`` (see
    :mod:`attn_ref.backward`). After ``R`` steps (``R`` sends of the accumulator, one more than of
    the K/V) every accumulator is back at the rank that owns its block. The replicated K/V
    (``fixed``) never move: their gradient is this rank's queries' contribution (summed over ranks
    by :func:`~.replicated.replicated_input`).
    """
    backend = plan.backend
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)

    def accumulate(k_blk, v_blk, dk_blk, dv_blk, k_chunks: Sequence[Chunk]) -> None:
        for blk in _blocks(plan.q_chunks, k_chunks, plan.causal):
            rows, keys = blk.q_rows, blk.k_rows
            dq_b, dk_b, dv_b = backend.attend_backward(
                dout[:, rows],
                q[:, rows],
                k_blk[:, keys],
                v_blk[:, keys],
                out[:, rows],
                lse[:, rows],
                plan.softmax_scale,
                blk.mask,
                dlse[:, rows],
            )
            dq[:, rows] += dq_b
            dk_blk[:, keys] += dk_b
            dv_blk[:, keys] += dv_b

    size, rank = group_size(plan.group), group_rank(plan.group)
    kv_exchange, grad_exchange = (
        (RingExchange(plan.group), RingExchange(plan.group)) if size > 1 else (None, None)
    )
    kv = torch.cat([k.reshape(-1), v.reshape(-1)])
    # the travelling dK/dV accumulator
    dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
    dk_fixed = (
        None
        if k_fixed is None
        else torch.zeros(k_fixed.shape, dtype=torch.float32, device=q.device)
    )
    dv_fixed = (
        None
        if v_fixed is None
        else torch.zeros(v_fixed.shape, dtype=torch.float32, device=q.device)
    )
    for step in range(size):
        # the next block, during the compute
        incoming = kv_exchange.start(kv) if step < size - 1 else None
        k_blk, v_blk = kv[: k.numel()].view(k.shape), kv[k.numel() :].view(v.shape)
        dk_blk, dv_blk = dkv[: k.numel()].view(k.shape), dkv[k.numel() :].view(v.shape)
        accumulate(k_blk, v_blk, dk_blk, dv_blk, plan.kv_chunks((rank - step) % size))
        if step == 0 and k_fixed is not None:
            accumulate(k_fixed, v_fixed, dk_fixed, dv_fixed, plan.fixed_chunks)
        if incoming is not None:
            kv_exchange.wait()
            kv = incoming
        if grad_exchange is not None:  # the accumulator follows its block to the next rank
            arriving = grad_exchange.start(dkv)
            grad_exchange.wait()
            dkv = arriving
    dk, dv = dkv[: k.numel()].view(k.shape), dkv[k.numel() :].view(v.shape)
    return (
        dq.to(q.dtype),
        dk.to(k.dtype),
        dv.to(v.dtype),
        None if dk_fixed is None else dk_fixed.to(k_fixed.dtype),
        None if dv_fixed is None else dv_fixed.to(v_fixed.dtype),
    )


def _blocks(q_chunks: Sequence[Chunk], k_chunks: Sequence[Chunk], causal: bool) -> list[_Block]:
    """The local attention calls for queries ``q_chunks`` over keys ``k_chunks``.

    Chunks of different documents are skipped. A key chunk after the query chunk is skipped
    (causal), the same chunk is a causal square, an earlier one (or any, without causal) is fully
    visible; adjacent fully visible pairs are merged into one call. Interleaved chunks (stripe) are
    causal squares: on all rows for a key chunk at or before the query chunk's position, else
    shifted by one token (query row ``i`` sees key rows ``j < i``).
    """
    blocks = [
        blk for qc in q_chunks for kc in k_chunks if (blk := _pair(qc, kc, causal)) is not None
    ]
    return sorted(_coalesce(blocks), key=lambda blk: (blk.q_rows.start, blk.k_rows.start))


def _pair(qc: Chunk, kc: Chunk, causal: bool) -> Optional[_Block]:
    """The local call of query chunk ``qc`` over key chunk ``kc`` (see :func:`_blocks`), or None
    when no key of ``kc`` is visible."""
    if qc.document != kc.document:
        return None
    if not causal:
        return _Block(qc.rows, kc.rows, False)
    if qc.interleaved:
        if kc.position <= qc.position:
            return _Block(qc.rows, kc.rows, True)
        if qc.rows.stop - qc.rows.start < 2:  # row 0 sees no key of a later chunk
            return None
        return _Block(
            slice(qc.rows.start + 1, qc.rows.stop), slice(kc.rows.start, kc.rows.stop - 1), True
        )
    if kc.position > qc.position:
        return None
    return _Block(qc.rows, kc.rows, kc.position == qc.position)


def _coalesce(blocks: list[_Block]) -> list[_Block]:
    """Merge full (non-causal) blocks that share their query rows or key rows and touch."""
    while True:
        for a, b in combinations(blocks, 2):
            joined = _join(a, b)
            if joined is not None:
                blocks = [blk for blk in blocks if blk is not a and blk is not b] + [joined]
                break
        else:
            return blocks


def _join(a: _Block, b: _Block) -> Optional[_Block]:
    if a.causal or b.causal:
        return None
    if a.q_rows == b.q_rows and _touching(a.k_rows, b.k_rows):
        return _Block(a.q_rows, _union(a.k_rows, b.k_rows), False)
    if a.k_rows == b.k_rows and _touching(a.q_rows, b.q_rows):
        return _Block(_union(a.q_rows, b.q_rows), a.k_rows, False)
    return None


def _touching(x: slice, y: slice) -> bool:
    return x.stop == y.start or y.stop == x.start


def _union(x: slice, y: slice) -> slice:
    return slice(min(x.start, y.start), max(x.stop, y.stop))
