"""KV append: write the new keys (rotated) and values into the cache, in place.

For batch entry ``i`` with ``s_new = new_lens[i]`` new tokens starting at absolute cache position
``cache_seqlens[i]``, and ``t in [0, s_new)``::

    K_cache(row, cache_seqlens[i] + t) = rot(k_new_i[t], rotary_starts[i] + t)
    V_cache(row, cache_seqlens[i] + t) = v_new_i[t]

(``rot`` is the identity without rotary tables, ``row`` the entry's cache row.) ``k_new_i[t]``
is ``k[i, t]`` or, packed with ``cu_seqlens_k_new``, ``k[new_starts[i] + t]``; ``rotary_starts[i]``
is ``rotary_seqlens[i]`` or ``cache_seqlens[i]``. Positions go through
:func:`kernels.paged.cache_slots`, so one kernel serves contiguous and paged caches. Without rotary
the values are copied bit for bit (no conversion); with rotary the rotation runs in fp32 and is
rounded once into the cache dtype.

Grid: ``(cdiv(T, BLOCK_T), b, h_k)``, ``T`` being k's token axis (``s_new``, or ``total_new`` when
packed: a static bound on every entry's ``s_new``; programs past it exit); a program moves
``BLOCK_T`` tokens of one KV head.
Mirrors :mod:`attn_ref.append` (``_append_kv_entry``: one batch entry; ``append_kv``: the loop over
entries, here the grid) with :mod:`attn_ref.paged` and :mod:`attn_ref.rotary`.

The same kernel backs the slots up (:func:`plan_slot_backup`, for :mod:`kernels.kvcache`'s
all-or-nothing call): with its runtime flag ``save`` at 1 it copies the slots
``cache_seqlens[i] + t`` out into buffers shaped as ``k`` / ``v``; run again on those buffers with
``save`` at 0 (no rotary), it writes them back.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from attn_ref.call import KVCacheCall

from .launch import Launch, explicit_rounding, next_power_of_2
from .numerics import store_as
from .paged import cache_slots
from .rotary import apply_rotary


def plan_append_kv(call: KVCacheCall) -> Launch | None:
    """The append launch for a validated call (None when there is nothing to append); the kernel
    reads the per-batch values from ``call.batch`` (``(b,)`` int32 tensors,
    :class:`attn_ref.call.BatchTable`).
    """
    if not call.appending:
        return None
    return _plan_slot_copy(call, call.k, call.v, call.rotary_cos is not None, save=0)


def plan_slot_backup(call: KVCacheCall) -> tuple[Launch, Launch] | None:
    """``(save, restore)`` for a call that appends (None otherwise): ``save`` copies the cache
    slots the append is about to overwrite into new buffers shaped as ``k`` and ``v`` (the cache's
    dtypes), ``restore`` writes them back, bit for bit. Both are the append kernel without rotary,
    its runtime ``save`` flag 1 or 0, on the same tensors: one compiled variant, so once ``save``
    has run, ``restore`` needs no compilation and no allocation (:mod:`kernels.kvcache` runs it
    when a launch after the first cache write fails).
    """
    if not call.appending:
        return None
    saved_k = torch.empty(call.k.shape, dtype=call.k_cache.dtype, device=call.k_cache.device)
    saved_v = torch.empty(call.v.shape, dtype=call.v_cache.dtype, device=call.v_cache.device)
    save = _plan_slot_copy(call, saved_k, saved_v, False, save=1)
    args = save.runtime_args()  # the dummy tensors too, allocated now
    save = dataclasses.replace(save, args=args)
    return save, dataclasses.replace(save, args={**args, "save": 0})


def _plan_slot_copy(call: KVCacheCall, k, v, rotary: bool, save: int) -> Launch:
    """The append kernel's launch moving tokens between ``k`` / ``v`` (``(b, s_new, h_k, dim)``, or
    ``(total_new, h_k, dim)`` packed) and the cache slots of the call's new tokens: into the slots
    (rotating the keys when ``rotary``), or out of them when ``save`` is 1."""
    kc, vc = call.k_cache, call.v_cache
    packed = k.dim() == 3  # (total_new, h_k, dim) with cu_seqlens_k_new
    k_strides = (0, *k.stride()[:2]) if packed else k.stride()[:3]
    v_strides = (0, *v.stride()[:2]) if packed else v.stride()[:3]
    block_t = 16 if call.head_dim > 128 else 32
    args = dict(
        k_ptr=k, v_ptr=v, k_cache_ptr=kc, v_cache_ptr=vc, page_table_ptr=call.page_table,
        rotary_tables=(call.rotary_cos, call.rotary_sin) if rotary else (None, None),
        batch_table=call.batch,
        stride_kb=k_strides[0], stride_kt=k_strides[1], stride_kh=k_strides[2],
        stride_vb=v_strides[0], stride_vt=v_strides[1], stride_vh=v_strides[2],
        stride_kc=tuple(kc.stride()[:3]), stride_vc=tuple(vc.stride()[:3]),
        stride_table=call.page_table.stride(0) if call.paged else 0,
        page_size=max(call.page_size, 1),
        stride_rotary=call.rotary_cos.stride(0) if rotary else 0,
        rotary_dim=call.rotary_dim if rotary else 0, save=save,
    )
    constexprs = dict(
        D=call.head_dim, DV=call.head_dim_v, BLOCK_T=block_t,
        BLOCK_D=next_power_of_2(call.head_dim), BLOCK_DV=next_power_of_2(call.head_dim_v),
        PAGED=call.paged, ROTARY=rotary,
        INTERLEAVED=rotary and call.rotary_interleaved,
        ROUND_TO=explicit_rounding(kc.dtype) if rotary else "none",
    )
    # Token blocks from k's token axis (a static bound on every s_new; programs past s_new exit
    # at once).
    new_tokens = k.shape[0] if packed else k.shape[1]
    grid = (triton.cdiv(new_tokens, block_t), call.batch_size, call.num_heads_k)
    return Launch(_append_kv_entry_kernel, grid, args, constexprs, num_warps=4, num_stages=1,
                  dummy_device=kc.device)


# No integer specialisation for the new tokens' strides, the small tables and the save flag (see
# kernels.attention): they stay parameters of their own; the groups hold pointers and cache strides.
@triton.jit(do_not_specialize=["stride_kb", "stride_kt", "stride_kh",
                               "stride_vb", "stride_vt", "stride_vh",
                               "stride_table", "page_size", "stride_rotary", "rotary_dim", "save"])
def _append_kv_entry_kernel(
    k_ptr,  # (b, s_new, h_k, d) or (total_new, h_k, d): new keys
    v_ptr,  # (b, s_new, h_k, dv) or (total_new, h_k, dv): new values
    k_cache_ptr,  # (b_cache, s_cache, h_k, d) or (num_pages, P, h_k, d)
    v_cache_ptr,  # (b_cache, s_cache, h_k, dv) or (num_pages, P, h_k, dv)
    page_table_ptr,  # (b, max_pages) int32 (PAGED only)
    rotary_tables,  # (cos_ptr, sin_ptr): (seqlen_rotary, rotary_dim / 2) each (ROTARY only)
    batch_table,  # attn_ref.call.BatchTable, (b,) int32 per entry i: new_lens (s_new), new_starts
    #               (first row in packed k/v, 0 when batched), cache_rows, cache_seqlens (where
    #               the new tokens start), rotary_starts
    stride_kb, stride_kt, stride_kh,  # k strides (stride_kb = 0 when packed)
    stride_vb, stride_vt, stride_vh,
    stride_kc, stride_vc,  # (major, minor, head): strides 0, 1, 2 of k_cache, v_cache
    stride_table,  # page_table.stride(0)
    page_size,  # P (PAGED only)
    stride_rotary,  # cos.stride(0)
    rotary_dim,  # channels rotated (ROTARY only)
    save,  # 1: copy the slots' contents into k / v instead (the backup, ROTARY off); else 0
    D: tl.constexpr, DV: tl.constexpr,  # head dims
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PAGED: tl.constexpr,
    ROTARY: tl.constexpr,  # rotate the new keys (rotary_dim channels)
    INTERLEAVED: tl.constexpr,
    ROUND_TO: tl.constexpr,  # interpreter + bf16/fp8 cache: round rotated keys explicitly
):
    pid_t, batch, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_new = tl.load(batch_table.new_lens + batch)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,) new-token index t
    token_ok = offs_t < n_new  # (BLOCK_T,)
    if pid_t * BLOCK_T < n_new:
        new_row = (tl.load(batch_table.new_starts + batch) + offs_t).to(tl.int64)  # (BLOCK_T,) k/v
        cache_row = tl.load(batch_table.cache_rows + batch)
        # (BLOCK_T,) cache_seqlens[i] + t
        positions = tl.load(batch_table.cache_seqlens + batch) + offs_t
        slots = cache_slots(positions, token_ok, cache_row, page_table_ptr, stride_table,
                            stride_kc[0], stride_kc[1], page_size, PAGED)  # (BLOCK_T,) int64
        v_slots = cache_slots(positions, token_ok, cache_row, page_table_ptr, stride_table,
                              stride_vc[0], stride_vc[1], page_size, PAGED)  # (BLOCK_T,) int64
        batch64, head64 = batch.to(tl.int64), head.to(tl.int64)

        # ---- keys: rotate (fp32, rounded once) or copy --------------------------------------
        offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
        k_mask = token_ok[:, None] & (offs_d[None, :] < D)  # (BLOCK_T, BLOCK_D)
        # (BLOCK_T, 1)
        k_rows = k_ptr + batch64 * stride_kb + new_row[:, None] * stride_kt + head64 * stride_kh
        # (BLOCK_T, BLOCK_D)
        k_dst = k_cache_ptr + slots[:, None] + head64 * stride_kc[2] + offs_d[None, :]
        if ROTARY:
            # (BLOCK_T,) rotary_starts[i] + t
            ro_positions = tl.load(batch_table.rotary_starts + batch) + offs_t
            cos_ptr, sin_ptr = rotary_tables
            k_new = apply_rotary(k_rows, offs_d, k_mask, ro_positions, cos_ptr, sin_ptr,
                                 stride_rotary, rotary_dim, INTERLEAVED)  # (BLOCK_T, BLOCK_D) fp32
            store_as(k_dst, k_new, k_mask, ROUND_TO)
        elif save == 0:
            tl.store(k_dst, tl.load(k_rows + offs_d[None, :], mask=k_mask), mask=k_mask)
        else:
            tl.store(k_rows + offs_d[None, :], tl.load(k_dst, mask=k_mask), mask=k_mask)

        # ---- values: copied as they are ------------------------------------------------------
        offs_dv = tl.arange(0, BLOCK_DV)  # (BLOCK_DV,)
        v_mask = token_ok[:, None] & (offs_dv[None, :] < DV)  # (BLOCK_T, BLOCK_DV)
        # (BLOCK_T, 1)
        v_rows = v_ptr + batch64 * stride_vb + new_row[:, None] * stride_vt + head64 * stride_vh
        # (BLOCK_T, BLOCK_DV)
        v_dst = v_cache_ptr + v_slots[:, None] + head64 * stride_vc[2] + offs_dv[None, :]
        if save == 0:
            tl.store(v_dst, tl.load(v_rows + offs_dv[None, :], mask=v_mask), mask=v_mask)
        else:
            tl.store(v_rows + offs_dv[None, :], tl.load(v_dst, mask=v_mask), mask=v_mask)
