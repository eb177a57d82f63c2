"""``flash_attn_with_kvcache`` on Triton kernels: a drop-in for
:func:`attn_ref.flash_attn_with_kvcache`.

The call runs the reference's steps (:mod:`attn_ref.kvcache`), each on a kernel:

1. :func:`attn_ref.validation.check_kvcache_args` validates the call (same errors, same order as
   the reference; nothing is launched or written if it raises). Its value checks, which read index
   tensors back to the host, are skipped under CUDA graph capture or when asked
   (:mod:`kernels.host_checks`); shape, dtype and device checks always run;
2. :mod:`kernels.append` writes the new keys (rotated) and values into the cache, in place;
3. :mod:`kernels.attention` computes every query row's attention over its valid keys, in
   ``num_splits`` key ranges (:func:`attn_ref.splits.split_bounds`) when ``n > 1``;
4. :mod:`kernels.merge` combines the ``n`` fp32 partial states through their LSE.

Results match the reference: ``out`` in q's dtype (bf16 for fp8), LSE fp32 ``(b, h, sq)`` / ``(h,
total_q)`` (natural log, ``-inf`` for rows that see no key, ``+inf`` everywhere for a zero-length
cache with nothing appended), and ``out_accum`` / ``softmax_lse_accum`` fp32 ``(n, b, h, sq, dv)`` /
``(n, b, h, sq)`` (packed: ``(n, h, total_q, dv)`` / ``(n, h, total_q)``) when ``n > 1`` splits ran,
else None. The one intended difference is ``num_splits=0``: the reference always takes one split,
the kernels choose ``n`` with :func:`kernels.splits.choose_num_splits` and return the partials
whenever that ``n`` is above 1.

**No host reads.** Per-batch lengths and offsets reach the kernels as ``(b,)`` int32 device tensors
(``call.batch``, the :class:`attn_ref.call.BatchTable` the reference reads as Python ints), computed
on the device from the index arguments with torch ops (:func:`attn_ref.call.batch_table`). The
launches are sized from shapes and static bounds only, as FA3's are: query tiles from ``sq``
(varlen: ``max_seqlen_q``, at most ``total_q``), append blocks from ``k``'s token axis, the
``num_splits=0`` heuristic from the cache capacity (not the actual longest sequence); programs past
a batch entry's rows, keys or new tokens exit at once. So without the value checks a call reads no
device value on the host and can be captured in a CUDA graph (and replayed with new
``cache_seqlens``, page table and tokens in the same tensors).

**All or nothing.** A call that raises leaves the caches bit for bit as they were. Everything that
can fail before a kernel runs (validation, every allocation: results, partials, the backup) happens
before the first cache write; after it, any failure (a compile error, out of memory, an interpreter
error, ``KeyboardInterrupt``) writes the overwritten slots back before it propagates
(:func:`_run_all_or_nothing`). The slots are copied out by a launch just before the append
(:func:`kernels.append.plan_slot_backup`), whose compiled variant also restores them. The other
design, attending the new tokens from ``k``/``v`` and writing the cache last, would move the append
into the attention kernel; this one keeps the kernels as they are for the price of one small copy
of the new tokens' slots. ``out`` (when given) may be partly written by a failed call. Under CUDA
graph capture nothing runs, so nothing is restored; an asynchronous device fault (an illegal
address) surfaces after the call and cannot be undone.

:func:`plan_kvcache` plans a validated call (the launches in order, the result tensors they fill,
the backup); :func:`attend` runs only the attention and combine of a call whose new tokens are
already in the cache.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional, Union

import torch

from attn_ref.call import KVCacheCall
from attn_ref.error_notes import catalogued
from attn_ref.validation import check_kvcache_args

from .append import plan_append_kv, plan_slot_backup
from .attention import plan_attention
from .host_checks import value_checks_enabled
from .launch import Launch, num_sms
from .merge import plan_merge
from .splits import attention_tiles, choose_num_splits


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

    Arguments, shapes and return values are those of :func:`attn_ref.flash_attn_with_kvcache`
    (sglang's API). ``num_splits``: 0 lets :func:`kernels.splits.choose_num_splits` decide, 1 never
    splits, ``n > 1`` runs ``n`` splits. ``pack_gqa``, ``scheduler_metadata``, ``sm_margin``,
    ``score_mod`` and ``aux_tensors`` are accepted and ignored (the kernels always pack the
    query heads of a KV head into one tile); ``ver`` must be 3, as in sglang. Under CUDA graph
    capture (or :func:`kernels.no_host_checks`, ``ATTN_REF_HOST_CHECKS=0``) the value checks are
    skipped and nothing is read back to the host (:mod:`kernels.host_checks`). A call that raises
    leaves ``k_cache`` and ``v_cache`` as they were, even when a launch fails after the append
    (:mod:`kernels.kvcache`, "All or nothing").
    """
    device = v_cache.device if isinstance(v_cache, torch.Tensor) else torch.device("cpu")
    call = check_kvcache_args(
        q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, qv=qv,
        rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
        page_table=page_table, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
        max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        attention_chunk=attention_chunk, softcap=softcap, rotary_interleaved=rotary_interleaved,
        num_splits=num_splits, only_qv=only_qv, sinks=sinks, out=out, ver=ver,
        return_softmax_lse=return_softmax_lse, value_checks=value_checks_enabled(device),
    )
    with torch.no_grad():  # not differentiable, as the reference
        plan = plan_kvcache(call)
        _run_all_or_nothing(plan)
    result, lse, out_accum, lse_accum = plan.results
    if call.return_softmax_lse:
        return result, lse, out_accum, lse_accum
    return result


class KVCachePlan(NamedTuple):
    """A planned call (:func:`plan_kvcache`): ``launches`` in order (append, attention, combine),
    the ``results`` ``(out, lse, out_accum, lse_accum)`` they fill, and, when the call appends,
    ``backup``: the ``(save, restore)`` launches of :func:`kernels.append.plan_slot_backup`."""

    launches: list[Launch]
    results: tuple
    backup: Optional[tuple[Launch, Launch]]


def plan_kvcache(call: KVCacheCall) -> KVCachePlan:
    """Plan a validated call: a :class:`KVCachePlan`, every tensor it needs allocated.

    ``tests/test_kernel_compile.py`` compiles these same launches for sm_90/sm_80.
    """
    call = _kernel_ready(call)
    append = plan_append_kv(call)
    launches, results = plan_attend(call)
    backup = plan_slot_backup(call)
    return KVCachePlan(([append] if append is not None else []) + launches, results, backup)


def _run_all_or_nothing(plan: KVCachePlan) -> None:
    """Run the planned launches; if one raises after the first cache write (anything, even
    ``KeyboardInterrupt``), write the saved slots back first (module docstring). The restore is the
    compiled variant ``save`` ran, on tensors allocated before it: it needs nothing that can fail
    for want of memory or a compiler."""
    if plan.backup is None:  # nothing is written into the cache
        for launch in plan.launches:
            launch.run()
        return
    save, restore = plan.backup
    save.run()
    try:
        for launch in plan.launches:
            launch.run()
    except BaseException as failure:
        device = restore.dummy_device  # the caches'
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            try:
                restore.run()
            except BaseException as restore_failure:
                failure.add_note(f"the KV cache could not be restored: {restore_failure!r}")
        raise


def attend(call: KVCacheCall):
    """Run the attention (and split combine) of a validated call whose new tokens are already in the
    cache: the device work after the append, without validation (:func:`flash_attn_with_kvcache`
    is itself capturable in a CUDA graph; this is its attention part alone).

    Example::

        call = attn_ref.check_kvcache_args(q, k_cache, v_cache, cache_seqlens=cache_seqlens)
        out, lse, out_accum, lse_accum = attend(call)

    Args:
        call: a validated call (:func:`attn_ref.check_kvcache_args`), with no new tokens to append
            or with them already written into the cache.

    Returns:
        ``(out, lse, out_accum, lse_accum)`` with the shapes and dtypes of
        :func:`flash_attn_with_kvcache` with ``return_softmax_lse=True``.
    """
    launches, results = plan_attend(_kernel_ready(call))
    for launch in launches:
        launch.run()
    return results


def plan_attend(call: KVCacheCall):
    """Attention launches and their result tensors ``(out, lse, out_accum, lse_accum)`` (module
    docstring)."""
    h, dv, device, total_q = call.num_heads, call.head_dim_v, call.v_cache.device, call.total_q
    group = call.num_heads // call.num_heads_k
    tiles = attention_tiles(group, call.seqlen_q_bound, call.head_dim, dv)
    no_work = call.empty_kv or h == 0  # (zero query heads: nothing to compute, G = 0)
    n = max(call.num_splits, 1) if no_work else call.num_splits or _heuristic_splits(call, tiles)

    # The validation guarantees a given `out` has the right shape, dtype and a contiguous last axis.
    out_shape = (*call.q.shape[:-1], dv)
    result = (call.out if call.out is not None
              else torch.empty(out_shape, dtype=call.out_dtype, device=device))
    lse = torch.empty((h, total_q) if call.varlen_q else (call.batch_size, h, call.q.shape[1]),
                      dtype=torch.float32, device=device)
    out_view, lse_view = _per_head_rows(call, result, lse)  # (A0, h, rows, dv), (A0, h, rows)
    accum = lse_accum = None
    if n > 1:  # the reference's layouts: (n, b, h, sq, dv) / (n, h, total_q, dv)
        accum = torch.empty((n, *lse.shape, dv), dtype=torch.float32, device=device)
        lse_accum = torch.empty((n, *lse.shape), dtype=torch.float32, device=device)
    results = (result, lse, accum, lse_accum)

    if call.empty_kv:  # a zero-length cache with nothing appended: FA3's (0, +inf), no kernel
        result.zero_()
        lse.fill_(float("inf"))
        if accum is not None:
            accum.zero_()
            lse_accum.fill_(float("-inf"))
        return [], results
    if total_q == 0 or h == 0:
        return [], results
    if n == 1:
        return [plan_attention(call, out_view[None], lse_view[None], 1, tiles)], results
    accum_view = accum if not call.varlen_q else accum[:, None]  # (n, A0, h, rows, dv)
    lse_accum_view = lse_accum if not call.varlen_q else lse_accum[:, None]  # (n, A0, h, rows)
    return [
        plan_attention(call, accum_view, lse_accum_view, n, tiles),
        plan_merge(accum_view[0], lse_accum_view[0], accum_view[1:], lse_accum_view[1:],
                   out_view, lse_view),
    ], results


def _heuristic_splits(call: KVCacheCall, tiles) -> int:
    """``num_splits=0``: :func:`kernels.splits.choose_num_splits` for this call's unsplit grid, with
    the cache capacity as the longest key range (a static bound: no host read)."""
    rows_per_tile = tiles.block_m // (call.num_heads // call.num_heads_k)
    m_blocks = -(-call.seqlen_q_bound // rows_per_tile)
    programs = call.batch_size * call.num_heads_k * m_blocks
    return choose_num_splits(programs, call.capacity, tiles.block_n, num_sms(call.v_cache.device))


def _per_head_rows(call: KVCacheCall, out: torch.Tensor, lse: torch.Tensor):
    """Views ``(A0, h, rows, dv)`` of ``out`` and ``(A0, h, rows)`` of ``lse``: ``A0 = b`` for
    batched queries (out is ``(b, sq, h, dv)``), 1 for packed ones (out ``(total_q, h, dv)``)."""
    if call.varlen_q:
        return out.permute(1, 0, 2)[None], lse[None]
    return out.permute(0, 2, 1, 3), lse


def _kernel_ready(call: KVCacheCall) -> KVCacheCall:
    """``call`` with the tensors the kernels read given a contiguous last axis (copies only if not),
    rotary tables and descales fully contiguous (they share one stride), the per-batch table int32
    (:meth:`attn_ref.call.BatchTable.int32`)."""
    def last_dim_contiguous(x):
        return x if x is None or x.stride(-1) == 1 else x.contiguous()

    def contiguous(x):
        return None if x is None else x.contiguous()

    return dataclasses.replace(
        call,
        q=last_dim_contiguous(call.q), k=last_dim_contiguous(call.k), v=last_dim_contiguous(call.v),
        qv=last_dim_contiguous(call.qv), page_table=last_dim_contiguous(call.page_table),
        rotary_cos=contiguous(call.rotary_cos), rotary_sin=contiguous(call.rotary_sin),
        q_descale=contiguous(call.q_descale), k_descale=contiguous(call.k_descale),
        v_descale=contiguous(call.v_descale), sinks=contiguous(call.sinks),
        batch=call.batch.int32(),
    )
