"""Random, valid calls of FA3's prefill functions: the case factory of the prefill section.

Each builder returns the keyword arguments of one call, named as FA3 names them (options left at
their defaults are left out), drawn on the CPU from ``seed`` and moved to ``device``. With
``grad=True`` the dict also holds ``dout``, the output's gradient for the backward (not an
argument of the function: :func:`gradients.gradient_call` takes it out).

Every row the suite compares sees at least one key: ``seqlen_q <= seqlen_k`` per sequence wherever
a mask is on (FA3's masks are bottom-right aligned, so row ``i`` sits at key ``i + s_k - s_q >=
0``, and every mask keeps a row's own position), and a sequence's used keys are at least its used
rows. (A row that sees no key has out 0 in FA3; its LSE is an implementation detail the suite does
not probe.)
"""

from __future__ import annotations

from typing import Optional

import torch

I32 = torch.int32


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal values drawn in fp32 on ``gen`` (CPU), then cast to ``dtype``."""
    return torch.randn(*shape, generator=gen).to(dtype)


def _ints(gen: torch.Generator, low: int, high: int) -> int:
    """One int uniform in ``[low, high]``."""
    return int(torch.randint(low, high + 1, (), generator=gen))


def _offsets(lengths: list[int]) -> torch.Tensor:
    """``cu_seqlens``: ``(b + 1,)`` int32, 0 then the running sums of ``lengths``."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=I32)


def _options(
    causal: bool,
    window: tuple[int, int],
    chunk: int,
    softcap: float,
    softmax_scale: Optional[float],
) -> dict:
    """The mask and score options of a call, those that differ from FA3's defaults."""
    options: dict = {}
    if softmax_scale is not None:
        options["softmax_scale"] = softmax_scale
    if causal:
        options["causal"] = True
    if tuple(window) != (-1, -1):
        options["window_size"] = tuple(window)
    if chunk:
        options["attention_chunk"] = chunk
    if softcap:
        options["softcap"] = softcap
    return options


def _on(args: dict, device: str) -> dict:
    return {
        key: val.to(device) if isinstance(val, torch.Tensor) else val for key, val in args.items()
    }


def func_case(
    *,
    batch: int = 2,
    seqlen_q: int = 4,
    seqlen_k: int = 6,
    heads: int = 2,
    heads_k: int = 2,
    d: int = 16,
    dv: Optional[int] = None,
    dtype: torch.dtype = torch.float32,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    chunk: int = 0,
    softcap: float = 0.0,
    softmax_scale: Optional[float] = None,
    grad: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> dict:
    """``flash_attn_func``: ``q (b, s_q, h, d)``, ``k (b, s_k, h_k, d)``, ``v (b, s_k, h_k, dv)``
    and the options; with ``grad``, ``dout (b, s_q, h, dv)``."""
    gen = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    args = dict(
        q=_randn(gen, batch, seqlen_q, heads, d, dtype=dtype),
        k=_randn(gen, batch, seqlen_k, heads_k, d, dtype=dtype),
        v=_randn(gen, batch, seqlen_k, heads_k, dv, dtype=dtype),
        **_options(causal, window, chunk, softcap, softmax_scale),
    )
    if grad:
        args["dout"] = _randn(gen, batch, seqlen_q, heads, dv, dtype=dtype)
    return _on(args, device)


def varlen_case(
    *,
    batch: int = 4,
    seqlen_q: int = 4,
    seqlen_k: int = 6,
    heads: int = 2,
    heads_k: int = 2,
    d: int = 16,
    dtype: torch.dtype = torch.float32,
    zero_length: bool = False,
    seqused: bool = False,
    causal: bool = False,
    sinks: bool = False,
    softmax_scale: Optional[float] = None,
    grad: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> dict:
    """``flash_attn_varlen_func``: ``batch`` packed sequences, ``q (total_q, h, d)``, ``k``/``v
    (total_k, h_k, d)``, ``cu_seqlens_q``/``cu_seqlens_k`` and the ``max_seqlen``\\ s.

    Lengths are drawn as FA's random padding draws them, near the maximum: queries in ``[max(1,
    seqlen_q // 2), seqlen_q]``, keys in ``[max(query length, seqlen_k // 2), max(seqlen_k, query
    length)]``. ``zero_length``: sequence 1 has no query and no key, sequence 2 keys but no
    query. ``seqused``: ``seqused_q`` / ``seqused_k`` with used rows in ``[0, length]`` (``[1,
    length]`` for sequence 0) and used keys in ``[used rows, length]``. ``sinks``: ``(h,)`` fp32
    sink logits. With ``grad``, ``dout (total_q, h, d)``.
    """
    gen = torch.Generator().manual_seed(seed)
    lengths_q = [_ints(gen, max(1, seqlen_q // 2), seqlen_q) for _ in range(batch)]
    lengths_k = [_ints(gen, max(n, seqlen_k // 2), max(seqlen_k, n)) for n in lengths_q]
    if zero_length:
        lengths_q[1], lengths_k[1] = 0, 0
        lengths_q[2] = 0
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    args: dict = dict(
        q=_randn(gen, total_q, heads, d, dtype=dtype),
        k=_randn(gen, total_k, heads_k, d, dtype=dtype),
        v=_randn(gen, total_k, heads_k, d, dtype=dtype),
        cu_seqlens_q=_offsets(lengths_q),
        cu_seqlens_k=_offsets(lengths_k),
        max_seqlen_q=max(lengths_q),
        max_seqlen_k=max(lengths_k),
    )
    if seqused:
        used_q = [_ints(gen, 1 if i == 0 else 0, n) for i, n in enumerate(lengths_q)]
        used_k = [_ints(gen, u, n) for u, n in zip(used_q, lengths_k)]
        args["seqused_q"] = torch.tensor(used_q, dtype=I32)
        args["seqused_k"] = torch.tensor(used_k, dtype=I32)
    args.update(_options(causal, (-1, -1), 0, 0.0, softmax_scale))
    if sinks:
        args["sinks"] = _randn(gen, heads, dtype=torch.float32)
    if grad:
        args["dout"] = _randn(gen, total_q, heads, d, dtype=dtype)
    return _on(args, device)


def qkvpacked_case(
    *,
    batch: int = 2,
    seqlen: int = 5,
    heads: int = 2,
    heads_k: Optional[int] = None,
    d: int = 16,
    dtype: torch.dtype = torch.float32,
    causal: bool = False,
    softcap: float = 0.0,
    grad: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> dict:
    """``flash_attn_qkvpacked_func``: ``qkv (b, s, 3, h, d)``, or with ``heads_k`` the 4-D ``qkv
    (b, s, h + 2 h_k, d)`` and ``num_heads_q = h``; with ``grad``, ``dout (b, s, h, d)``."""
    gen = torch.Generator().manual_seed(seed)
    if heads_k is None:
        args: dict = dict(qkv=_randn(gen, batch, seqlen, 3, heads, d, dtype=dtype))
    else:
        args = dict(
            qkv=_randn(gen, batch, seqlen, heads + 2 * heads_k, d, dtype=dtype), num_heads_q=heads
        )
    args.update(_options(causal, (-1, -1), 0, softcap, None))
    if grad:
        args["dout"] = _randn(gen, batch, seqlen, heads, d, dtype=dtype)
    return _on(args, device)


def combine_case(
    *,
    splits: int = 3,
    batch: int = 2,
    seqlen: int = 3,
    heads: int = 2,
    d: int = 16,
    dtype: torch.dtype = torch.float32,
    cast_out: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> dict:
    """``flash_attn_combine``: fp32 partial states ``out_partial (n, b, s, h, d)`` and
    ``lse_partial (n, b, s, h)`` in FA3's layout (a view of ``(n, b, h, s)`` memory, contiguous in
    the seqlen dimension), about a third of the partial LSEs ``-inf`` (splits that saw no key), but
    never all of a row's; ``cast_out``: ``out_dtype=dtype``."""
    gen = torch.Generator().manual_seed(seed)
    out_partial = _randn(gen, splits, batch, seqlen, heads, d, dtype=torch.float32)
    lse = 2 * _randn(gen, splits, batch, heads, seqlen, dtype=torch.float32)
    empty = torch.rand(splits, batch, heads, seqlen, generator=gen) < 1 / 3
    empty[0] &= empty[1:].all(0).logical_not()  # split 0 stays when every other split is empty
    lse = lse.masked_fill(empty, float("-inf"))
    args: dict = dict(out_partial=out_partial, lse_partial=lse.transpose(-1, -2))
    if cast_out:
        args["out_dtype"] = dtype
    return _on(args, device)
