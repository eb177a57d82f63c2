"""Attention of one sequence over a set of keys, with its log-sum-exp: the tiled optimisation of
the dense formula, :mod:`attn_ref.dense` (the specification; ``tests/test_dense.py`` checks that
the two agree).

For query row ``i``, query head ``head`` (served by KV head ``kv_head = head // g``, ``g = h /
h_k``, GQA)::

    s_ij   = q_i · k_j  (+ qv_i · v_j  when qv is given;  only qv_i · v_j  when only_qv)
    ℓ_ij   = scale · s_ij                                 (softcap = 0)
           = softcap · tanh(scale · s_ij / softcap)       (softcap > 0, applied before masking)
    ℓ_ij   = -inf where key j is not visible to row i
    lse_i  = log( Σ_j e^{ℓ_ij} + e^{sink_head} )          (sink_head: the head's sink logit, if any)
    out_i  = Σ_j e^{ℓ_ij - lse_i} v_j

All of it in fp32 whatever the input dtype. A row with no visible key (and no sink) gives
``out = 0`` and ``lse = -inf``; with a sink it gives ``out = 0`` and ``lse = sink_head``.

Query rows are processed in tiles of :data:`ROWS_PER_TILE` (fewer when a tile's score tensor would
exceed :data:`MAX_SCORE_ELEMENTS`, so memory stays bounded: a 32k-token prefill never materialises
32k x 32k scores). A tile scores only the keys some of its rows see
(:func:`~attn_ref.masks.tile_key_range`: causal, window and chunk masks leave the others out) and
masks only the edge columns that not all of its rows see; the query heads of one KV head share one
batched matmul (``einsum`` over a view, no copy of K/V).

The file holds the loop body of :func:`attn_ref.kvcache.attend` in the order of its twin,
:mod:`kernels.attention`: :func:`_split_states` (one batch entry: :func:`_load_q`, the keys,
:func:`_dequantize` on :func:`dequantize_per_kv_head`, FA3's fp8 rule, which
:mod:`attn_ref.flash_attn` applies too, then :func:`attention_with_lse` per KV split, with its
pieces :func:`_scores`, :func:`_logits` and :func:`_softmax_state`), and :func:`_store_state`, which
writes a state into the call's results.
"""

from __future__ import annotations

from typing import Optional

import torch

from .call import KVCacheCall
from .masks import NO_MASK, AttentionMask
from .merge import _merge_states
from .paged import gather_range
from .rotary import apply_rotary
from .splits import split_bounds

#: Upper bound on the elements of one score tensor ``(h, rows, keys)`` (fp32: 256 MiB).
MAX_SCORE_ELEMENTS = 1 << 26
#: Query rows per tile, chosen by measurement (``benchmarks/results/cpu.md``): few enough that the
#: causal, window and chunk masks leave most of a tile's invisible keys out of its matmuls, enough
#: that each tile's matmuls are large.
ROWS_PER_TILE = 64
#: Keys read and attended at a time, chosen by measurement: a block's K (or V) copy, 16 MB for
#: 8 KV heads of 128 fp32 channels, is reused by the allocator from one block to the next, while a
#: whole long sequence's copy would be fresh memory each call (mmap'ed, zero-filled on first touch).
KEYS_PER_BLOCK = 4096


def _split_states(call: KVCacheCall, i: int, n_splits: int):
    """Attention states ``[(out (sq, h, dv), lse (sq, h))]`` of batch entry ``i``, one per KV split:
    what the programs of :func:`kernels.attention._split_states_kernel` for entry ``i`` compute
    together.

    A split's keys are read and attended :data:`KEYS_PER_BLOCK` at a time and the blocks' states
    folded with ⊕ (:func:`~attn_ref.merge.merge_attention_states`), so that no K/V copy is larger
    than a block."""
    batch = call.batch_host  # the per-batch values as Python ints
    # key j at position start + j
    sk, start, row = batch.seqlens_k[i], batch.leftpads[i], batch.cache_rows[i]
    q_loaded, qv = _load_q(call, i)  # (sq, h, d) fp32, (sq, h, dv) or None
    states = []
    for s, (k0, k1) in enumerate(split_bounds(sk, n_splits)):
        blocks = []
        # an empty split still gives its state
        for b0 in range(k0, max(k1, k0 + 1), KEYS_PER_BLOCK):
            b1 = min(k1, b0 + KEYS_PER_BLOCK)
            # (n, h_k, d)
            k = gather_range(call.k_cache, row, start + b0, start + b1, call.page_table).float()
            # (n, h_k, dv)
            v = gather_range(call.v_cache, row, start + b0, start + b1, call.page_table).float()
            q = q_loaded
            if call.is_fp8:
                q, k, v = _dequantize(call, i, q, k, v)
            blocks.append(
                attention_with_lse(
                    q,
                    k,
                    v,
                    call.softmax_scale,
                    call.mask,
                    call.softcap,
                    qv,
                    call.only_qv,
                    call.sinks
                    if s == 0 and b0 == k0
                    else None,  # the sink is counted once: in split 0
                    key_offset=b0,
                    seqlen_k=sk,
                )
            )
        states.append(_merge_states(blocks))
    return states


def _load_q(call: KVCacheCall, i: int):
    """``(q, qv)`` of batch entry ``i``: q ``(sq, h, d)`` fp32, rotated at ``rotary_starts[i] +
    row`` (or at ``rotary_starts[i]`` for every row when the call is neither causal nor local), and
    qv ``(sq, h, dv)`` or None."""
    batch = call.batch_host  # the per-batch values as Python ints
    sq, start = batch.seqlens_q[i], batch.q_starts[i]
    q = _rows(call.q, i, sq, start).float()
    qv = _rows(call.qv, i, sq, start) if call.qv is not None else None
    if call.rotary_dim and not call.only_qv:
        p0 = batch.rotary_starts[i]
        positions = (
            torch.full((sq,), p0) if call.rotary_q_fixed_position else torch.arange(p0, p0 + sq)
        )
        q = apply_rotary(
            q, call.rotary_cos, call.rotary_sin, positions.to(q.device), call.rotary_interleaved
        )
    return q, qv


def _rows(x: torch.Tensor, i: int, n: int, start: int) -> torch.Tensor:
    """Tokens of batch entry ``i``: ``x[i, :n]`` (batched layout) or ``x[start:start + n]``
    (packed)."""
    return x[start : start + n] if x.dim() == 3 else x[i, :n]


def _dequantize(call: KVCacheCall, i: int, q, k, v):
    """fp8 inputs of batch entry ``i`` (already fp32), each times its descale factor
    (:func:`dequantize_per_kv_head`)."""
    group = call.num_heads // call.num_heads_k
    return (
        dequantize_per_kv_head(q, call.q_descale, i, group),
        dequantize_per_kv_head(k, call.k_descale, i),
        dequantize_per_kv_head(v, call.v_descale, i),
    )


def dequantize_per_kv_head(
    x: torch.Tensor, descale: Optional[torch.Tensor], i: int, group: int = 1
) -> torch.Tensor:
    """FA3's fp8 rule: ``x (n, heads, d)`` (fp8 or fp32) as fp32 times ``descale[i, kv_head]``
    (``descale (b, h_k)`` fp32, entry ``i`` of the batch; None: factor 1), ``kv_head = head //
    group``: q's factor is repeated over the ``group`` query heads of its KV head, k and v
    (``group = 1``) take theirs as is. Also the dequantization of
    :mod:`attn_ref.flash_attn`'s fp8 sequences."""
    x = x.float()
    if descale is None:
        return x
    return x * descale[i].float().repeat_interleave(group)[None, :, None]


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    mask: AttentionMask = NO_MASK,
    softcap: float = 0.0,
    qv: Optional[torch.Tensor] = None,
    only_qv: bool = False,
    sinks: Optional[torch.Tensor] = None,
    key_offset: int = 0,
    seqlen_k: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention state of one sequence, computed tile by tile of query rows (module docstring).

    Args:
        q: ``(sq, h, d)`` queries (ignored when ``only_qv``).
        k: ``(n, h_k, d)`` keys ``key_offset .. key_offset + n - 1`` of a sequence of ``seqlen_k``
            keys. The offset lets a caller attend one slice of the keys (a KV split, a ring step)
            with the masks of the whole sequence.
        v: ``(n, h_k, dv)`` values of the same keys.
        softmax_scale: factor of ``q·k`` (and of ``qv·v``) in the logits.
        mask: the keys each row sees (:class:`~attn_ref.masks.AttentionMask`, bottom-right aligned).
        softcap: logits ``softcap * tanh(softmax_scale * s / softcap)`` before masking (0: off).
        qv: ``(sq, h, dv)`` extra query part dotted with V (MLA), or None.
        only_qv: logits from ``qv·v`` only (``q`` and ``k`` are not read).
        sinks: ``(h,)`` sink logits ``sinks[head]`` (final-logit space), or None.
        key_offset: position of ``k[0]`` in the whole sequence of keys.
        seqlen_k: length of the whole sequence of keys (default ``n``).

    Returns:
        The state ``out (sq, h, dv)`` fp32 and ``lse (sq, h)`` fp32 (natural log; the state layout:
        ``lse.shape == out.shape[:-1]``, as :func:`~attn_ref.merge.merge_attention_states` takes
        it).
    """
    sq, h = (qv if only_qv else q).shape[:2]
    n, h_k, dv = v.shape
    seqlen_k = n if seqlen_k is None else seqlen_k
    kf, vf = k.float(), v.float()
    sinks = None if sinks is None else sinks.float().view(h_k, h // h_k)
    out = torch.empty(sq, h, dv, dtype=torch.float32, device=v.device)
    lse = torch.empty(sq, h, dtype=torch.float32, device=v.device)
    rows_per_tile = max(1, min(ROWS_PER_TILE, MAX_SCORE_ELEMENTS // max(1, h * n)))
    for r0 in range(0, sq, rows_per_tile):
        r1 = min(sq, r0 + rows_per_tile)
        # Keys [lo, hi) are those some row of the tile sees, [full_lo, full_hi) those all of them
        # see.
        lo, hi, full_lo, full_hi = mask.tile_key_range(
            r0, r1, sq, seqlen_k, key_start=key_offset, key_end=key_offset + n
        )
        keys = slice(lo - key_offset, hi - key_offset)  # the tile's keys in k and v
        scores = _scores(
            None if only_qv else q[r0:r1],
            kf[keys],
            vf[keys],
            None if qv is None else qv[r0:r1],
            only_qv,
        )
        logits = _logits(scores, softmax_scale, softcap)  # (h_k, g, rows, hi - lo), in place
        # -inf where a row does not see a key: only the edges [lo, full_lo) and [full_hi, hi) need a
        # mask.
        for e0, e1 in ((lo, full_lo), (full_hi, hi)) if full_lo < full_hi else ((lo, hi),):
            if e0 < e1:
                visible = mask.visible_keys(
                    sq,
                    seqlen_k,
                    device=v.device,
                    row_start=r0,
                    row_end=r1,
                    key_start=e0,
                    key_end=e1,
                )  # (rows, e1 - e0)
                logits[..., e0 - lo : e1 - lo].masked_fill_(~visible, float("-inf"))
        o, l = _softmax_state(logits, vf[keys], sinks)
        out[r0:r1], lse[r0:r1] = (
            o.permute(2, 0, 1, 3).reshape(r1 - r0, h, dv),
            l.reshape(h, r1 - r0).T,
        )
    return out, lse


def _scores(
    q: Optional[torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    qv: Optional[torch.Tensor],
    only_qv: bool,
) -> torch.Tensor:
    """Scores ``q·kᵀ (+ qv·vᵀ)``, or ``qv·vᵀ`` alone when ``only_qv``, grouped by KV head.

    ``q (rows, h, d)``, ``qv (rows, h, dv)`` (or None), ``k (n, h_k, d)``, ``v (n, h_k, dv)`` fp32.
    Returns fp32 ``(h_k, g, rows, n)``, ``g = h / h_k`` query heads per KV head.
    """
    h_k = v.shape[1]
    if only_qv:
        return torch.einsum("rkgd,nkd->kgrn", _by_kv_head(qv, h_k), v)
    scores = torch.einsum("rkgd,nkd->kgrn", _by_kv_head(q, h_k), k)
    if qv is not None:
        scores += torch.einsum("rkgd,nkd->kgrn", _by_kv_head(qv, h_k), v)
    return scores


def _by_kv_head(x: torch.Tensor, h_k: int) -> torch.Tensor:
    """``(rows, h, dim)`` -> fp32 ``(rows, h_k, g, dim)``: the query heads grouped by their KV
    head."""
    rows, h, dim = x.shape
    return x.float().view(rows, h_k, h // h_k, dim)


def _logits(scores: torch.Tensor, softmax_scale: float, softcap: float) -> torch.Tensor:
    """Logits ``scale · s``, or ``softcap · tanh(scale · s / softcap)`` with ``softcap > 0`` (before
    the mask), computed in place: the score tensor is the largest allocation of the call."""
    if softcap > 0:
        return scores.mul_(softmax_scale / softcap).tanh_().mul_(softcap)
    return scores.mul_(softmax_scale)


def _softmax_state(
    logits: torch.Tensor, v: torch.Tensor, sinks: Optional[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise grouped logits into an attention state (``logits`` is overwritten).

    ``logits (h_k, g, rows, n)`` fp32 with -inf where masked, ``v (n, h_k, dv)`` fp32,
    ``sinks (h_k, g)`` or None. Returns ``out (h_k, g, rows, dv)`` and ``lse (h_k, g, rows)`` (the
    layout of the scores: no copy of ``p``, one batched matmul per KV head).
    """
    # Row maximum; a state over zero keys (empty split, cache_seqlens = 0) has max -inf.
    m = (
        logits.amax(dim=-1)
        if logits.shape[-1]
        else logits.new_full(logits.shape[:-1], float("-inf"))
    )
    if sinks is not None:
        m = torch.maximum(m, sinks[..., None])
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # empty row: any finite shift works
    p = logits.sub_(m[..., None]).exp_()  # (h_k, g, rows, n), 0 where masked; overwrites logits
    denom = p.sum(dim=-1)  # (h_k, g, rows)
    if sinks is not None:
        denom = denom + torch.exp(sinks[..., None] - m)
    inv = torch.where(denom > 0, 1.0 / denom, torch.zeros_like(denom))
    # normalised after the matmul: fewer products
    out = torch.einsum("kgrn,nkd->kgrd", p, v).mul_(inv[..., None])
    return out, m + torch.log(denom)


def _store_state(state, rows: slice, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Write ``state = (out (sq, h, dv), lse (sq, h))`` of one batch entry into its ``rows`` of the
    rows-first results ``out (total_q, h, dv)`` and ``lse (h, total_q)``."""
    out[rows], lse[:, rows] = state[0], state[1].T
