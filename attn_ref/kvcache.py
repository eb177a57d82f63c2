"""Reference ``flash_attn_with_kvcache``: sglang's FA3 API computed in plain PyTorch, fp32 math.

The call runs in three steps, each a short function (the append's in :mod:`attn_ref.append`):

1. :func:`check_kvcache_args` validates everything (nothing is written if it raises);
2. :func:`attn_ref.append.append_kv` writes the new keys (rotated) and values into the cache, in
   place;
3. :func:`attend` computes, per batch entry, the attention of its query rows over its valid keys
   ``[leftpad, cache_seqlens + new)``, as ``num_splits`` key ranges merged through their LSE.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from .append import append_kv
from .attention import _split_states, _store_state
from .call import KVCacheCall
from .error_notes import catalogued
from .merge import _merge_states
from .validation import check_kvcache_args


@catalogued
def flash_attn_with_kvcache(
    q: Optional[torch.Tensor],
    k_cache: Optional[torch.Tensor],
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    qv: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    rotary_seqlens: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),  # -1 means infinite context window
    attention_chunk: Optional[int] = None,
    softcap: float = 0.0,  # 0.0 means deactivated
    rotary_interleaved: bool = True,
    scheduler_metadata: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    only_qv: bool = False,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    sinks: Optional[torch.Tensor] = None,
    score_mod: Optional[Callable] = None,
    aux_tensors: Optional[list[torch.Tensor]] = None,
    ver: int = 3,
    out: Optional[torch.Tensor] = None,
):
    """Attention of ``q`` over a KV cache, appending ``k``/``v`` to the cache first (in place).

    Same signature, order and defaults as sglang's
    ``sgl_kernel.flash_attn.flash_attn_with_kvcache``. Shapes (``b`` batch, ``sq`` query rows, ``h``
    / ``h_k`` query / KV heads, ``d`` / ``dv`` head dims, ``page_size``):

    Args:
        q (torch.Tensor | None): ``(b, sq, h, d)``, or ``(total_q, h, d)`` with ``cu_seqlens_q``.
            fp16, bf16, fp32 or fp8 e4m3. May be None only with ``only_qv=True``.
        k_cache (torch.Tensor | None): ``(b_cache, s_cache, h_k, d)``, or paged ``(num_pages,
            page_size, h_k, d)`` with ``page_table``. May be None only with ``only_qv=True`` (a
            placeholder is used).
        v_cache (torch.Tensor): ``(b_cache, s_cache, h_k, dv)`` or ``(num_pages, page_size, h_k,
            dv)``.
        k (torch.Tensor | None): new keys ``(b, s_new, h_k, d)``, or ``(total_new, h_k, d)`` with
            ``cu_seqlens_k_new``; written (after rotary) at positions ``cache_seqlens[i] ...``.
            Needs ``v``.
        v (torch.Tensor | None): new values ``(b, s_new, h_k, dv)``, or ``(total_new, h_k, dv)``;
            written next to ``k``.
        qv (torch.Tensor | None): ``(b, sq, h, dv)`` / ``(total_q, h, dv)``: adds ``qv·V`` to the
            scores (MLA).
        rotary_cos (torch.Tensor | None): ``(seqlen_rotary, rotary_dim / 2)``, cosines of the rotary
            angles; needs ``k``/``v``.
        rotary_sin (torch.Tensor | None): ``(seqlen_rotary, rotary_dim / 2)``, sines, with
            ``rotary_cos``.
        cache_seqlens: int or ``(b,)`` int32: absolute end of the old tokens of each sequence.
        cache_batch_idx: ``(b,)`` int32: cache row (or page-table row) of each batch entry.
        cache_leftpad: ``(b,)`` int32: first valid cache position of each sequence.
        page_table: ``(b, max_pages)`` int32, one row per sequence: position ``p`` of sequence ``i``
            is at ``[page_table[i, p // page_size], p % page_size]``.
        cu_seqlens_q: ``(b + 1,)`` int32 offsets of each sequence's rows in packed (varlen) ``q``.
        cu_seqlens_k_new: ``(b + 1,)`` int32 offsets of each sequence's tokens in packed
            ``k``/``v``.
        max_seqlen_q: int, the longest sequence of packed ``q``; needed with ``cu_seqlens_q``.
        rotary_seqlens: ``(b,)`` int32 rotary position of the first new key (default cache_seqlens).
        q_descale: ``(b, h_k)`` fp32 factor of fp8 ``q`` per KV head (fp8 inputs only).
        k_descale: ``(b, h_k)`` fp32 factor of the fp8 key cache (fp8 inputs only).
        v_descale: ``(b, h_k)`` fp32 factor of the fp8 value cache (fp8 inputs only).
        softmax_scale (float | None): default ``(d + dv_qv) ** -0.5``, or ``dv ** -0.5`` with
            only_qv (as sglang).
        causal (bool): bottom-right aligned causal mask.
        window_size (tuple[int, int]): ``(left, right)`` keys visible around each row's diagonal; -1
            is unbounded.
        attention_chunk: keys only from the query's own chunk of this size (None/0: off).
        softcap (float): ``softcap * tanh(scale * s / softcap)`` before masking (0: off).
        rotary_interleaved (bool): GPT-J pairs (True) or GPT-NeoX halves (False).
        scheduler_metadata (torch.Tensor | None): FA3's precomputed schedule; accepted, no effect
            here.
        num_splits (int): <= 0 heuristic (here: 1), 1 no split, n > 1: n KV splits merged through
            their LSE.
        pack_gqa (bool | None): FA3's query-head packing switch; accepted, no effect here.
        only_qv (bool): scores from ``qv·V`` only (q and K are not read).
        sm_margin (int): SMs FA3 leaves free; accepted, no effect here.
        return_softmax_lse (bool): return ``(out, lse, out_accum, lse_accum)`` instead of ``out``.
        sinks (torch.Tensor | None): ``(h,)`` sink logits, added to the softmax denominator and to
            the LSE.
        score_mod (Callable | None): accepted and ignored, as sglang does.
        aux_tensors (list[torch.Tensor] | None): accepted and ignored, as sglang does.
        ver (int): FA version; must be 3, as in sglang.
        out (torch.Tensor | None): optional preallocated output ``(b, sq, h, dv)`` / ``(total_q, h,
            dv)``, written and returned.

    Returns:
        ``out`` ``(b, sq, h, dv)`` / ``(total_q, h, dv)`` in q's dtype (bf16 for fp8). With
        ``return_softmax_lse``: ``(out, lse, out_accum, lse_accum)`` where ``lse`` is fp32 ``(b, h,
        sq)`` / ``(h, total_q)`` (natural log; -inf for a row with no visible key, +inf for
        zero-length KV), and the split partials are fp32 ``(n, b, h, sq, dv)`` / ``(n, b, h, sq)``
        (varlen: ``(n, h, total_q, dv)`` / ``(n, h, total_q)``) when ``n > 1`` splits ran, else
        None.
    """
    call = check_kvcache_args(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        k=k,
        v=v,
        qv=qv,
        rotary_cos=rotary_cos,
        rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens,
        cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad,
        page_table=page_table,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new,
        max_seqlen_q=max_seqlen_q,
        rotary_seqlens=rotary_seqlens,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        attention_chunk=attention_chunk,
        softcap=softcap,
        rotary_interleaved=rotary_interleaved,
        num_splits=num_splits,
        only_qv=only_qv,
        sinks=sinks,
        out=out,
        ver=ver,
        return_softmax_lse=return_softmax_lse,
    )
    # not differentiable (as FA3's kvcache op): inputs that require grad are just read
    with torch.no_grad():
        append_kv(call)
        result, lse, out_accum, lse_accum = attend(call)
    if call.return_softmax_lse:
        return result, lse, out_accum, lse_accum
    return result


def attend(call: KVCacheCall):
    """Attention for every batch entry; returns ``(out, lse, out_accum, lse_accum)`` (see above)."""
    batch = call.batch_host  # the per-batch values as Python ints
    h, dv, device = call.num_heads, call.head_dim_v, call.v_cache.device
    n_splits = max(call.num_splits, 1)  # the reference's heuristic: one split
    total_q = call.total_q
    # Work in the varlen layout (rows = tokens); the batched layout is a reshape at the end.
    out_rows = torch.zeros(total_q, h, dv, dtype=torch.float32, device=device)
    lse_rows = torch.full(
        (h, total_q), float("inf") if call.empty_kv else float("-inf"), device=device
    )
    accum = torch.zeros(n_splits, total_q, h, dv, device=device) if n_splits > 1 else None
    lse_accum = (
        torch.full((n_splits, h, total_q), float("-inf"), device=device) if n_splits > 1 else None
    )
    row = 0
    for i in range(call.batch_size):
        rows = slice(row, row + batch.seqlens_q[i])
        row += batch.seqlens_q[i]
        if call.empty_kv or call.num_heads == 0:
            continue
        partials = _split_states(call, i, n_splits)
        _store_state(_merge_states(partials), rows, out_rows, lse_rows)
        if accum is not None:  # the split partials too
            for s, partial in enumerate(partials):
                _store_state(partial, rows, accum[s], lse_accum[s])
    return _to_caller_layout(call, out_rows, lse_rows, accum, lse_accum)


def _to_caller_layout(call: KVCacheCall, out_rows, lse_rows, accum, lse_accum):
    """Rows-first results -> ``(b, sq, ...)`` / ``(b, h, sq)`` unless the queries were packed; split
    partials ``(n, total_q, h, dv)`` -> ``(n, b, h, sq, dv)`` / ``(n, h, total_q, dv)``."""
    out_rows = out_rows.to(call.out_dtype)
    h, dv = call.num_heads, call.head_dim_v
    if accum is not None:
        accum = accum.transpose(1, 2).contiguous()  # (n, h, total_q, dv)
    if not call.varlen_q:
        b, sq = call.batch_size, call.q.shape[1]
        out_rows = out_rows.view(b, sq, h, dv)
        lse_rows = lse_rows.view(h, b, sq).transpose(0, 1).contiguous()
        if accum is not None:
            n = accum.shape[0]
            accum = accum.view(n, h, b, sq, dv).transpose(1, 2).contiguous()
            lse_accum = lse_accum.view(n, h, b, sq).transpose(1, 2).contiguous()
    if call.out is not None:
        call.out.copy_(out_rows)
        out_rows = call.out
    return out_rows, lse_rows, accum, lse_accum
