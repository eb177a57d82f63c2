"""Shared pieces of the tests of FA3's prefill entry points on both implementations
(:mod:`test_flash_attn_reference`, :mod:`test_flash_attn_kernels`): the mask and softcap options,
the head layouts, random problems, FA's random padding as ``cu_seqlens``, and the expected outputs
and gradients (float64 autograd of the dense formula :func:`attn_ref.dense.attention`, and FA's
low-precision baseline, the dense formula in the inputs' dtype).
"""

from __future__ import annotations

import torch

from attn_ref import dense

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
