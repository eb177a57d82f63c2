"""Argument validation for ``flash_attn_with_kvcache``, shared by the reference and the kernels.

Both :func:`attn_ref.flash_attn_with_kvcache` and :func:`kernels.flash_attn_with_kvcache` call
:func:`check_kvcache_args` first, so they raise the same errors in the same order, and nothing is
written into ``k_cache`` / ``v_cache`` before every check has passed.

Order of the checks: the body of :func:`check_kvcache_args` is the ordered list of its phases, each
a function that checks a few arguments and returns what the later ones need: sglang's own Python
checks first, verbatim and in sglang's order (sglang raises the two stride messages with
``assert``; here they are ``ValueError`` with the same text), then this package's checks of what
upstream leaves to C++ ``TORCH_CHECK`` s (``RuntimeError``) or to undefined behaviour: the static
checks, which read no tensor's values and are in this module, top to bottom in the order they run,
then the value checks, in :mod:`attn_ref.value_checks`. The small checks of one argument that the
phases share are in :mod:`attn_ref.argument_checks`; the checks of the memory the call writes in
:mod:`attn_ref.overlap`.

Compatibility rule (the drop-in rule): a call FA3 accepts is accepted here with the same result, and
what FA3 ignores in a configuration is ignored here too, without a check: ``rotary_seqlens`` and
``rotary_sin`` without ``rotary_cos``, ``v`` and ``cu_seqlens_k_new`` without ``k``, the fp8
descales for other dtypes. Option values get FA3's meaning: a negative window side is unbounded, a
window side at least as long as the static lengths is unbounded, ``attention_chunk`` goes through
``int()`` and ``<= 0`` is off, ``softcap <= 0`` (or NaN) is off and is used in float32, as FA3 does.

The result is a :class:`~attn_ref.call.KVCacheCall` (:mod:`attn_ref.call`): the resolved arguments
plus the per-batch values, a :class:`~attn_ref.call.BatchTable` of device tensors computed with
torch ops (:func:`~attn_ref.call.batch_table`, what the kernels read) and, after the value checks,
the same table as Python ints (what the reference loops over).

Notation used in shapes: ``b`` batch, ``sq`` query length, ``h`` query heads, ``h_k`` key/value
heads, ``d`` q/k head dim, ``dv`` v head dim, ``P`` page size.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import torch

from .argument_checks import (
    _check_descales,
    _flag,
    _float32,
    _refuse_fp8_qv,
    _require_base2_finite,
    _require_contiguous_last_dim,
    _require_cu_seqlens,
    _require_device,
    _require_dtype,
    _require_float,
    _require_float32_finite,
    _require_heads_divide,
    _require_int32_vector,
    _require_max_seqlen,
    _require_ndim,
    _require_real,
    _require_shape,
    _require_supported_dtype,
    _require_tensor,
)
from .call import MAX_NUM_SPLITS, KVCacheCall, output_dtype, resolve_call
from .layout_hint import check_heads_first
from .masks import AttentionMask
from .overlap import _all_offsets, _require_unshared, _require_writable, _storage_starts
from .sglang_checks import _sglang_caches, _sglang_q, _sglang_softmax_scale, _sglang_version
from .value_checks import check_kvcache_values

# --------------------------------------------------------------------------------------------------
# The check: the phases in their order, then the values derived from them.
# --------------------------------------------------------------------------------------------------


def check_kvcache_args(
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
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: Optional[int] = None,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    num_splits: int = 0,
    only_qv: bool = False,
    sinks: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    ver: int = 3,
    return_softmax_lse: bool = False,
    value_checks: bool = True,
) -> KVCacheCall:
    """Validate a ``flash_attn_with_kvcache`` call and resolve its arguments.

    Raises ``ValueError`` (``TypeError`` for a wrong Python type) before anything is written. The
    phases below run in their order: 0-1 sglang's, 2a this package's static checks, 2b the value
    checks (:mod:`attn_ref.value_checks`). Returns a :class:`KVCacheCall`.
    ``value_checks=False`` skips :func:`check_kvcache_values`: then no device value is read on the
    host, and the per-batch lists of the result are None.
    """
    # 0-1. sglang's checks, verbatim and in sglang's order.
    _sglang_version(ver)
    k_cache, only_qv = _sglang_caches(q, k_cache, v_cache, k, only_qv)
    q = _sglang_q(q, qv, k_cache, only_qv)
    softmax_scale = _sglang_softmax_scale(softmax_scale, q, qv, only_qv)
    # 2a. This package's static checks.
    _check_only_qv(only_qv, qv)
    _check_dtypes(q, k_cache, v_cache)
    layout = _check_shapes(
        q, k_cache, v_cache, page_table, cu_seqlens_q, max_seqlen_q, value_checks
    )
    cache_batch_idx = _check_cache_batch_idx(cache_batch_idx, layout)
    v, cu_seqlens_k_new = _check_new_kv(k, v, cu_seqlens_k_new, cache_seqlens, layout, value_checks)
    _check_cache_lengths(cache_seqlens, cache_leftpad, layout)
    _check_qv(qv, q, layout)
    mask = _normalise_masks(window_size, causal, attention_chunk, layout)
    rotary = _check_rotary(rotary_cos, rotary_sin, rotary_seqlens, k, mask, layout)
    descales = _check_descales(
        q_descale,
        k_descale,
        v_descale,
        layout.dtype,
        layout.batch,
        layout.num_heads_k,
        layout.device,
    )
    _check_sinks(sinks, layout)
    softmax_scale, softcap = _check_scalars(softmax_scale, softcap)
    num_splits = _check_num_splits(num_splits)
    _check_out(out, q, layout)
    arguments = dict(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        k=k,
        v=v,
        qv=qv,
        rotary_cos=rotary_cos,
        rotary_sin=rotary_sin,
        sinks=sinks,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
        out=out,
    )  # the tensors, for the memory the call writes
    _check_written_memory(arguments)
    rotary_interleaved, return_softmax_lse = _check_flags(rotary_interleaved, return_softmax_lse)
    # The derived values, in one place (attn_ref.call).
    call = resolve_call(
        arguments,
        page_table,
        layout,
        mask,
        rotary,
        descales,
        cu_seqlens_q=cu_seqlens_q,
        cache_batch_idx=cache_batch_idx,
        cu_seqlens_k_new=cu_seqlens_k_new,
        cache_seqlens=cache_seqlens,
        cache_leftpad=cache_leftpad,
        softmax_scale=softmax_scale,
        softcap=softcap,
        only_qv=only_qv,
        num_splits=num_splits,
        rotary_interleaved=rotary_interleaved,
        return_softmax_lse=return_softmax_lse,
    )
    # 2b. The value checks.
    if not value_checks:
        return call
    return check_kvcache_values(call, arguments, max_seqlen_q, layout.batch_k)


@dataclass(frozen=True)
class _Layout:
    """What the shapes of q, the caches and the page table fix (:func:`_check_shapes`); the later
    phases check the other arguments against it."""

    device: torch.device  # q's
    dtype: torch.dtype  # q's
    varlen_q: bool  # q packed as (total_q, h, d), with cu_seqlens_q
    seqlen_q: int  # the static query length: sq, or the max_seqlen_q argument for varlen q
    batch: int  # b
    num_heads: int  # h
    head_dim: int  # d
    num_heads_k: int  # h_k
    head_dim_v: int  # dv
    page_size: int  # P; 0 without a page table (with one, P >= 1)
    capacity: int  # tokens a cache sequence holds: seqlen_cache, or max_pages_per_seq * P
    batch_k: int  # the cache rows (or page-table rows) there are

    @property
    def paged(self) -> bool:
        """A page table is given (its page size was checked to be >= 1)."""
        return self.page_size > 0


class _Rotary(NamedTuple):
    """The rotary arguments the call reads (:func:`_check_rotary`)."""

    sin: Optional[torch.Tensor]  # rotary_sin, None without rotary_cos
    seqlens: Optional[torch.Tensor]  # rotary_seqlens, None without rotary_cos
    dim: int  # 2 * rotary_cos.shape[1]; 0 = no rotary
    q_fixed_position: bool  # every query row at rotary_starts[b] (FA3's FixedPosition), else + i


# ---- 2a. This package's static checks ------------------------------------------------------------
def _check_only_qv(only_qv: bool, qv) -> None:
    """``only_qv`` needs qv (caught here when a given softmax_scale skipped sglang's default-scale
    check)."""
    if only_qv and qv is None:
        raise ValueError(
            "only_qv=True computes the scores from qv alone, so qv must be given "
            "(softmax_scale was given, so sglang's default-scale check did not run)"
        )


def _check_dtypes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """q has a supported dtype; each cache is on q's device, has q's dtype and 4 dimensions."""
    _require_supported_dtype(q)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        _require_device(name, x, q.device)
        _require_dtype(name, x, q.dtype)
        _require_ndim(
            name, x, 4, "(batch_cache, seqlen_cache, h_k, dim) or (num_pages, P, h_k, dim)"
        )


def _check_shapes(
    q, k_cache, v_cache, page_table, cu_seqlens_q, max_seqlen_q, value_checks
) -> _Layout:
    """The layout of q (:func:`_check_queries`), then of the caches (:func:`_check_caches`)."""
    varlen_q, seqlen_q, batch = _check_queries(q, cu_seqlens_q, max_seqlen_q, value_checks)
    page_size, capacity, batch_k = _check_caches(q, k_cache, v_cache, page_table)
    return _Layout(
        device=q.device,
        dtype=q.dtype,
        varlen_q=varlen_q,
        seqlen_q=seqlen_q,
        batch=batch,
        num_heads=q.shape[-2],
        head_dim=q.shape[-1],
        num_heads_k=v_cache.shape[2],
        head_dim_v=v_cache.shape[3],
        page_size=page_size,
        capacity=capacity,
        batch_k=batch_k,
    )


def _check_queries(
    q: torch.Tensor, cu_seqlens_q, max_seqlen_q, value_checks: bool
) -> tuple[bool, int, int]:
    """q is ``(b, sq, h, d)``, or ``(total_q, h, d)`` with ``cu_seqlens_q`` (its offsets checked,
    see
    :func:`_require_cu_seqlens`) and ``max_seqlen_q``. Returns ``(varlen_q, sq or max_seqlen_q,
    b)``."""
    if cu_seqlens_q is None:
        _require_ndim("q", q, 4, "(batch, seqlen_q, h, d)")
        return False, q.shape[1], q.shape[0]
    _require_tensor("cu_seqlens_q", cu_seqlens_q)
    _require_device("cu_seqlens_q", cu_seqlens_q, q.device)
    static_sq = _require_max_seqlen("max_seqlen_q", max_seqlen_q, "cu_seqlens_q")
    _require_ndim("q", q, 3, "(total_q, h, d) when cu_seqlens_q is given")
    _require_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q.shape[0]", value_checks)
    return True, static_sq, cu_seqlens_q.shape[0] - 1


def _check_caches(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table
) -> tuple[int, int, int]:
    """The caches are ``(batch_cache, seqlen_cache, h_k, d|dv)``, or paged ``(num_pages, page_size,
    h_k, d|dv)`` with an int32 ``(batch_k, max_pages_per_seq)`` page table and ``page_size >= 1``;
    ``h_k`` divides ``h``. Returns ``(page_size or 0, capacity, batch_k)``."""
    num_heads, head_dim, num_heads_k = q.shape[-2], q.shape[-1], v_cache.shape[2]
    _require_shape(
        "k_cache", k_cache, (*v_cache.shape[:3], head_dim), "(matching v_cache, with q's head dim)"
    )
    if num_heads_k == 0 or num_heads % num_heads_k != 0:
        # the same rejection, with the fix when q looks (b, h, s, d)
        check_heads_first(q, k_cache, page_table)
    _require_heads_divide(num_heads, num_heads_k)
    if page_table is None:
        return 0, k_cache.shape[1], k_cache.shape[0]
    _require_tensor("page_table", page_table)
    _require_device("page_table", page_table, q.device)
    _require_dtype("page_table", page_table, torch.int32)
    _require_ndim("page_table", page_table, 2, "(batch_k, max_pages_per_seq)")
    page_size = k_cache.shape[1]
    if page_size == 0:
        raise ValueError(
            "with page_table, k_cache and v_cache must be (num_pages, page_size, h_k, dim) with "
            "page_size >= 1, got page_size 0"
        )
    return page_size, page_table.shape[1] * page_size, page_table.shape[0]


def _check_cache_batch_idx(cache_batch_idx, layout: _Layout):
    """Which cache row (or page-table row) serves each batch entry: without ``cache_batch_idx``
    there must be one per entry. FA3 reads the first b entries of ``cache_batch_idx`` (it checks
    neither its length nor its values): longer is fine, shorter is not. Returns those b entries (or
    None)."""
    batch, batch_k = layout.batch, layout.batch_k
    if cache_batch_idx is None:
        if batch_k != batch:
            what = "page_table.shape[0]" if layout.paged else "k_cache.shape[0]"
            raise ValueError(
                f"without cache_batch_idx, the batch size of q ({batch}) must equal {what} "
                f"({batch_k})"
            )
        return None
    _require_tensor("cache_batch_idx", cache_batch_idx)
    if cache_batch_idx.dim() == 1 and cache_batch_idx.shape[0] > batch:
        cache_batch_idx = cache_batch_idx[:batch]
    _require_int32_vector("cache_batch_idx", cache_batch_idx, batch, layout.device)
    return cache_batch_idx


def _check_new_kv(
    k, v, cu_seqlens_k_new, cache_seqlens, layout: _Layout, value_checks: bool
) -> tuple:
    """New keys/values: k ``(b, seqlen_new, h_k, d)`` and v ``(.., dv)``, or ``(total_k_new, h_k,
    ..)`` with ``cu_seqlens_k_new`` (its offsets checked, see :func:`_require_cu_seqlens`), and
    ``cache_seqlens`` to say where they go. FA3 ignores v and ``cu_seqlens_k_new`` without k.
    Returns ``(v, cu_seqlens_k_new)`` as the call reads them."""
    if k is None:
        return None, None
    if v is None:
        raise ValueError(
            "k and v must be given together (new keys and values to append), got only one"
        )
    for name, x, dim in (("k", k, layout.head_dim), ("v", v, layout.head_dim_v)):
        _require_tensor(name, x)
        _require_device(name, x, layout.device)
        _require_dtype(name, x, layout.dtype)
        if cu_seqlens_k_new is not None:
            _require_ndim(name, x, 3, "(total_k_new, h_k, dim) when cu_seqlens_k_new is given")
            _require_shape(
                name, x, (k.shape[0], layout.num_heads_k, dim), "(total_k_new, h_k, dim)"
            )
        else:
            _require_ndim(name, x, 4, "(batch, seqlen_new, h_k, dim)")
            _require_shape(
                name,
                x,
                (layout.batch, k.shape[1], layout.num_heads_k, dim),
                "(batch, seqlen_new, h_k, dim)",
            )
    if cache_seqlens is None:
        raise ValueError("cache_seqlens must be given when k and v are appended to the cache")
    if cu_seqlens_k_new is not None:
        _require_tensor("cu_seqlens_k_new", cu_seqlens_k_new)
        _require_device("cu_seqlens_k_new", cu_seqlens_k_new, layout.device)
        _require_cu_seqlens(
            "cu_seqlens_k_new", cu_seqlens_k_new, k.shape[0], "k.shape[0]", value_checks
        )
        _require_shape("cu_seqlens_k_new", cu_seqlens_k_new, (layout.batch + 1,), "(batch + 1,)")
    return v, cu_seqlens_k_new


def _check_cache_lengths(cache_seqlens, cache_leftpad, layout: _Layout) -> None:
    """``cache_seqlens`` (an int, not with varlen q) and ``cache_leftpad``: ``(b,)`` int32
    tensors."""
    if isinstance(cache_seqlens, int):
        if layout.varlen_q:
            raise ValueError(
                "cache_seqlens must be a (batch,) int32 tensor when cu_seqlens_q is given: sglang "
                "expands an int to q.shape[0] entries, which is total_q, not the batch size"
            )
    elif cache_seqlens is not None:
        _require_int32_vector("cache_seqlens", cache_seqlens, layout.batch, layout.device)
    _require_int32_vector("cache_leftpad", cache_leftpad, layout.batch, layout.device)


def _check_qv(qv, q: torch.Tensor, layout: _Layout) -> None:
    """qv (MLA): q's shape with v's head dim, ``(b, sq, h, dv)`` or ``(total_q, h, dv)``; not with
    fp8."""
    if qv is None:
        return
    _require_tensor("qv", qv)
    _require_device("qv", qv, layout.device)
    _refuse_fp8_qv(layout.dtype)
    _require_dtype("qv", qv, layout.dtype)
    _require_shape("qv", qv, (*q.shape[:-1], layout.head_dim_v), "(q's shape with v's head dim)")
    _require_contiguous_last_dim("qv", qv)


def _normalise_masks(window_size, causal, attention_chunk, layout: _Layout) -> AttentionMask:
    """The mask (:class:`~attn_ref.masks.AttentionMask`: window, causal, chunk, checked in that
    order), bounded by the static lengths as FA3 does: the cache capacity and sq (or the
    max_seqlen_q argument for varlen q)."""
    mask = AttentionMask(causal=causal, window_size=window_size, attention_chunk=attention_chunk)
    return mask.bounded(seqlen_q=layout.seqlen_q, seqlen_k=layout.capacity)


def _check_rotary(
    rotary_cos, rotary_sin, rotary_seqlens, k, mask: AttentionMask, layout: _Layout
) -> _Rotary:
    """Rotary embedding of the new keys (and of q): the cos/sin tables ``(seqlen_rotary, rotary_dim
    / 2)``, only with new keys, ``rotary_dim`` a multiple of 16 within the head dim, a paged cache's
    every position in the table (FA3's C++ check), ``rotary_seqlens`` ``(b,)`` int32. FA3 ignores
    rotary_sin and rotary_seqlens without rotary_cos. The queries' positions follow the masks:
    ``rotary_starts[b] + i`` in causal / local mode, else every row at ``rotary_starts[b]`` (FA3's
    FixedPosition)."""
    q_fixed = not mask.hides_keys
    if rotary_cos is None:
        return _Rotary(sin=None, seqlens=None, dim=0, q_fixed_position=q_fixed)
    if rotary_sin is None:
        raise ValueError("rotary_cos and rotary_sin must be given together, got only one")
    if k is None:
        raise ValueError(
            "If rotary cos/sin are provided, new key / value to be appended to KV cache must "
            "also be provided"
        )
    for name, x in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        _require_tensor(name, x)
        _require_device(name, x, layout.device)
        _require_float(name, x)
        _require_ndim(name, x, 2, "(seqlen_rotary, rotary_dim / 2)")
    _require_shape("rotary_sin", rotary_sin, tuple(rotary_cos.shape), "(same as rotary_cos)")
    rotary_dim, head_dim, capacity = 2 * rotary_cos.shape[1], layout.head_dim, layout.capacity
    if rotary_dim > head_dim or rotary_dim % 16 != 0:
        raise ValueError(
            f"rotary_dim = 2 * rotary_cos.shape[1] must be a multiple of 16 and <= the head "
            f"dim ({head_dim}), got {rotary_dim}"
        )
    if layout.paged and rotary_cos.shape[0] < capacity:
        raise ValueError(
            f"with page_table, rotary_cos must have at least max_pages_per_seq * page_size = "
            f"{capacity} rows, got {rotary_cos.shape[0]}"
        )
    _require_int32_vector("rotary_seqlens", rotary_seqlens, layout.batch, layout.device)
    return _Rotary(sin=rotary_sin, seqlens=rotary_seqlens, dim=rotary_dim, q_fixed_position=q_fixed)


def _check_sinks(sinks, layout: _Layout) -> None:
    """Attention sinks: one float logit per query head, ``(h,)``."""
    if sinks is None:
        return
    _require_tensor("sinks", sinks)
    _require_device("sinks", sinks, layout.device)
    _require_float("sinks", sinks)
    _require_shape("sinks", sinks, (layout.num_heads,), "(h,)")


def _check_scalars(softmax_scale, softcap) -> tuple[float, float]:
    """``softmax_scale`` and ``softcap`` reach FA3's kernels as float32: real numbers, finite there,
    and so is the base-2 logit factor FA3 makes of them (``softcap`` or ``softmax_scale`` times
    log2(e)); ``softcap <= 0`` (and NaN) is off. Returns them rounded to float32 (softcap 0 = off),
    the values FA3 computes with: the call record's, which the reference and the kernels use."""
    softmax_scale = _require_real("softmax_scale", softmax_scale)
    _require_float32_finite("softmax_scale", softmax_scale)
    # transformers' "off"; FA3's and sglang's ops reject None (a float argument)
    if softcap is None:
        raise TypeError(
            "softcap must be a real number, got None: softcap=0.0 turns softcapping off"
        )
    softcap = _require_real("softcap", softcap)
    softcap = 0.0 if math.isnan(softcap) or softcap <= 0 else softcap
    _require_float32_finite("softcap", softcap)
    if softcap > 0:
        _require_base2_finite("softcap", softcap)
    else:
        _require_base2_finite("softmax_scale", softmax_scale)
    return _float32(softmax_scale), _float32(softcap)


def _check_num_splits(num_splits) -> int:
    """An int at most :data:`MAX_NUM_SPLITS`. Returns it with every value <= 0 as 0 (the
    heuristic)."""
    if (
        isinstance(num_splits, bool)
        or not isinstance(num_splits, numbers.Integral)
        or num_splits > MAX_NUM_SPLITS
    ):
        raise ValueError(
            f"num_splits must be an int <= {MAX_NUM_SPLITS} (<= 0 = heuristic, 1 = no split), "
            f"got {num_splits!r}"
        )
    return max(int(num_splits), 0)


def _check_out(out, q: torch.Tensor, layout: _Layout) -> None:
    """A given ``out``: the output dtype (:func:`output_dtype`), q's shape with v's head dim, a
    contiguous last dimension."""
    if out is None:
        return
    _require_tensor("out", out)
    _require_device("out", out, layout.device)
    _require_dtype("out", out, output_dtype(layout.dtype))
    _require_shape("out", out, (*q.shape[:-1], layout.head_dim_v), "(q's shape with v's head dim)")
    _require_contiguous_last_dim("out", out)


def _check_written_memory(arguments: dict) -> None:
    """The memory the call writes: the caches when it appends (:func:`_require_writable`; where the
    appended slots lie needs the value checks, :func:`_check_writes_unshared`), and ``out``, which
    must not share memory with another argument. ``arguments``: the tensor arguments by name."""
    k, out = arguments["k"], arguments["out"]
    if k is not None and k.shape[:-2].numel() > 0:  # appending (KVCacheCall.appending)
        for name in ("k_cache", "v_cache"):
            _require_writable(name, arguments[name])
    if out is not None:
        _require_writable("out", out)
        _require_unshared("out", lambda: _all_offsets(out), arguments, _storage_starts(arguments))


def _check_flags(rotary_interleaved, return_softmax_lse) -> tuple[bool, bool]:
    """The two bool options read last (:func:`_flag`; ``return_softmax_lse=None`` is False)."""
    return (
        _flag("rotary_interleaved", rotary_interleaved),
        _flag("return_softmax_lse", return_softmax_lse, none_is_false=True),
    )
