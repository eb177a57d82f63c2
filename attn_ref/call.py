"""The record of a validated ``flash_attn_with_kvcache`` call, shared by the reference and the
kernels.

:func:`attn_ref.validation.check_kvcache_args` returns a :class:`KVCacheCall`: the resolved
arguments plus the per-batch values (lengths, offsets, cache rows) as one :class:`BatchTable` of
``(b,)`` device tensors, computed with torch ops (:func:`batch_table`, what the kernels read), and,
after the value checks, the same :class:`BatchTable` as Python ints (what the reference loops over).
Also here: the limits and constants both implementations use and the output dtype rule
(:func:`output_dtype`).
"""

from __future__ import annotations  # (BatchTable's methods return BatchTable)

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import torch

if TYPE_CHECKING:
    from .masks import AttentionMask
    from .validation import _Layout, _Rotary

#: Input dtypes both implementations accept (fp32 is an addition to upstream's fp16/bf16/fp8).
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)
#: Largest ``num_splits`` (FA3's limit); also the cap of the kernels' split heuristic.
MAX_NUM_SPLITS = 256
#: Integer options reach FA3's C++ as int64 (window sides, ``attention_chunk``).
INT64_MAX = 2**63 - 1
#: Largest finite float32: ``softmax_scale`` and ``softcap`` reach FA3's kernels as float32.
FLOAT32_MAX = 3.4028234663852886e38
#: ``|softmax_scale|`` above which (without softcap) the validation bounds the logits from the data.
LARGE_SCALE = 1e4


def output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the attention output for inputs of ``dtype``: the same, but bf16 for fp8 (as
    FA3)."""
    return torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype


class BatchTable(NamedTuple):
    """The per-batch values of a call, one entry per batch entry ``i``: ``(b,)`` int32 tensors on
    q's device (:func:`batch_table`; what the kernels read), or lists of Python ints
    (:meth:`tolist`; what the value checks and the reference read).

    * ``seqlens_q[i]`` (``s_q`` of entry ``i``): query rows; ``q_starts[i]``: first row in varlen
      ``q`` (0 otherwise).
    * ``cache_rows[i]``: cache row (no page table) or page-table row used by batch ``i``.
    * ``leftpads[i]``: first valid cache position.
    * ``seqlens_k[i]`` (``s_k = cache_seqlens[i] + new_lens[i] - leftpads[i]``): keys attended.
    * ``new_lens[i]`` (``s_new``), ``new_starts[i]``: new k/v tokens and their first row in ``k``.
    * ``cache_seqlens[i]``: absolute end of the old tokens; new tokens are written there.
    * ``rotary_starts[i]``: rotary position of the first new key.
    """

    seqlens_q: Any
    q_starts: Any
    cache_rows: Any
    leftpads: Any
    seqlens_k: Any
    new_lens: Any
    new_starts: Any
    cache_seqlens: Any
    rotary_starts: Any

    def tolist(self) -> BatchTable:
        """The values as lists of Python ints, read back to the host in one transfer."""
        return BatchTable(*torch.stack(tuple(self)).tolist())

    def int32(self) -> BatchTable:
        """The values as int32 tensors (an int ``cache_seqlens`` beyond int32 makes the table int64,
        which the value checks report; the kernels read int32 whether they ran or not)."""
        return BatchTable(*(x.to(torch.int32) for x in self))


@dataclass
class KVCacheCall:
    """A validated ``flash_attn_with_kvcache`` call.

    Tensors are the caller's (``k_cache`` may be sglang's ``only_qv`` placeholder, ``q`` its dummy).
    The per-batch values are ``batch``, a :class:`BatchTable` of ``(b,)`` tensors on q's device
    (:func:`batch_table`), and, once :func:`~attn_ref.value_checks.check_kvcache_values` has run,
    ``batch_host``, the same table as Python ints (``None`` when the value checks were skipped).
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k: Optional[torch.Tensor]
    v: Optional[torch.Tensor]
    qv: Optional[torch.Tensor]
    rotary_cos: Optional[torch.Tensor]
    rotary_sin: Optional[torch.Tensor]
    page_table: Optional[torch.Tensor]
    q_descale: Optional[torch.Tensor]
    k_descale: Optional[torch.Tensor]
    v_descale: Optional[torch.Tensor]
    sinks: Optional[torch.Tensor]
    out: Optional[torch.Tensor]
    batch_size: int
    num_heads: int
    num_heads_k: int
    head_dim: int
    head_dim_v: int
    varlen_q: bool
    # static bound on every entry's s_q: sq, or max_seqlen_q (at most total_q) for varlen q
    seqlen_q_bound: int
    batch: BatchTable
    page_size: int
    capacity: int
    softmax_scale: float  # the float32 value FA3 uses
    mask: AttentionMask  # FA3-normalised and bounded by the static lengths
    softcap: float  # 0 = off; else the float32 value FA3 uses
    rotary_interleaved: bool
    rotary_dim: int
    rotary_q_fixed_position: bool
    only_qv: bool
    num_splits: int  # 0 = heuristic (any num_splits <= 0 given), 1 = no split, n > 1 = n splits
    empty_kv: bool
    return_softmax_lse: bool
    batch_host: Optional[BatchTable] = None

    @property
    def paged(self) -> bool:
        return self.page_table is not None

    @property
    def is_fp8(self) -> bool:
        return self.q.dtype == torch.float8_e4m3fn

    @property
    def out_dtype(self) -> torch.dtype:
        """Output dtype: :func:`output_dtype` of q's dtype."""
        return output_dtype(self.q.dtype)

    @property
    def total_q(self) -> int:
        """Query rows: ``q.shape[0]`` packed, ``b · sq`` batched (``Σ seqlens_q`` once
        validated)."""
        return self.q.shape[0] if self.varlen_q else self.batch_size * self.q.shape[1]

    @property
    def appending(self) -> bool:
        """New tokens are written into the cache (``Σ new_lens > 0``: k's token count, once
        validated)."""
        return self.k is not None and self.k.shape[:-2].numel() > 0


def batch_table(
    batch,
    device,
    static_sq,
    cu_seqlens_q,
    cache_batch_idx,
    k,
    cu_seqlens_k_new,
    cache_seqlens,
    capacity,
    cache_leftpad,
    rotary_seqlens,
) -> BatchTable:
    """The per-batch values of a call, a :class:`BatchTable` of ``(b,)`` int32 tensors on ``device``
    (int64 for an int ``cache_seqlens`` beyond int32, which the value checks then report), from its
    statically checked arguments with torch ops only: no value is read on the host, and a typical
    decode call costs a handful of tiny device ops (the index tensors are int32 already).

    ``seqlens_q`` and the q starts from ``cu_seqlens_q`` (else ``sq``, 0); cache rows from
    ``cache_batch_idx`` (else ``i``); ``new_lens`` and the new starts from ``cu_seqlens_k_new``
    (else ``k.shape[1]``, 0; no ``k``: 0); ``cache_seqlens`` (an int: every entry; None: the
    capacity); ``leftpads`` from ``cache_leftpad`` (else 0); ``seqlens_k = cache_seqlens + new_lens
    - leftpads``; ``rotary_starts`` from ``rotary_seqlens`` (else ``cache_seqlens``)."""
    wide = isinstance(cache_seqlens, int) and not -(2**31) <= cache_seqlens < 2**31
    dtype = torch.int64 if wide else torch.int32
    zeros = torch.zeros(batch, dtype=dtype, device=device)

    def per_batch(x, default: int) -> torch.Tensor:  # (b,): x, or default in every entry
        if isinstance(x, torch.Tensor):
            return x.to(dtype)
        if default == 0:
            return zeros
        value = min(max(default, -INT64_MAX - 1), INT64_MAX)  # (an absurd int cache_seqlens)
        return torch.full((batch,), value, dtype=dtype, device=device)

    def lengths(cu, length: int):  # (lens, starts) of each entry, from offsets or a fixed length
        if cu is None:
            return per_batch(None, length), zeros
        cu = cu.to(dtype)
        return cu[1:] - cu[:-1], cu[:-1]

    seqlens_q, q_starts = lengths(cu_seqlens_q, static_sq)
    fixed_new = k.shape[1] if k is not None and k.dim() == 4 else 0
    new_lens, new_starts = lengths(cu_seqlens_k_new, fixed_new)
    if cache_batch_idx is None:
        cache_rows = torch.arange(batch, dtype=dtype, device=device)
    else:
        cache_rows = per_batch(cache_batch_idx, 0)
    if isinstance(cache_seqlens, torch.Tensor):
        ends = per_batch(cache_seqlens, 0)
    else:
        ends = per_batch(None, capacity if cache_seqlens is None else cache_seqlens)
    seqlens_k = ends + (new_lens if cu_seqlens_k_new is not None else fixed_new)
    leftpads = per_batch(cache_leftpad, 0)
    if cache_leftpad is not None:
        seqlens_k = seqlens_k - leftpads
    rotary_starts = per_batch(rotary_seqlens, 0) if rotary_seqlens is not None else ends
    return BatchTable(
        seqlens_q,
        q_starts,
        cache_rows,
        leftpads,
        seqlens_k,
        new_lens,
        new_starts,
        ends,
        rotary_starts,
    )


def resolve_call(
    arguments: dict,
    page_table,
    layout: _Layout,
    mask: AttentionMask,
    rotary: _Rotary,
    descales: tuple,
    *,
    cu_seqlens_q,
    cache_batch_idx,
    cu_seqlens_k_new,
    cache_seqlens,
    cache_leftpad,
    softmax_scale: float,
    softcap: float,
    only_qv: bool,
    num_splits: int,
    rotary_interleaved: bool,
    return_softmax_lse: bool,
) -> KVCacheCall:
    """The statically checked call as a :class:`KVCacheCall` (the last static phase of
    :func:`~attn_ref.validation.check_kvcache_args`), with the values derived from several
    arguments, computed here only: the per-batch table (:func:`batch_table`), the static bound on
    ``seqlens_q`` and whether the KV is empty. ``arguments``: the tensor arguments by name (v None
    without k)."""
    q, k, k_cache, rotary_cos = (
        arguments["q"],
        arguments["k"],
        arguments["k_cache"],
        arguments["rotary_cos"],
    )
    table = batch_table(
        layout.batch,
        layout.device,
        layout.seqlen_q,
        cu_seqlens_q,
        cache_batch_idx,
        k,
        cu_seqlens_k_new,
        cache_seqlens,
        layout.capacity,
        cache_leftpad,
        rotary.seqlens,
    )
    # FA3 skips the kernel when q's batch x k_cache.shape[1] + new tokens == 0 ("zero-length KV":
    # out 0, lse +inf). With a page table shape[1] is the page size (>= 1), so paged KV is never
    # empty.
    total_new = k.shape[:-2].numel() if k is not None else 0
    q_descale, k_descale, v_descale = descales
    return KVCacheCall(
        q=q,
        k_cache=k_cache,
        v_cache=arguments["v_cache"],
        k=k,
        v=arguments["v"],
        qv=arguments["qv"],
        rotary_cos=rotary_cos,
        rotary_sin=rotary.sin,
        page_table=page_table,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
        sinks=arguments["sinks"],
        out=arguments["out"],
        batch_size=layout.batch,
        num_heads=layout.num_heads,
        num_heads_k=layout.num_heads_k,
        head_dim=layout.head_dim,
        head_dim_v=layout.head_dim_v,
        varlen_q=layout.varlen_q,
        seqlen_q_bound=min(max(layout.seqlen_q, 0), q.shape[0])
        if layout.varlen_q
        else layout.seqlen_q,
        batch=table,
        page_size=layout.page_size,
        capacity=layout.capacity,
        softmax_scale=softmax_scale,
        mask=mask,
        softcap=softcap,
        rotary_interleaved=rotary_interleaved,
        rotary_dim=rotary.dim,
        rotary_q_fixed_position=rotary.q_fixed_position,
        only_qv=only_qv,
        return_softmax_lse=return_softmax_lse,
        num_splits=num_splits,
        empty_kv=k_cache.shape[1] == 0 and total_new == 0,
    )
