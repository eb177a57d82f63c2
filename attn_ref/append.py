"""KV append: write the new keys (rotated) and values into the cache, in place.

Batch entry ``i`` brings ``N_i`` new tokens (``k[i, :N_i]``, or rows ``new_starts[i] ...`` of packed
``k`` with ``cu_seqlens_k_new``). Token ``t`` goes to cache position ``C_i + t`` (``C_i`` =
``cache_seqlens[i]``) of the entry's cache row; its key is rotated first, at rotary position
``P0_i + t`` (``P0_i`` = ``rotary_seqlens[i]``, by default ``C_i``), when rotary tables are given.
:func:`attn_ref.paged.scatter_cache` does the writes, so contiguous and paged caches are one case,
and
:func:`attn_ref.rotary.apply_rotary` rotates in fp32, rounded once into the cache dtype.
Mirrored by :mod:`kernels.append`: one program per block of new tokens of one entry and one KV head.
"""

from __future__ import annotations

import torch

from .call import KVCacheCall
from .paged import scatter_cache
from .rotary import apply_rotary


def append_kv(call: KVCacheCall) -> None:
    """Write new tokens into the cache: ``K[C_i + t] = rot(k_i[t])``, ``V[C_i + t] = v_i[t]``.

    Does nothing without ``k``/``v``; entries with ``N_i = 0`` are skipped (the kernel's programs
    past ``N_i`` exit at once).
    """
    if call.k is None:
        return
    for i in range(call.batch_size):
        if call.batch_host.new_lens[i]:
            _append_kv_entry(call, i)


def _append_kv_entry(call: KVCacheCall, i: int) -> None:
    """Write the ``N_i`` new tokens of batch entry ``i``: ``k_new (N_i, h_k, d)``, ``v_new (N_i,
    h_k, dv)``."""
    batch = call.batch_host  # the per-batch values as Python ints
    n, start = batch.new_lens[i], batch.new_starts[i]  # start: 0 unless k/v are packed
    # (tokens, h_k, d / dv)
    k, v = (call.k, call.v) if call.k.dim() == 3 else (call.k[i], call.v[i])
    k_new, v_new = k[start : start + n], v[start : start + n]  # (N_i, h_k, d), (N_i, h_k, dv)
    positions = torch.arange(batch.cache_seqlens[i], batch.cache_seqlens[i] + n)  # (N_i,) C_i + t
    if call.rotary_dim:
        # (N_i,) P0_i + t
        ro_positions = torch.arange(batch.rotary_starts[i], batch.rotary_starts[i] + n)
        k_new = apply_rotary(
            k_new,
            call.rotary_cos,
            call.rotary_sin,
            ro_positions.to(k_new.device),
            call.rotary_interleaved,
        )  # (N_i, h_k, d) fp32
    scatter_cache(call.k_cache, batch.cache_rows[i], positions, k_new, call.page_table)
    scatter_cache(call.v_cache, batch.cache_rows[i], positions, v_new, call.page_table)
