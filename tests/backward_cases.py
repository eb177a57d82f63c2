"""Shared pieces of the backward tests (:mod:`test_backward_reference`, :mod:`test_backward_kernels`).

The expected gradients are autograd through the forward's own oracle, :func:`dense_oracle.dense_attention`
(float64 for the reference gradient, the input dtype for FlashAttention's low-precision baseline), so the
backward is checked against the same dense formulation as the forward, masks and softcap included.
"""

from __future__ import annotations

import torch

import attn_ref
from dense_oracle import dense_attention
from tolerance import assert_close_fa

#: The forward's masks and softcap, as keyword arguments of ``attention_backward`` (every row of the
#: problems below sees a key: ``Sq <= Sk``, the diagonal inside every window and chunk).
MASKS = {
    "full": {},
    "causal": dict(causal=True),
    "window": dict(window_size=(5, 3)),
    "causal-window": dict(causal=True, window_size=(6, -1)),
    "chunk": dict(attention_chunk=8),
    "softcap": dict(softcap=1.5),
    "causal-softcap": dict(causal=True, softcap=3.0),
}


def dense_forward(q, k, v, scale, upcast=True, causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0):
    """:func:`dense_oracle.dense_attention` over a batch: ``(out [B, Sq, H, Dv], lse [B, Sq, H])``.

    ``q [B, Sq, H, D]``, ``k [B, Sk, Hkv, D]``, ``v [B, Sk, Hkv, Dv]``; differentiable (``upcast=False``
    computes in the inputs' dtype, float64 included).
    """
    states = [dense_attention(q[i], k[i], v[i], scale, causal, window_size, attention_chunk, softcap, upcast=upcast)
              for i in range(q.shape[0])]
    return torch.stack([o for o, _ in states]), torch.stack([lse.T for _, lse in states])


def random_problem(shape, dtype, seed):
    """``q, k, v, dout`` in ``dtype`` and an fp32 ``dlse`` for ``shape = (B, Sq, Sk, H, Hkv, D)``."""
    b, sq, sk, h, hkv, d = shape
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, s, n, d, generator=gen).to(dtype) for s, n in ((sq, h), (sk, hkv), (sk, hkv)))
    return q, k, v, torch.randn(b, sq, h, d, generator=gen).to(dtype), torch.randn(b, sq, h, generator=gen)


def saved_forward(q, k, v, scale, **masks):
    """``(out [B, Sq, H, Dv] in q's dtype, lse [B, Sq, H] fp32)``: the reference forward's state, as a
    training step saves it for the backward."""
    out, lse, *_ = attn_ref.flash_attn_with_kvcache(q, k, v, softmax_scale=scale, return_softmax_lse=True, **masks)
    return out, lse.transpose(1, 2)


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
    input dtype, each within FA's rule of the float64 autograd gradient (``shape`` as random_problem)."""
    q, k, v, dout, dlse = random_problem(shape, dtype, seed)
    scale = q.shape[-1] ** -0.5
    out, lse = saved_forward(q, k, v, scale, **masks)
    grads = attention_backward(dout, q, k, v, out, lse, scale, dlse=dlse, **masks)
    ref, lowp = expected_gradients(q, k, v, dout, dlse, scale, **masks)
    for name, grad, grad_ref, grad_lowp in zip("qkv", grads, ref, lowp):
        assert grad.dtype == dtype, name
        assert_close_fa(grad, grad_ref, grad_lowp)
