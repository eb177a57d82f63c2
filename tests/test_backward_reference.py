"""The reference attention backward (:func:`attn_ref.attention_backward`) against autograd.

* ``gradcheck`` in float64: the backward, fed the saved ``out``/``lse`` of the float64 dense forward
  (the forward's oracle, :func:`attn_ref.dense.attention`), is the exact adjoint of that forward
  (finite differences), including the gradient of the LSE output (``dlse``), for every mask of
  :data:`backward_cases.MASKS` (full, bottom-right causal, sliding window, chunk, softcap), GQA,
  ``Sq <= Sk``.
* fp16/bf16/fp32 inputs, every mask: the gradients, in the input dtype, match float64 autograd of
  the dense forward by FlashAttention's rule (the low-precision baseline is autograd through the
  dense attention computed in the input dtype).
* Rows that see no key (causal, ``Sq > Sk``) get zero gradients, no NaN.
* Through the SP backend: :meth:`sp.AttentionBackend.attend` is differentiable, and a backend
  without a backward refuses it.
"""

from __future__ import annotations

import pytest
import torch

import attn_ref
from attn_ref import sequence_parallel as sp
from attn_ref.masks import CAUSAL, NO_MASK
from backward_cases import (
    MASKS,
    assert_backward_matches_float64,
    backward_keywords,
    dense_forward,
    saved_forward,
)


class _DenseWithReferenceBackward(torch.autograd.Function):
    """The float64 dense forward (the oracle) with :func:`attn_ref.attention_backward` as its
    backward."""

    @staticmethod
    def forward(ctx, q, k, v, scale, masks):
        out, lse = dense_forward(q, k, v, scale, upcast=False, **masks)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.masks = scale, masks
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        grads = attn_ref.attention_backward(
            dout, q, k, v, out, lse, ctx.scale, dlse=dlse, **backward_keywords(**ctx.masks)
        )
        return (*grads, None, None)


SHAPES = [  # (B, Sq, Sk, H, Hkv, D, Dv)
    (1, 3, 5, 4, 2, 3, 2),
    (2, 4, 4, 2, 2, 3, 3),
    (1, 1, 6, 3, 1, 4, 4),
]
#: (shape, masks): full and causal on every shape, every mask on a shape long enough for the window
#: (5, 3) and the chunk of 8 to hide keys.
GRADCHECK_CASES = [(shape, MASKS[name]) for shape in SHAPES for name in ("full", "causal")] + [
    ((1, 6, 11, 2, 1, 3, 2), masks) for masks in MASKS.values()
]


@pytest.mark.parametrize(
    "shape, masks",
    GRADCHECK_CASES,
    ids=[
        "x".join(map(str, shape)) + "-" + ("-".join(masks) or "full")
        for shape, masks in GRADCHECK_CASES
    ],
)
def test_gradcheck_float64(shape, masks):
    b, sq, sk, h, hkv, d, dv = shape
    gen = torch.Generator().manual_seed(sum(shape) + len(masks))
    q, k, v = (
        torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)
        for s in ((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, dv))
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: _DenseWithReferenceBackward.apply(q, k, v, 0.7, masks), (q, k, v)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("masks", MASKS.values(), ids=MASKS.keys())
def test_low_precision_matches_float64_autograd(dtype, masks):
    assert_backward_matches_float64(
        attn_ref.attention_backward, (2, 24, 40, 4, 2, 32), dtype, 7 + len(masks), **masks
    )


def test_rows_without_keys_get_zero_gradients():
    """Causal with ``Sq > Sk``: the first ``Sq - Sk`` rows see no key (``lse = -inf``)."""
    q, k, v, dout = (
        torch.randn(1, 6, 2, 8),
        torch.randn(1, 4, 2, 8),
        torch.randn(1, 4, 2, 8),
        torch.randn(1, 6, 2, 8),
    )
    out, lse = saved_forward(q, k, v, 0.5, causal=True)  # lse (b, h, s_q)
    assert torch.isinf(lse[..., :2]).all()
    dq, dk, dv = attn_ref.attention_backward(dout, q, k, v, out, lse, 0.5, CAUSAL)
    assert torch.equal(dq[:, :2], torch.zeros_like(dq[:, :2]))
    # the other rows: as for the same problem without the empty rows
    dq_rest, dk_rest, dv_rest = attn_ref.attention_backward(
        dout[:, 2:], q[:, 2:], k, v, out[:, 2:], lse[..., 2:], 0.5, CAUSAL
    )
    torch.testing.assert_close(dq[:, 2:], dq_rest)
    torch.testing.assert_close(dk, dk_rest)
    torch.testing.assert_close(dv, dv_rest)


def test_grad_dtype():
    q, k, v = (torch.randn(1, 4, 2, 8, dtype=torch.bfloat16) for _ in range(3))
    out, lse = saved_forward(q, k, v, 0.5)
    grads = attn_ref.attention_backward(
        torch.ones_like(out), q, k, v, out, lse, 0.5, grad_dtype=torch.float32
    )
    assert [g.dtype for g in grads] == [torch.float32] * 3


def test_backend_attend_is_differentiable():
    q, k, v = (torch.randn(2, 5, 4, 8, requires_grad=True) for _ in range(3))
    out, lse = sp.REFERENCE_BACKEND.attend(q, k, v, 0.3, CAUSAL)
    (out.sum() + lse.sum()).backward()
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out64, lse64 = dense_forward(*leaves, 0.3, upcast=False, causal=True)
    (out64.sum() + lse64.sum()).backward()
    for x, x64 in zip((q, k, v), leaves):
        torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1e-5, atol=1e-5)


def test_backend_without_backward_refuses_the_backward():
    forward_only = sp.AttentionBackend(
        "forward-only", attn_ref.flash_attn_with_kvcache, attn_ref.merge_attention_states
    )
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    out, _ = forward_only.attend(q, q, q, 0.5, NO_MASK)  # the forward works
    with pytest.raises(
        NotImplementedError, match=r"the 'forward-only' attention backend has no backward"
    ):
        out.sum().backward()
