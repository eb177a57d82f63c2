"""KV append: write the new keys (rotated) and values into the cache, in place.

Batch entry ``i`` brings ``s_new = new_lens[i]`` new tokens (``k[i, :s_new]``, or rows
``new_starts[i] ...`` of packed ``k`` with ``cu_seqlens_k_new``). Token ``t`` goes to cache position
``cache_seqlens[i] + t`` of the entry's cache row; its key is rotated first, at rotary position
``rotary_starts[i] + t`` (``rotary_seqlens[i]``, by default ``cache_seqlens[i]``), when rotary
tables are given.
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
    """Write new tokens into the cache: ``K[cache_seqlens[i] + t] = rot(k_i[t])``,
    ``V[cache_seqlens[i] + t] = v_i[t]``.

    Does nothing without ``k``/``v``; entries with ``s_new = 0`` are skipped (the kernel's programs
    past ``s_new`` exit at once).
    """
    if call.k is None:
        return
    for i in range(call.batch_size):
        if call.batch_host.new_lens[i]:
            _append_kv_entry(call, i)


def _append_kv_entry(call: KVCacheCall, i: int) -> None:
    """Write the ``s_new`` new tokens of batch entry ``i``: ``k_new (s_new, h_k, d)``, ``v_new
    (s_new, h_k, d_v)``."""
    batch = call.batch_host  # the per-batch values as Python ints
    n, start = batch.new_lens[i], batch.new_starts[i]  # start: 0 unless k/v are packed
    # (tokens, h_k, d / dv)
    k, v = (call.k, call.v) if call.k.dim() == 3 else (call.k[i], call.v[i])
    k_new, v_new = k[start : start + n], v[start : start + n]  # (s_new, h_k, d), (s_new, h_k, d_v)
    positions = torch.arange(batch.cache_seqlens[i], batch.cache_seqlens[i] + n)  # (s_new,)
    if call.rotary_dim:
        # (s_new,) rotary_starts[i] + t
        ro_positions = torch.arange(batch.rotary_starts[i], batch.rotary_starts[i] + n)
        k_new = apply_rotary(
            k_new,
            call.rotary_cos,
            call.rotary_sin,
            ro_positions.to(k_new.device),
            call.rotary_interleaved,
        )  # (s_new, h_k, d) fp32
    scatter_cache(call.k_cache, batch.cache_rows[i], positions, k_new, call.page_table)
    scatter_cache(call.v_cache, batch.cache_rows[i], positions, v_new, call.page_table)
