"""Shared pieces of the tests of FA3's prefill entry points on both implementations
(:mod:`test_flash_attn_reference`, :mod:`test_flash_attn_kernels`): the mask and softcap options,
the head layouts, random problems, FA's random padding as ``cu_seqlens``, and the expected outputs
and gradients (float64 autograd of the dense formula :func:`attn_ref.dense.attention`, and FA's
low-precision baseline, the dense formula in the inputs' dtype), and the fp8 calls with theirs
(:func:`fp8_problem`, :func:`check_fp8`: ``flash_attn_with_kvcache``'s oracle, which dequantizes).
"""

from __future__ import annotations

import torch

from attn_ref import dense
from dense_oracle import FP8, kvcache_oracle
from tolerance import assert_close_fa, assert_lse_close

I32 = torch.int32
#: the forward's mask and softcap options, one of each family
OPTIONS = {
    "full": {},
    "causal": dict(causal=True),
    "window": dict(window_size=(37, 11)),
    "causal-window": dict(causal=True, window_size=(20, -1)),
    "chunk": dict(attention_chunk=48),
    "softcap": dict(softcap=2.5),
}
#: ``(h, h_k)``: query heads and KV heads
HEADS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (3, 1)}


def dense_attention(q, k, v, upcast=True, sinks=None, **options):
    """``attn_ref.dense.attention`` one sequence at a time (as the oracle attends): ``(out (b, s_q,
    h, d_v), lse (b, h, s_q))``, differentiable."""
    states = [
        dense.attention(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], sinks=sinks, upcast=upcast, **options
        )
        for i in range(q.shape[0])
    ]
    return tuple(torch.cat(parts) for parts in zip(*states))


def random_problem(b, sq, sk, h, h_k, d, dv, dtype, seed):
    """``q (b, s_q, h, d)``, ``k (b, s_k, h_k, d)``, ``v (b, s_k, h_k, d_v)`` and ``dout (b, s_q,
    h, d_v)`` in ``dtype``, standard normal."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(*shape, generator=gen).to(dtype)
        for shape in ((b, sq, h, d), (b, sk, h_k, d), (b, sk, h_k, dv), (b, sq, h, dv))
    )


def expected(q, k, v, dout, dlse, sinks=None, **options):
    """``(out64, lse64, grads64, out_lowp, grads_lowp)`` of ``Σ out·dout + Σ lse·dlse`` (``-inf``
    LSEs left out): float64 autograd of the dense formula, and FA's low-precision baseline (the
    dense formula in q's dtype). With ``sinks (h,)`` the gradients end with the sinks' (the
    baseline's sinks in q's dtype)."""
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    leaves = [x.double().requires_grad_() for x in inputs]
    out64, lse64 = dense_attention(*leaves[:3], sinks=_sinks(leaves), **options)
    loss = (out64 * dout.double()).sum() + (lse64.nan_to_num(0, 0, 0) * dlse.double()).sum()
    grads64 = torch.autograd.grad(loss, leaves)
    low = [x.detach().to(q.dtype, copy=True).requires_grad_() for x in inputs]
    out_low, lse_low = dense_attention(*low[:3], sinks=_sinks(low), upcast=False, **options)
    loss = (out_low.float() * dout.float()).sum() + (
        lse_low.float().nan_to_num(0, 0, 0) * dlse
    ).sum()
    return out64, lse64, grads64, out_low, torch.autograd.grad(loss, low)


def _sinks(leaves):
    """The sinks among ``expected``'s leaves ``[q, k, v(, sinks)]``, or None."""
    return leaves[3] if len(leaves) == 4 else None


def padding_lengths(b, seqlen, gen, zero_lengths=False):
    """FA's ``generate_random_padding_mask`` (mode "random") as lengths: each in ``[max(1, seqlen -
    20), seqlen]``; with ``zero_lengths`` in ``[max(0, seqlen - 20), seqlen]``, and every fifth
    sequence (from the first) and the last empty."""
    low = max(0 if zero_lengths else 1, seqlen - 20)
    lengths = torch.randint(low, seqlen + 1, (b,), generator=gen)
    if zero_lengths:
        lengths[::5] = 0
        lengths[-1] = 0
    return lengths.tolist()


def cu_seqlens(lengths):
    """``(b + 1,)`` int32 offsets of sequences of ``lengths``: 0, then their running sum."""
    return torch.tensor([0] + lengths, dtype=I32).cumsum(0).to(I32)


#: fp8 calls: ``(lengths_q, lengths_k)`` of the packed sequences (an empty one, one with no key,
#: ``s_q > s_k``, ``s_q < s_k``), GQA heads ``(h, h_k)``, head dim
FP8_LENGTHS = ([5, 0, 3, 7], [9, 4, 0, 6])
FP8_HEADS, FP8_HEAD_DIM = (4, 2), 16


def fp8_problem(batched: bool, descales: bool, seed: int):
    """An fp8 call of both entry points: ``(args, oracle_args)``. ``args`` are the tensors of
    ``flash_attn_func`` (``batched``: ``q (4, 5, h, d)``, ``k``/``v (4, 9, h_k, d)``) or of
    ``flash_attn_varlen_func`` (packed :data:`FP8_LENGTHS`, with ``max_seqlen_q``,
    ``max_seqlen_k``), standard normal times 2 in float8_e4m3fn, with ``(b, h_k)`` fp32 descales
    in ``[0.25, 2)`` or none; ``oracle_args`` the same call as ``flash_attn_with_kvcache``'s
    (the keys as a cache of ``cache_seqlens`` tokens per sequence), for
    :func:`~dense_oracle.kvcache_oracle`."""
    gen = torch.Generator().manual_seed(seed)
    (h, h_k), d = FP8_HEADS, FP8_HEAD_DIM

    def randn(*shape):
        return (2 * torch.randn(*shape, generator=gen)).to(FP8)

    lengths_q, lengths_k = ([5] * 4, [9] * 4) if batched else FP8_LENGTHS
    b = len(lengths_q)
    scales = [0.25 + 1.75 * torch.rand(b, h_k, generator=gen) for _ in range(3)]
    scales = dict(zip(("q_descale", "k_descale", "v_descale"), scales if descales else [None] * 3))
    if batched:
        q, k, v = randn(b, 5, h, d), randn(b, 9, h_k, d), randn(b, 9, h_k, d)
        return dict(q=q, k=k, v=v, **scales), dict(q=q, k_cache=k, v_cache=v, **scales)
    q, k, v = (
        randn(sum(lengths_q), h, d),
        randn(sum(lengths_k), h_k, d),
        randn(sum(lengths_k), h_k, d),
    )
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    # the keys of sequence i in row i of a (b, max s_k) cache
    caches = [torch.zeros(b, max(lengths_k), h_k, d).to(FP8) for _ in range(2)]
    for i, (k0, n) in enumerate(zip(cu_k.tolist(), lengths_k)):
        caches[0][i, :n], caches[1][i, :n] = k[k0 : k0 + n], v[k0 : k0 + n]
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **scales)
    args.update(max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    oracle_args = dict(
        q=q,
        k_cache=caches[0],
        v_cache=caches[1],
        cache_seqlens=torch.tensor(lengths_k, dtype=I32),
        cu_seqlens_q=cu_q,
        max_seqlen_q=max(lengths_q),
        **scales,
    )
    return args, oracle_args


def check_fp8(api, batched: bool, descales: bool, causal: bool, seed: int = 0):
    """``api``'s fp8 forward (``flash_attn_func`` or, not ``batched``, ``flash_attn_varlen_func``)
    against the float64 dense attention of the dequantized inputs, by FA's fp8 rule (baseline:
    the same in bf16 with the probabilities rounded through fp8), the LSE tightly; ``out`` is
    bf16. Returns ``(out, lse)``."""
    args, oracle_args = fp8_problem(batched, descales, seed)
    if batched:
        out, lse = api.flash_attn_func(**args, causal=causal, return_attn_probs=True)
    else:
        out, lse = api.flash_attn_varlen_func(**args, causal=causal, return_attn_probs=True)
    ref = kvcache_oracle(**oracle_args, causal=causal)
    lowp = kvcache_oracle(**oracle_args, causal=causal, upcast=False)
    assert out.dtype == ref.out.dtype == torch.bfloat16
    assert_close_fa(out, ref.out, lowp.out, fp8=True)
    assert_lse_close(lse, ref.lse)
    return out, lse
