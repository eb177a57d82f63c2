"""Shared pieces of the backward tests (:mod:`test_backward_reference`,
:mod:`test_backward_kernels`).

The expected gradients are autograd through the forward's own oracle, the dense formula
:func:`attn_ref.dense.attention` (float64 for the reference gradient, the input dtype for
FlashAttention's low-precision baseline), so the backward is checked against the same dense
formulation as the forward, masks and softcap included.
"""

from __future__ import annotations

import torch

import attn_ref
from attn_ref import dense
from tolerance import assert_close_fa

#: The forward's options, masks and softcap, as the forward takes them (``backward_keywords`` turns
#: them into ``attention_backward``'s; every row of the problems below sees a key: ``Sq <= Sk``, the
#: diagonal inside every window and chunk).
MASKS = {
    "full": {},
    "causal": dict(causal=True),
    "window": dict(window_size=(5, 3)),
    "causal-window": dict(causal=True, window_size=(6, -1)),
    "chunk": dict(attention_chunk=8),
    "softcap": dict(softcap=1.5),
    "causal-softcap": dict(causal=True, softcap=3.0),
}


def backward_keywords(softcap=0.0, **mask_options) -> dict:
    """The forward's options as ``attention_backward``'s keywords: ``mask`` and ``softcap``."""
    return dict(mask=attn_ref.AttentionMask(**mask_options), softcap=softcap)


def dense_forward(
    q, k, v, scale, upcast=True, causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0
):
    """:func:`attn_ref.dense.attention` in the backward's layout: ``(out [b, s_q, h, d_v],
    lse [b, h, s_q])`` (FA's LSE layout, as ``attention_backward`` takes it).

    ``q [b, s_q, h, d]``, ``k [b, s_k, h_k, d]``, ``v [b, s_k, h_k, d_v]``; differentiable
    (``upcast=False`` computes in the inputs' dtype, float64 included). One sequence at a time, as
    the oracle attends: the same bits (a matmul batched over sequences may round differently).
    """
    states = [
        dense.attention(
            q[i : i + 1],
            k[i : i + 1],
            v[i : i + 1],
            scale,
            causal,
            window_size,
            attention_chunk,
            softcap,
            upcast=upcast,
        )
        for i in range(q.shape[0])
    ]
    out, lse = (torch.cat(parts) for parts in zip(*states))
    return out, lse


def random_problem(shape, dtype, seed):
    """``q, k, v, dout`` in ``dtype`` and an fp32 ``dlse [B, H, Sq]`` for
    ``shape = (B, Sq, Sk, H, Hkv, D)``."""
    b, sq, sk, h, hkv, d = shape
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(b, s, n, d, generator=gen).to(dtype) for s, n in ((sq, h), (sk, hkv), (sk, hkv))
    )
    dout = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    return q, k, v, dout, torch.randn(b, h, sq, generator=gen)


def saved_forward(q, k, v, scale, **masks):
    """``(out [B, Sq, H, Dv] in q's dtype, lse [B, H, Sq] fp32)``: the reference forward's outputs,
    as a training step saves them for the backward."""
    out, lse, *_ = attn_ref.flash_attn_with_kvcache(
        q, k, v, softmax_scale=scale, return_softmax_lse=True, **masks
    )
    return out, lse


def expected_gradients(q, k, v, dout, dlse, scale, **masks):
    """``(float64 autograd gradients, FA's low-precision baseline)`` of ``Σ out·dout + Σ lse·dlse``.

    Both are autograd through :func:`dense_forward`: in float64, and in q's dtype (the baseline).
    """
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out64, lse64 = dense_forward(*leaves, scale, upcast=False, **masks)
    ref = torch.autograd.grad((out64 * dout.double()).sum() + (lse64 * dlse.double()).sum(), leaves)
    low = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = dense_forward(*low, scale, upcast=False, **masks)
    loss = (out.float() * dout.float()).sum() + (lse.float() * dlse).sum()
    return ref, torch.autograd.grad(loss, low)


def assert_backward_matches_float64(attention_backward, shape, dtype, seed, **masks):
    """``attention_backward`` (either implementation) from the saved forward state: gradients in the
    input dtype, each within FA's rule of the float64 autograd gradient (``shape`` as
    random_problem)."""
    q, k, v, dout, dlse = random_problem(shape, dtype, seed)
    scale = q.shape[-1] ** -0.5
    out, lse = saved_forward(q, k, v, scale, **masks)
    grads = attention_backward(
        dout, q, k, v, out, lse, scale, dlse=dlse, **backward_keywords(**masks)
    )
    ref, lowp = expected_gradients(q, k, v, dout, dlse, scale, **masks)
    for name, grad, grad_ref, grad_lowp in zip("qkv", grads, ref, lowp):
        assert grad.dtype == dtype, name
        assert_close_fa(grad, grad_ref, grad_lowp)
