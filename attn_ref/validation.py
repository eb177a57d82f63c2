"""Argument validation for ``flash_attn_with_kvcache``, shared by the reference and the kernels.

Both :func:`attn_ref.flash_attn_with_kvcache` and :func:`kernels.flash_attn_with_kvcache` call
:func:`check_kvcache_args` first, so they raise the same errors in the same order, and nothing is
written into ``k_cache`` / ``v_cache`` before every check has passed.

Order of the checks:

1. sglang's own Python checks, verbatim and in sglang's order (``v_cache must be provided``, the two
   ``contiguous last dimension`` checks, ``k_cache can only be None when only_qv=True``,
   ``q can only be None when only_qv=True``, ``q must be provided unless qv is provided with
   only_qv=True``, ``only_qv=True requires qv to be provided``), including sglang's placeholder
   ``k_cache`` / dummy ``q`` for ``only_qv`` and its default ``softmax_scale``. sglang raises the two
   stride messages with ``assert``; here they are ``ValueError`` with the same text.
2. This package's extra checks, for what upstream leaves to C++ ``TORCH_CHECK`` s (``RuntimeError``)
   or to undefined behaviour: types, dtypes, devices, shapes, head divisibility, index ranges, cache
   capacity, page size, rotary table length, qv/out strides, conflicting cache writes.

The result is a :class:`KVCacheCall`: the resolved arguments plus per-batch lengths as Python ints,
which is everything an implementation needs to compute the answer.

Notation used in shapes: ``b`` batch, ``sq`` query length, ``h`` query heads, ``h_k`` key/value heads,
``d`` q/k head dim, ``dv`` v head dim, ``P`` page size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .paged import flat_slot_index

#: Input dtypes both implementations accept (fp32 is an addition to upstream's fp16/bf16/fp8).
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)
#: Largest ``num_splits`` (FA3's limit).
MAX_NUM_SPLITS = 256


@dataclass
class KVCacheCall:
    """A validated ``flash_attn_with_kvcache`` call.

    Tensors are the caller's (``k_cache`` may be sglang's ``only_qv`` placeholder, ``q`` its dummy).
    Per-batch lists hold Python ints, one per batch entry ``i``:

    * ``seqlens_q[i]`` (``Sq_i``): query rows; ``q_starts[i]``: first row in varlen ``q`` (0 otherwise).
    * ``cache_rows[i]``: cache row (no page table) or page-table row used by batch ``i``.
    * ``cache_seqlens[i]`` (``C_i``): absolute end of the old tokens; new tokens are written there.
    * ``leftpads[i]`` (``L_i``): first valid cache position.
    * ``new_lens[i]`` (``N_i``) and ``new_starts[i]``: new k/v tokens and their first row in ``k``.
    * ``seqlens_k[i]`` (``Sk_i = C_i + N_i - L_i``): keys attended.
    * ``rotary_starts[i]`` (``P0_i``): rotary position of the first new key.
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
    seqlens_q: list[int]
    q_starts: list[int]
    cache_rows: list[int]
    cache_seqlens: list[int]
    leftpads: list[int]
    new_lens: list[int]
    new_starts: list[int]
    seqlens_k: list[int]
    rotary_starts: list[int]
    page_size: int
    capacity: int
    softmax_scale: float
    causal: bool
    window_size: tuple[int, int]
    attention_chunk: int
    softcap: float
    rotary_interleaved: bool
    rotary_dim: int
    rotary_q_fixed_position: bool
    only_qv: bool
    num_splits: int  # 0 = heuristic (any num_splits <= 0 given), 1 = no split, n > 1 = n splits
    empty_kv: bool

    @property
    def paged(self) -> bool:
        return self.page_table is not None

    @property
    def is_fp8(self) -> bool:
        return self.q.dtype == torch.float8_e4m3fn

    @property
    def out_dtype(self) -> torch.dtype:
        """Output dtype: q's dtype, or bf16 for fp8 inputs (as FA3)."""
        return torch.bfloat16 if self.is_fp8 else self.q.dtype

    @property
    def total_q(self) -> int:
        return sum(self.seqlens_q)

    @property
    def max_seqlen_q(self) -> int:
        return self.q.shape[0] if self.varlen_q else self.q.shape[1]


# --------------------------------------------------------------------------------------------------
# Small checks. Each raises one catalogued error; the argument name is part of the message.
# --------------------------------------------------------------------------------------------------


def _require_tensor(name: str, x: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def _require_contiguous_last_dim(name: str, x: torch.Tensor) -> None:
    # Same text as sglang's ``assert k_cache.stride(-1) == 1, "..."`` (and the v_cache one).
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must have contiguous last dimension")


def _require_ndim(name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}")


def _require_shape(name: str, x: torch.Tensor, shape: Sequence[int], layout: str) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} {layout}, got {tuple(x.shape)}")


def _require_dtype(name: str, x: torch.Tensor, dtype: torch.dtype) -> None:
    if x.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {x.dtype}")


def _require_float(name: str, x: torch.Tensor) -> None:
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name} must have a floating-point dtype, got {x.dtype}")


def _require_device(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{name} must be on the same device as q ({device}), got {x.device}")


def _require_cu_seqlens(name: str, cu: torch.Tensor, total: int, total_name: str) -> list[int]:
    """Check an int32 ``(b + 1,)`` offsets tensor: starts at 0, never decreases, ends at ``total``."""
    _require_dtype(name, cu, torch.int32)
    _require_ndim(name, cu, 1, "(batch + 1,) offsets")
    offsets = cu.tolist()
    monotone = all(a <= b for a, b in zip(offsets, offsets[1:]))
    if len(offsets) < 2 or offsets[0] != 0 or not monotone or offsets[-1] != total:
        raise ValueError(
            f"{name} must start at 0, never decrease and end at {total_name}={total}, got {offsets}"
        )
    return offsets


def _require_index_range(name: str, values: list[int], low: int, high: int) -> None:
    """Every value must lie in ``[low, high)``."""
    bad = [x for x in values if not low <= x < high]
    if bad:
        raise ValueError(f"{name} values must lie in [{low}, {high}), got {bad[:8]}")


def _optional_int32_vector(name: str, x, batch: int, device: torch.device) -> Optional[list[int]]:
    """An optional ``(b,)`` int32 tensor on q's device, returned as a list of ints."""
    if x is None:
        return None
    _require_tensor(name, x)
    _require_device(name, x, device)
    _require_dtype(name, x, torch.int32)
    _require_shape(name, x, (batch,), "(batch,)")
    return x.tolist()


def _window_pair(window_size) -> tuple[int, int]:
    try:
        left, right = int(window_size[0]), int(window_size[1])
        well_formed = len(window_size) == 2
    except (TypeError, ValueError, IndexError):
        well_formed = False
    if not well_formed or left < -1 or right < -1:
        raise ValueError(
            f"window_size must be two ints (left, right), each >= -1 (-1 = unbounded), "
            f"got {window_size!r}"
        )
    return left, right


# --------------------------------------------------------------------------------------------------
# The check.
# --------------------------------------------------------------------------------------------------


def check_kvcache_args(
    q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
    cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
    cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
    q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
    window_size=(-1, -1), attention_chunk=None, softcap=0.0, rotary_interleaved=True,
    num_splits=0, only_qv=False, sinks=None, out=None,
) -> KVCacheCall:
    """Validate a ``flash_attn_with_kvcache`` call and resolve its arguments.

    Raises ``ValueError`` (``TypeError`` for a wrong Python type) before anything is written.
    See the module docstring for the order. Returns a :class:`KVCacheCall`.
    """
    # ---- 1. sglang's checks, verbatim and in sglang's order ------------------------------------
    if v_cache is None:
        raise ValueError("v_cache must be provided")
    _require_tensor("v_cache", v_cache)
    _require_contiguous_last_dim("v_cache", v_cache)
    if k_cache is None:
        if not only_qv:
            raise ValueError("k_cache can only be None when only_qv=True")
        # sglang's placeholder: the only_qv path never reads K. Head size from q, else k, else 64.
        source = q if q is not None else k
        k_head_size = source.shape[-1] if source is not None else 64
        like = source if source is not None else v_cache
        k_cache = torch.empty((*v_cache.shape[:-1], k_head_size), dtype=like.dtype, device=like.device)
    _require_tensor("k_cache", k_cache)
    _require_contiguous_last_dim("k_cache", k_cache)
    if q is None:
        if not only_qv:
            raise ValueError("q can only be None when only_qv=True")
        if qv is None:
            raise ValueError("q must be provided unless qv is provided with only_qv=True")
        # sglang's dummy q: never read on the only_qv path; its head dim is k_cache's.
        q = torch.empty((*qv.shape[:-1], k_cache.shape[-1]), dtype=qv.dtype, device=qv.device)
    _require_tensor("q", q)
    if softmax_scale is None:
        if only_qv:
            if qv is None:
                raise ValueError("only_qv=True requires qv to be provided")
            softmax_scale = qv.shape[-1] ** (-0.5)
        else:
            softmax_scale = (q.shape[-1] + (qv.shape[-1] if qv is not None else 0)) ** (-0.5)

    # ---- 2. this package's checks ----------------------------------------------------------------
    if only_qv and qv is None:
        raise ValueError(
            "only_qv=True computes the scores from qv alone, so qv must be given "
            "(softmax_scale was given, so sglang's default-scale check did not run)"
        )
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"q must have dtype float16, bfloat16, float32 or float8_e4m3fn, got {q.dtype}"
        )
    device = q.device
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        _require_device(name, x, device)
        _require_dtype(name, x, q.dtype)
        _require_ndim(name, x, 4, "(batch_cache, seqlen_cache, h_k, dim) or (num_pages, P, h_k, dim)")

    # Queries: (b, sq, h, d), or (total_q, h, d) with cu_seqlens_q.
    varlen_q = cu_seqlens_q is not None
    if varlen_q:
        _require_tensor("cu_seqlens_q", cu_seqlens_q)
        _require_device("cu_seqlens_q", cu_seqlens_q, device)
        if max_seqlen_q is None:
            raise ValueError("max_seqlen_q must be provided if cu_seqlens_q is provided")
        _require_ndim("q", q, 3, "(total_q, h, d) when cu_seqlens_q is given")
        q_offsets = _require_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q.shape[0]")
        batch = len(q_offsets) - 1
        seqlens_q = [b - a for a, b in zip(q_offsets, q_offsets[1:])]
        q_starts = q_offsets[:-1]
        if max(seqlens_q, default=0) > int(max_seqlen_q):
            raise ValueError(
                f"max_seqlen_q={max_seqlen_q} is smaller than the longest sequence in "
                f"cu_seqlens_q ({max(seqlens_q)})"
            )
    else:
        _require_ndim("q", q, 4, "(batch, seqlen_q, h, d)")
        batch = q.shape[0]
        seqlens_q = [q.shape[1]] * batch
        q_starts = [0] * batch
    num_heads, head_dim = q.shape[-2], q.shape[-1]

    # Caches: (batch_cache, seqlen_cache, h_k, d|dv), or paged (num_pages, P, h_k, d|dv).
    num_heads_k, head_dim_v = v_cache.shape[2], v_cache.shape[3]
    _require_shape("k_cache", k_cache, (*v_cache.shape[:3], head_dim), "(matching v_cache, with q's head dim)")
    if num_heads_k == 0 or num_heads % num_heads_k != 0:
        raise ValueError(
            f"the number of key/value heads ({num_heads_k}) must divide the number of query "
            f"heads ({num_heads})"
        )
    if page_table is not None:
        _require_tensor("page_table", page_table)
        _require_device("page_table", page_table, device)
        _require_dtype("page_table", page_table, torch.int32)
        _require_ndim("page_table", page_table, 2, "(batch_k, max_pages_per_seq)")
        page_size = k_cache.shape[1]
        if page_size == 0:
            raise ValueError(
                "with page_table, k_cache and v_cache must be (num_pages, page_size, h_k, dim) with "
                "page_size >= 1, got page_size 0"
            )
        capacity = page_table.shape[1] * page_size
        batch_k = page_table.shape[0]
    else:
        page_size = 0
        capacity = k_cache.shape[1]
        batch_k = k_cache.shape[0]

    # Which cache row (or page-table row) serves each batch entry.
    cache_rows = _optional_int32_vector("cache_batch_idx", cache_batch_idx, batch, device)
    if cache_rows is None:
        if batch_k != batch:
            what = "page_table.shape[0]" if page_table is not None else "k_cache.shape[0]"
            raise ValueError(
                f"without cache_batch_idx, the batch size of q ({batch}) must equal {what} ({batch_k})"
            )
        cache_rows = list(range(batch))
    else:
        _require_index_range("cache_batch_idx", cache_rows, 0, batch_k)

    # New keys/values.
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (new keys and values to append), got only one")
    new_lens, new_starts = [0] * batch, [0] * batch
    if cu_seqlens_k_new is not None and k is None:
        raise ValueError("cu_seqlens_k_new describes packed k/v, but k and v were not given")
    if k is not None:
        for name, x, dim in (("k", k, head_dim), ("v", v, head_dim_v)):
            _require_tensor(name, x)
            _require_device(name, x, device)
            _require_dtype(name, x, q.dtype)
            if cu_seqlens_k_new is not None:
                _require_ndim(name, x, 3, "(total_k_new, h_k, dim) when cu_seqlens_k_new is given")
                _require_shape(name, x, (k.shape[0], num_heads_k, dim), "(total_k_new, h_k, dim)")
            else:
                _require_ndim(name, x, 4, "(batch, seqlen_new, h_k, dim)")
                _require_shape(name, x, (batch, k.shape[1], num_heads_k, dim), "(batch, seqlen_new, h_k, dim)")
        if cache_seqlens is None:
            raise ValueError("cache_seqlens must be given when k and v are appended to the cache")
        if cu_seqlens_k_new is not None:
            _require_tensor("cu_seqlens_k_new", cu_seqlens_k_new)
            _require_device("cu_seqlens_k_new", cu_seqlens_k_new, device)
            k_offsets = _require_cu_seqlens("cu_seqlens_k_new", cu_seqlens_k_new, k.shape[0], "k.shape[0]")
            _require_shape("cu_seqlens_k_new", cu_seqlens_k_new, (batch + 1,), "(batch + 1,)")
            new_lens = [b - a for a, b in zip(k_offsets, k_offsets[1:])]
            new_starts = k_offsets[:-1]
        else:
            new_lens = [k.shape[1]] * batch

    # Cache lengths and left padding.
    if isinstance(cache_seqlens, int):
        if varlen_q:
            raise ValueError(
                "cache_seqlens must be a (batch,) int32 tensor when cu_seqlens_q is given: sglang "
                "expands an int to q.shape[0] entries, which is total_q, not the batch size"
            )
        seqlens_c = [cache_seqlens] * batch
    elif cache_seqlens is None:
        seqlens_c = [capacity] * batch
    else:
        seqlens_c = _optional_int32_vector("cache_seqlens", cache_seqlens, batch, device)
    leftpads = _optional_int32_vector("cache_leftpad", cache_leftpad, batch, device) or [0] * batch
    for i in range(batch):
        if not 0 <= leftpads[i] <= seqlens_c[i]:
            raise ValueError(
                f"batch entry {i}: need 0 <= cache_leftpad <= cache_seqlens, got "
                f"cache_leftpad={leftpads[i]}, cache_seqlens={seqlens_c[i]}"
            )
        if seqlens_c[i] + new_lens[i] > capacity:
            raise ValueError(
                f"batch entry {i}: cache_seqlens ({seqlens_c[i]}) + new tokens ({new_lens[i]}) "
                f"exceeds the cache capacity ({capacity} tokens per sequence)"
            )
    seqlens_k = [c + n - lp for c, n, lp in zip(seqlens_c, new_lens, leftpads)]

    # Pages actually touched must exist; writes must not collide.
    if page_table is not None:
        rows = page_table.tolist()
        used = [p for i in range(batch)
                for p in rows[cache_rows[i]][: -(-(seqlens_c[i] + new_lens[i]) // page_size)]]
        _require_index_range("page_table", used, 0, k_cache.shape[0])
    if k is not None and sum(new_lens) > 0:
        # Two batch entries writing one cache slot would leave "any of the duplicates" (FA3 docs).
        written = torch.cat([
            flat_slot_index(k_cache, cache_rows[i], torch.arange(seqlens_c[i], seqlens_c[i] + new_lens[i]),
                            page_table.cpu() if page_table is not None else None)
            for i in range(batch)
        ])
        if written.unique().numel() != written.numel():
            raise ValueError(
                "two batch entries would write the same cache slot (duplicate cache_batch_idx "
                "rows or shared pages among the appended positions)"
            )

    # qv (MLA): (b, sq, h, dv) or (total_q, h, dv).
    if qv is not None:
        _require_tensor("qv", qv)
        _require_device("qv", qv, device)
        if q.dtype == torch.float8_e4m3fn:
            raise ValueError("qv is not supported with float8_e4m3fn inputs")
        _require_dtype("qv", qv, q.dtype)
        _require_shape("qv", qv, (*q.shape[:-1], head_dim_v), "(q's shape with v's head dim)")
        _require_contiguous_last_dim("qv", qv)

    # Rotary embedding of the new keys (and of q).
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together, got only one")
    rotary_dim = 0
    if rotary_seqlens is not None and rotary_cos is None:
        raise ValueError("rotary_seqlens was given without rotary_cos / rotary_sin")
    rotary_starts = _optional_int32_vector("rotary_seqlens", rotary_seqlens, batch, device) or seqlens_c
    window = _window_pair(window_size)
    if causal:
        window = (window[0], 0)
    chunk = 0 if attention_chunk is None else int(attention_chunk)
    if chunk < 0:
        raise ValueError(f"attention_chunk must be None or >= 0 (0 = off), got {attention_chunk!r}")
    # Rotary positions of q: P0 + i in causal/local mode, else every row at P0 (FA3's
    # FixedPosition). The mode is taken after FA3's window normalisation, which compares with the
    # static lengths (cache capacity; sq, or the max_seqlen_q argument for varlen q):
    # wl >= capacity - 1 -> unbounded, wr >= static_sq - 1 -> unbounded.
    static_sq = int(max_seqlen_q) if varlen_q else q.shape[1]
    local = (0 <= window[0] < capacity - 1) or (0 <= window[1] < static_sq - 1)
    q_fixed = not (causal or chunk > 0 or local)
    if rotary_cos is not None:
        if k is None:
            raise ValueError(
                "If rotary cos/sin are provided, new key / value to be appended to KV cache must "
                "also be provided"
            )
        for name, x in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            _require_tensor(name, x)
            _require_device(name, x, device)
            _require_float(name, x)
            _require_ndim(name, x, 2, "(seqlen_rotary, rotary_dim / 2)")
        _require_shape("rotary_sin", rotary_sin, tuple(rotary_cos.shape), "(same as rotary_cos)")
        rotary_dim = 2 * rotary_cos.shape[1]
        if rotary_dim > head_dim or rotary_dim % 16 != 0:
            raise ValueError(
                f"rotary_dim = 2 * rotary_cos.shape[1] must be a multiple of 16 and <= the head "
                f"dim ({head_dim}), got {rotary_dim}"
            )
        if page_table is not None and rotary_cos.shape[0] < capacity:
            # FA3's C++ check for paged caches: the table covers every position a sequence can hold.
            raise ValueError(
                f"with page_table, rotary_cos must have at least max_pages_per_seq * page_size = "
                f"{capacity} rows, got {rotary_cos.shape[0]}"
            )
        for i in range(batch):
            last_key = rotary_starts[i] + new_lens[i]
            last_q = rotary_starts[i] + (1 if q_fixed else seqlens_q[i])
            if max(last_key, last_q) > rotary_cos.shape[0]:
                raise ValueError(
                    f"batch entry {i}: rotary positions up to {max(last_key, last_q) - 1} are "
                    f"needed, but rotary_cos has only {rotary_cos.shape[0]} rows"
                )

    # FP8 descale factors: (b, h_k) float32, used only with fp8 inputs.
    if q.dtype == torch.float8_e4m3fn:
        for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
            if x is not None:
                _require_tensor(name, x)
                _require_device(name, x, device)
                _require_dtype(name, x, torch.float32)
                _require_shape(name, x, (batch, num_heads_k), "(batch, h_k)")

    if sinks is not None:
        _require_tensor("sinks", sinks)
        _require_device("sinks", sinks, device)
        _require_float("sinks", sinks)
        _require_shape("sinks", sinks, (num_heads,), "(h,)")
    if softcap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    if not isinstance(num_splits, int) or num_splits > MAX_NUM_SPLITS:
        raise ValueError(
            f"num_splits must be an int <= {MAX_NUM_SPLITS} (<= 0 = heuristic, 1 = no split), "
            f"got {num_splits!r}"
        )
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    if out is not None:
        _require_tensor("out", out)
        _require_device("out", out, device)
        _require_dtype("out", out, out_dtype)
        _require_shape("out", out, (*q.shape[:-1], head_dim_v), "(q's shape with v's head dim)")
        _require_contiguous_last_dim("out", out)

    # FA3 skips the kernel when q's batch x k_cache.shape[1] + new tokens == 0 ("zero-length KV":
    # out 0, lse +inf). With a page table shape[1] is the page size (>= 1), so paged KV is never empty.
    total_new = k.shape[:-2].numel() if k is not None else 0
    return KVCacheCall(
        q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, qv=qv,
        rotary_cos=rotary_cos, rotary_sin=rotary_sin, page_table=page_table,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, sinks=sinks, out=out,
        batch_size=batch, num_heads=num_heads, num_heads_k=num_heads_k,
        head_dim=head_dim, head_dim_v=head_dim_v, varlen_q=varlen_q,
        seqlens_q=seqlens_q, q_starts=q_starts, cache_rows=cache_rows, cache_seqlens=seqlens_c,
        leftpads=leftpads, new_lens=new_lens, new_starts=new_starts, seqlens_k=seqlens_k,
        rotary_starts=rotary_starts, page_size=page_size, capacity=capacity,
        softmax_scale=float(softmax_scale), causal=bool(causal), window_size=window,
        attention_chunk=chunk, softcap=float(softcap), rotary_interleaved=bool(rotary_interleaved),
        rotary_dim=rotary_dim, rotary_q_fixed_position=q_fixed, only_qv=bool(only_qv),
        num_splits=max(num_splits, 0), empty_kv=k_cache.shape[1] == 0 and total_new == 0,
    )
