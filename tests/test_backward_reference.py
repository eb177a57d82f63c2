"""The reference attention backward (:func:`attn_ref.attention_backward`) against autograd.

* ``gradcheck`` in float64: the backward, fed the saved ``out``/``lse`` of a float64 dense forward,
  is the exact adjoint of that forward (finite differences), including the gradient of the LSE
  output (``dlse``), for causal (bottom-right) and full masks, GQA, ``Sq <= Sk``.
* fp16/bf16/fp32 inputs: the gradients, in the input dtype, match float64 autograd of the dense
  forward by FlashAttention's rule (the low-precision baseline is autograd through the dense
  attention computed in the input dtype).
* Rows that see no key (causal, ``Sq > Sk``) get zero gradients, no NaN.
* Through the SP backend: :meth:`AttentionBackend.attend` is differentiable, and a backend without a
  backward refuses it.
"""

from __future__ import annotations

import pytest
import torch

import attn_ref
from attn_ref import sequence_parallel as sp
from dense_oracle import dense_attention
from tolerance import assert_close_fa


def dense_attention_f64(q, k, v, scale, causal):
    """Differentiable dense attention in q's dtype: ``(out [B, Sq, H, Dv], lse [B, Sq, H])``.

    ``q [B, Sq, H, D]``, ``k [B, Sk, Hkv, D]``, ``v [B, Sk, Hkv, Dv]``; GQA by ``repeat_interleave``,
    bottom-right causal mask. Every row must see a key (``Sq <= Sk`` when causal).
    """
    g = q.shape[2] // k.shape[2]
    k_rep, v_rep = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k_rep) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        hidden = torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + sk - sq
        scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v_rep)
    return out, lse.transpose(1, 2)


class _DenseWithReferenceBackward(torch.autograd.Function):
    """The float64 dense forward with :func:`attn_ref.attention_backward` as its backward."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        out, lse = dense_attention_f64(q, k, v, scale, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.causal = scale, causal
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        return (*attn_ref.attention_backward(dout, q, k, v, out, lse, ctx.scale, ctx.causal, dlse), None, None)


SHAPES = [  # (B, Sq, Sk, H, Hkv, D, Dv)
    (1, 3, 5, 4, 2, 3, 2),
    (2, 4, 4, 2, 2, 3, 3),
    (1, 1, 6, 3, 1, 4, 4),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradcheck_float64(shape, causal):
    b, sq, sk, h, hkv, d, dv = shape
    gen = torch.Generator().manual_seed(sum(shape) + causal)
    q, k, v = (torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)
               for s in ((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, dv)))
    assert torch.autograd.gradcheck(lambda q, k, v: _DenseWithReferenceBackward.apply(q, k, v, 0.7, causal), (q, k, v))


def expected_gradients(q, k, v, dout, dlse, scale, causal):
    """``(float64 autograd gradients, FA's low-precision baseline)`` of ``Σ out·dout + Σ lse·dlse``.

    The baseline is autograd through :func:`dense_oracle.dense_attention` computed in q's dtype.
    """
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out64, lse64 = dense_attention_f64(*leaves, scale, causal)
    ref = torch.autograd.grad((out64 * dout.double()).sum() + (lse64 * dlse.double()).sum(), leaves)
    low = [x.clone().requires_grad_() for x in (q, k, v)]
    loss = 0
    for i in range(q.shape[0]):
        out, lse = dense_attention(low[0][i], low[1][i], low[2][i], scale, causal, upcast=False)
        loss = loss + (out.float() * dout[i].float()).sum() + (lse.T * dlse[i]).sum()
    return ref, torch.autograd.grad(loss, low)


def random_problem(shape, dtype, seed):
    """``q, k, v, dout`` in ``dtype`` and an fp32 ``dlse`` for ``shape = (B, Sq, Sk, H, Hkv, D)``."""
    b, sq, sk, h, hkv, d = shape
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, s, n, d, generator=gen).to(dtype) for s, n in ((sq, h), (sk, hkv), (sk, hkv)))
    return q, k, v, torch.randn(b, sq, h, d, generator=gen).to(dtype), torch.randn(b, sq, h, generator=gen)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_low_precision_matches_float64_autograd(dtype, causal):
    assert_backward_matches_float64(attn_ref.attention_backward, (2, 24, 40, 4, 2, 32), dtype, causal, 7 + causal)


def assert_backward_matches_float64(attention_backward, shape, dtype, causal, seed):
    """``attention_backward`` (either implementation) from the saved forward state: gradients in the
    input dtype, each within FA's rule of the float64 autograd gradient (``shape`` as random_problem)."""
    q, k, v, dout, dlse = random_problem(shape, dtype, seed)
    scale = q.shape[-1] ** -0.5
    out, lse = sp.REFERENCE_BACKEND.attend_forward(q, k, v, scale, causal)
    grads = attention_backward(dout, q, k, v, out, lse, scale, causal, dlse)
    ref, lowp = expected_gradients(q, k, v, dout, dlse, scale, causal)
    for name, grad, grad_ref, grad_lowp in zip("qkv", grads, ref, lowp):
        assert grad.dtype == dtype, name
        assert_close_fa(grad, grad_ref, grad_lowp)


def test_rows_without_keys_get_zero_gradients():
    """Causal with ``Sq > Sk``: the first ``Sq - Sk`` rows see no key (``lse = -inf``)."""
    q, k, v, dout = torch.randn(1, 6, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 6, 2, 8)
    out, lse = sp.REFERENCE_BACKEND.attend_forward(q, k, v, 0.5, True)
    assert torch.isinf(lse[:, :2]).all()
    dq, dk, dv = attn_ref.attention_backward(dout, q, k, v, out, lse, 0.5, True)
    assert torch.equal(dq[:, :2], torch.zeros_like(dq[:, :2]))
    # the other rows: as for the same problem without the empty rows
    dq_rest, dk_rest, dv_rest = attn_ref.attention_backward(dout[:, 2:], q[:, 2:], k, v, out[:, 2:], lse[:, 2:], 0.5, True)
    torch.testing.assert_close(dq[:, 2:], dq_rest)
    torch.testing.assert_close(dk, dk_rest)
    torch.testing.assert_close(dv, dv_rest)


def test_grad_dtype():
    q, k, v = (torch.randn(1, 4, 2, 8, dtype=torch.bfloat16) for _ in range(3))
    out, lse = sp.REFERENCE_BACKEND.attend_forward(q, k, v, 0.5, False)
    grads = attn_ref.attention_backward(torch.ones_like(out), q, k, v, out, lse, 0.5, grad_dtype=torch.float32)
    assert [g.dtype for g in grads] == [torch.float32] * 3


def test_backend_attend_is_differentiable():
    q, k, v = (torch.randn(2, 5, 4, 8, requires_grad=True) for _ in range(3))
    out, lse = sp.REFERENCE_BACKEND.attend(q, k, v, 0.3, True)
    (out.sum() + lse.sum()).backward()
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out64, lse64 = dense_attention_f64(*leaves, 0.3, True)
    (out64.sum() + lse64.sum()).backward()
    for x, x64 in zip((q, k, v), leaves):
        torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1e-5, atol=1e-5)


def test_backend_without_backward_refuses_the_backward():
    forward_only = sp.AttentionBackend("forward-only", attn_ref.flash_attn_with_kvcache, attn_ref.merge_attention_states)
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    out, _ = forward_only.attend(q, q, q, 0.5, False)  # the forward works
    with pytest.raises(NotImplementedError, match=r"the 'forward-only' attention backend has no backward"):
        out.sum().backward()
