"""Random, valid ``flash_attn_with_kvcache`` inputs for tests (reference, oracle and kernels alike).

:func:`make_case` returns the keyword arguments of one call, with every per-sequence length drawn at
random inside its legal range, the way FlashAttention's ``test_flash_attn_kvcache`` does (section 4.4
of the spec): ``cache_seqlens + new <= capacity``, ``0 <= cache_leftpad <= cache_seqlens``, pages
shuffled with spare pages left unused, cache rows picked from a larger cache with ``cache_batch_idx``.

:data:`REF` and :data:`KERNELS` are the implementations a test takes as its parameter
(:class:`Implementation`: the function, its device, its shape multiplier); :func:`over` builds the
parameter lists; :func:`split_cases` is the table of split-KV calls, sized per implementation.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

import attn_ref
import kernels

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
#: fp8 e4m3 conversions need sm_89+ on a GPU (the interpreter has them).
HAS_FP8 = not ON_GPU or torch.cuda.get_device_capability() >= (8, 9)
FP8_SKIP = "fp8 e4m3 needs sm_89+ (this GPU has no fp8 conversion instructions)"


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype)


def _ints(gen: torch.Generator, low: int, high: int, n: int) -> list[int]:
    """``n`` ints uniform in ``[low, high]``."""
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


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
    softmax_scale: Optional[float] = None,
    seed: int = 0,
) -> dict:
    """Keyword arguments of one valid call.

    ``seqlen_new=None``: no k/v to append; ``varlen_q`` / ``varlen_new``: packed layouts with random
    lengths in ``[0, seqlen_q]`` / ``[0, seqlen_new]``; ``page_size``: paged cache whose capacity is
    ``ceil(capacity / P) * P``; ``placeholders`` (with ``only_qv``): pass ``q=None, k_cache=None``;
    ``full_cache``: ``cache_seqlens`` left out (every sequence is the whole capacity, no append).
    """
    gen = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    if page_size is not None:
        capacity = math.ceil(capacity / page_size) * page_size
    fp8 = dtype == torch.float8_e4m3fn

    seqlens_q = _ints(gen, 0, seqlen_q, batch) if varlen_q else [seqlen_q] * batch
    new = None if seqlen_new is None else (_ints(gen, 0, seqlen_new, batch) if varlen_new else [seqlen_new] * batch)
    cached = [capacity] * batch if full_cache else [
        _ints(gen, 0, capacity - (n or 0), 1)[0] for n in (new or [0] * batch)
    ]
    args: dict = dict(causal=causal, window_size=window, attention_chunk=chunk, softcap=softcap)
    if softmax_scale is not None:
        args["softmax_scale"] = softmax_scale
    if not full_cache:
        args["cache_seqlens"] = torch.tensor(cached, dtype=torch.int32)
    if leftpad:
        args["cache_leftpad"] = torch.tensor([_ints(gen, 0, c, 1)[0] for c in cached], dtype=torch.int32)

    # Queries: (b, sq, h, d) or packed (total_q, h, d).
    q_shape = (sum(seqlens_q),) if varlen_q else (batch, seqlen_q)
    args["q"] = _randn(gen, *q_shape, heads, d, dtype=dtype)
    if varlen_q:
        args["cu_seqlens_q"] = torch.tensor([0, *torch.tensor(seqlens_q).cumsum(0).tolist()], dtype=torch.int32)
        args["max_seqlen_q"] = seqlen_q
    if qv or only_qv:
        args["qv"] = _randn(gen, *q_shape, heads, dv, dtype=dtype)
    args["only_qv"] = only_qv

    # Cache: dense rows, or shuffled pages (some spare) addressed by a page table.
    rows_k = 2 * batch if batch_idx else batch
    if batch_idx:
        args["cache_batch_idx"] = torch.randperm(rows_k, generator=gen)[:batch].to(torch.int32)
    if page_size is None:
        major = (rows_k, capacity)
    else:
        pages_per_seq = capacity // page_size
        num_pages = rows_k * pages_per_seq + 3
        order = torch.randperm(num_pages, generator=gen)[: rows_k * pages_per_seq]
        args["page_table"] = order.view(rows_k, pages_per_seq).to(torch.int32)
        major = (num_pages, page_size)
    args["k_cache"] = _randn(gen, *major, heads_k, d, dtype=dtype)
    args["v_cache"] = _randn(gen, *major, heads_k, dv, dtype=dtype)

    if new is not None:
        k_shape = (sum(new),) if varlen_new else (batch, seqlen_new)
        args["k"] = _randn(gen, *k_shape, heads_k, d, dtype=dtype)
        args["v"] = _randn(gen, *k_shape, heads_k, dv, dtype=dtype)
        if varlen_new:
            args["cu_seqlens_k_new"] = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    if rotary_dim:
        rows = 2 * capacity + seqlen_q + (seqlen_new or 0)
        angles = torch.rand(rows, rotary_dim // 2, generator=gen) * 2 * math.pi
        table_dtype = torch.float32 if fp8 else dtype
        args["rotary_cos"], args["rotary_sin"] = angles.cos().to(table_dtype), angles.sin().to(table_dtype)
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
    return args


def clone_args(args: dict) -> dict:
    """A deep copy of the tensors (a call mutates the caches)."""
    return {key: val.clone() if isinstance(val, torch.Tensor) else val for key, val in args.items()}


def split_cases(keys: int) -> dict:
    """Calls to split over the keys, by id: ``keys`` is the cache capacity of the long ones (the
    kernels take 3x the reference's, for several key blocks per split); ``short_keys`` leaves some
    of three splits without a key."""
    return {
        "decode": dict(seqlen_q=1, capacity=2 * keys, seqlen_new=1),
        "causal_sinks": dict(seqlen_q=4, capacity=keys, causal=True, sinks=True),
        "window_varlen": dict(seqlen_q=4, capacity=keys, window=(3, 0), varlen_q=True, batch=3),
        "short_keys": dict(seqlen_q=2, capacity=3, sinks=True, batch=3),
    }


@dataclass(frozen=True)
class Implementation:
    """A ``flash_attn_with_kvcache`` under test: ``api`` is the package's function, run on ``device``;
    ``scale`` multiplies a case's ``capacity`` and ``seqlen_q`` (bigger grids and more key blocks
    where the kernels run compiled on a GPU)."""

    name: str
    api: Callable
    device: torch.device = torch.device("cpu")
    scale: int = 1

    def sized(self, case: dict) -> dict:
        """``case`` (keyword arguments of :func:`make_case`) with this implementation's sizes."""
        return {key: val * self.scale if key in ("capacity", "seqlen_q") else val for key, val in case.items()}

    def placed(self, args: dict) -> dict:
        """``args`` with its tensors on :attr:`device` (the same tensors where they are already)."""
        return {key: val.to(self.device) if isinstance(val, torch.Tensor) else val for key, val in args.items()}

    def fn(self, **args):
        """:attr:`api` on :attr:`device`; caches written back into ``args``' tensors, results returned
        on the CPU (so the CPU oracle can check every implementation)."""
        moved = self.placed(args)
        result = self.api(**moved)
        for name in ("k_cache", "v_cache"):
            if isinstance(args.get(name), torch.Tensor) and moved[name] is not args[name]:
                args[name].copy_(moved[name].cpu())
        if isinstance(result, tuple):
            return tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in result)
        return result.cpu()


REF = Implementation("ref", attn_ref.flash_attn_with_kvcache)
#: Compiled on a GPU with 8x the shapes; Triton's interpreter on the CPU otherwise.
KERNELS = Implementation("kernels", kernels.flash_attn_with_kvcache, DEVICE, scale=8 if ON_GPU else 1)
run_kernels = KERNELS.fn


def over(impls: list[Implementation], *axes: dict) -> list:
    """``pytest.param(impl, *values)`` for every implementation crossed with every combination of
    ``axes`` (each a dict from id to value), with ids like ``ref-fp16-none``; fp8 cases of an
    implementation on a GPU without fp8 are skipped."""
    params = []
    for impl in impls:
        for combo in itertools.product(*(axis.items() for axis in axes)):
            values = [val for _, val in combo]
            no_fp8 = impl.device.type == "cuda" and not HAS_FP8 and any(val is torch.float8_e4m3fn for val in values)
            params.append(pytest.param(impl, *values, id="-".join([impl.name, *(key for key, _ in combo)]),
                                       marks=[pytest.mark.skip(reason=FP8_SKIP)] if no_fp8 else []))
    return params
