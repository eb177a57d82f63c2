"""A deliberately broken target for the prefill section: the reference's ``flash_attn_with_kvcache``
beside FA3's prefill functions with one bug each (the reference's functions after the bug).

``test_conformance_prefill.py`` runs the suite against it and checks that each bug fails the
features in :data:`CAUGHT_BY` and no other. :func:`backward_raises` and :func:`fa3_varlen_func` are
swapped in by the tests: a backward that raises, and the reference under FA3's narrower signature.
"""

import torch

import attn_ref
from attn_ref import flash_attn_with_kvcache  # noqa: F401 (the target the section sits beside)


def flash_attn_func(q, k, v, softmax_scale=None, *args, **kwargs):
    """The default scale is 1 / d instead of 1 / sqrt(d)."""
    scale = 1.0 / q.shape[-1] if softmax_scale is None else softmax_scale
    return attn_ref.flash_attn_func(q, k, v, scale, *args, **kwargs)


class _ScaledGradient(torch.autograd.Function):
    """The identity, whose backward multiplies the gradient by 1.5."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return 1.5 * grad


def flash_attn_varlen_func(q, k, *args, **kwargs):
    """Right values, but dk is 1.5 times too large."""
    return attn_ref.flash_attn_varlen_func(q, _ScaledGradient.apply(k), *args, **kwargs)


def flash_attn_qkvpacked_func(qkv, *args, **kwargs):
    """Right values, computed without autograd: the output does not require grad."""
    with torch.no_grad():
        return attn_ref.flash_attn_qkvpacked_func(qkv, *args, **kwargs)


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Right values, but a float64 ``out_dtype`` (which FA3 refuses) is computed."""
    if out_dtype == torch.float64:
        merged, lse = attn_ref.flash_attn_combine(out_partial, lse_partial)
        return merged.double(), lse
    return attn_ref.flash_attn_combine(out_partial, lse_partial, out, out_dtype)


#: The features each bug fails (every other prefill feature passes).
CAUGHT_BY = {
    flash_attn_func: (
        "prefill/func",
        "prefill/func_causal",
        "prefill/func_window",
        "prefill/func_chunk",
        "prefill/func_softcap",
        "prefill/func_gqa",
        "prefill/func_grads",
        "prefill/func_grads_masks",
        "prefill/func_grads_softcap",
        "prefill/func_grads_gqa",
        "prefill/func_grads_chunk",
    ),
    flash_attn_varlen_func: (
        "prefill/varlen_grads",
        "prefill/varlen_grads_causal",
        "prefill/varlen_grads_sinks",
    ),
    flash_attn_qkvpacked_func: ("prefill/qkvpacked_grads", "prefill/qkvpacked_grads_gqa"),
    flash_attn_combine: ("prefill/combine_errors", "prefill/combine_messages"),
}


class _NoBackward(torch.autograd.Function):
    """The identity, whose backward raises."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("this backward is not implemented")


def backward_raises(q, k, v, *args, **kwargs):
    """``flash_attn_func`` whose backward raises."""
    return attn_ref.flash_attn_func(_NoBackward.apply(q), k, v, *args, **kwargs)


def fa3_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    return_attn_probs=False,
):
    """The reference's ``flash_attn_varlen_func`` under a signature like FA3's: no ``sinks``, no
    ``return_softmax_lse``."""
    return attn_ref.flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q,
        seqused_k,
        softmax_scale,
        causal,
        return_attn_probs=return_attn_probs,
    )
