"""Random, valid ``flash_attn_with_kvcache`` calls: the one factory of the conformance suite's
cases, the tests' cases and the benchmarks' problems (:func:`benchmarks.problems.make_inputs`), so
that timed problems are tested ones.

:func:`make_case` returns the keyword arguments of one call, with every per-sequence length drawn at
random inside its legal range, the way FlashAttention's ``test_flash_attn_kvcache`` does
(``hopper/test_flash_attn.py``): ``cache_seqlens + new <= capacity``,
``0 <= cache_leftpad <= cache_seqlens``, pages shuffled with spare pages left unused, cache rows
picked from a larger cache with ``cache_batch_idx``.
The tests reach it through ``tests/kvcache_cases.py``, the benchmarks through
``benchmarks/calls.py``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal values drawn in fp32 on ``gen``'s device, then cast to ``dtype``."""
    return torch.randn(*shape, generator=gen, device=gen.device).to(dtype)


def _ints(gen: torch.Generator, low: int, high: int, n: int) -> list[int]:
    """``n`` ints uniform in ``[low, high]``."""
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


def _caches(
    gen: torch.Generator,
    values: torch.Generator,
    rows: int,
    capacity: int,
    page_size: Optional[int],
    heads_k: int,
    d: int,
    dv: int,
    dtype: torch.dtype,
) -> dict:
    """``k_cache (rows, capacity, h_k, d)`` and ``v_cache (..., dv)``, or with ``page_size``:
    ``(num_pages, page_size, h_k, ...)`` caches of shuffled pages (3 spare) and ``page_table (rows,
    capacity / page_size)``; the values drawn on ``values``, the page order on ``gen``."""
    found = {}
    if page_size is None:
        major = (rows, capacity)
    else:
        pages_per_seq = capacity // page_size
        num_pages = rows * pages_per_seq + 3
        order = torch.randperm(num_pages, generator=gen)[: rows * pages_per_seq]
        found["page_table"] = order.view(rows, pages_per_seq).to(torch.int32)
        major = (num_pages, page_size)
    found["k_cache"] = _randn(values, *major, heads_k, d, dtype=dtype)
    found["v_cache"] = _randn(values, *major, heads_k, dv, dtype=dtype)
    return found


def make_case(
    *,
    batch: int = 2,
    seqlen_q: int = 3,
    seqlen_new: Optional[int] = None,
    capacity: int = 12,
    heads: int = 4,
    heads_k: int = 2,
    d: int = 16,
    dv: Optional[int] = None,
    dtype: torch.dtype = torch.float32,
    page_size: Optional[int] = None,
    leftpad: bool = False,
    batch_idx: bool = False,
    varlen_q: bool = False,
    varlen_new: bool = False,
    rotary_dim: int = 0,
    rotary_interleaved: bool = True,
    rotary_seqlens: bool = False,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    chunk: Optional[int] = None,
    softcap: float = 0.0,
    sinks: bool = False,
    qv: bool = False,
    only_qv: bool = False,
    placeholders: bool = False,
    descale: bool = False,
    full_cache: bool = False,
    cached_tokens: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    seed: int = 0,
    device: str = "cpu",
) -> dict:
    """Keyword arguments of one valid call.

    ``seqlen_new=None``: no k/v to append; ``varlen_q`` / ``varlen_new``: packed layouts with random
    lengths in ``[0, seqlen_q]`` / ``[0, seqlen_new]``; ``page_size``: paged cache whose capacity is
    ``ceil(capacity / P) * P``; ``placeholders`` (with ``only_qv``): pass ``q=None, k_cache=None``;
    ``full_cache``: ``cache_seqlens`` left out (every sequence is the whole capacity, no append);
    ``cached_tokens``: every sequence holds that many cache tokens (drawn in the legal range
    otherwise). The tensors are made on ``device``; q, qv, the caches and k/v are drawn there (from
    a generator of their own off the CPU, so a CPU call draws everything from one stream).
    """
    gen = torch.Generator().manual_seed(seed)
    values = (
        gen
        if torch.device(device).type == "cpu"
        else torch.Generator(device=device).manual_seed(seed)
    )
    dv = d if dv is None else dv
    if page_size is not None:
        capacity = math.ceil(capacity / page_size) * page_size
    fp8 = dtype == torch.float8_e4m3fn

    seqlens_q = _ints(gen, 0, seqlen_q, batch) if varlen_q else [seqlen_q] * batch
    new = (
        None
        if seqlen_new is None
        else (_ints(gen, 0, seqlen_new, batch) if varlen_new else [seqlen_new] * batch)
    )
    if full_cache or cached_tokens is not None:
        cached = [capacity if cached_tokens is None else cached_tokens] * batch
    else:
        cached = [_ints(gen, 0, capacity - (n or 0), 1)[0] for n in (new or [0] * batch)]
    args: dict = dict(causal=causal, window_size=window, attention_chunk=chunk, softcap=softcap)
    if softmax_scale is not None:
        args["softmax_scale"] = softmax_scale
    if not full_cache:
        args["cache_seqlens"] = torch.tensor(cached, dtype=torch.int32)
    if leftpad:
        args["cache_leftpad"] = torch.tensor(
            [_ints(gen, 0, c, 1)[0] for c in cached], dtype=torch.int32
        )

    # Queries: (b, sq, h, d) or packed (total_q, h, d).
    q_shape = (sum(seqlens_q),) if varlen_q else (batch, seqlen_q)
    args["q"] = _randn(values, *q_shape, heads, d, dtype=dtype)
    if varlen_q:
        args["cu_seqlens_q"] = torch.tensor(
            [0, *torch.tensor(seqlens_q).cumsum(0).tolist()], dtype=torch.int32
        )
        args["max_seqlen_q"] = seqlen_q
    if qv or only_qv:
        args["qv"] = _randn(values, *q_shape, heads, dv, dtype=dtype)
    args["only_qv"] = only_qv

    # cache rows; with cache_batch_idx, half of them read
    rows_k = 2 * batch if batch_idx else batch
    if batch_idx:
        args["cache_batch_idx"] = torch.randperm(rows_k, generator=gen)[:batch].to(torch.int32)
    args.update(_caches(gen, values, rows_k, capacity, page_size, heads_k, d, dv, dtype))

    if new is not None:
        k_shape = (sum(new),) if varlen_new else (batch, seqlen_new)
        args["k"] = _randn(values, *k_shape, heads_k, d, dtype=dtype)
        args["v"] = _randn(values, *k_shape, heads_k, dv, dtype=dtype)
        if varlen_new:
            args["cu_seqlens_k_new"] = torch.tensor(
                [0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32
            )
    if rotary_dim:
        rows = 2 * capacity + seqlen_q + (seqlen_new or 0)
        angles = torch.rand(rows, rotary_dim // 2, generator=gen) * 2 * math.pi
        table_dtype = torch.float32 if fp8 else dtype
        args["rotary_cos"], args["rotary_sin"] = (
            angles.cos().to(table_dtype),
            angles.sin().to(table_dtype),
        )
        args["rotary_interleaved"] = rotary_interleaved
        if rotary_seqlens:
            args["rotary_seqlens"] = torch.tensor(_ints(gen, 0, capacity, batch), dtype=torch.int32)
    if sinks:
        args["sinks"] = _randn(gen, heads, dtype=torch.bfloat16)
    if descale and fp8:
        for name in ("q_descale", "k_descale", "v_descale"):
            args[name] = 0.5 + 1.5 * torch.rand(batch, heads_k, generator=gen)
    if placeholders:
        args["q"], args["k_cache"] = None, None
    return {
        key: val.to(device) if isinstance(val, torch.Tensor) else val for key, val in args.items()
    }


def clone_args(args: dict) -> dict:
    """A deep copy of the tensors (a call mutates the caches)."""
    return {key: val.clone() if isinstance(val, torch.Tensor) else val for key, val in args.items()}
