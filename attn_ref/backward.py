"""Backward of attention from the saved output and log-sum-exp: the gradients of q, k and v.

The forward (:mod:`attn_ref.attention`) gives, per query row ``i`` and head ``h`` (served by key/value
head ``h // (H / H_k)``, GQA), ``ℓ_ij = scale · q_i·k_j`` (``-inf`` where key ``j`` is masked),
``lse_i = log Σ_j e^{ℓ_ij}`` and ``out_i = Σ_j P_ij v_j`` with ``P_ij = e^{ℓ_ij - lse_i}``. Given the
gradient ``dO`` of the output (and optionally ``dlse`` of the LSE), the chain rule through the
softmax gives (FlashAttention-2, Algorithm 2)::

    P_ij  = exp(ℓ_ij - lse_i)                 recomputed from q, k and the saved lse
    dV_j  = Σ_i P_ij dO_i
    dP_ij = dO_i · v_j
    D_i   = dO_i · out_i  (- dlse_i)          = Σ_j P_ij dP_ij: the row's "mean" of dP
    dS_ij = P_ij (dP_ij - D_i)                the gradient of the logit ℓ_ij
    dQ_i  = scale · Σ_j dS_ij k_j
    dK_j  = scale · Σ_i dS_ij q_i

GQA: ``dK``/``dV`` of a key/value head sum the contributions of all of its query heads.

**Why the saved lse makes block backward exact.** ``P_ij`` of any block of keys is
``e^{ℓ_ij - lse_i}`` with the row's *final* lse (after every merge), so the contribution of one key
block to ``dQ``, and that block's own ``dK``/``dV``, can be computed on their own: a ring or split-KV
backward is exact, not an approximation. The one row-level quantity is ``D_i``, which needs only the
final ``out_i`` and ``dO_i``.

``causal`` is bottom-right aligned as in the forward: row ``i`` sees keys ``j <= i + Sk - Sq``. A row
that sees no key (``lse = -inf``) has ``P = 0`` and gets zero gradients.

The arithmetic is fp32 for fp16/bf16/fp32 inputs (float64 for float64 inputs, so that
``torch.autograd.gradcheck`` can check it), with bounded memory: query rows are processed in chunks
as in the forward. :func:`kernels.backward.attention_backward` is the Triton twin (same signature).
"""

from __future__ import annotations

from typing import Optional

import torch

from .attention import MAX_SCORE_ELEMENTS
from .masks import visible_keys


def attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool = False,
    dlse: Optional[torch.Tensor] = None,
    grad_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k, v for attention of ``q`` over all of ``k``/``v`` (see the module docstring).

    Args:
        dout: ``[B, Sq, H, Dv]`` gradient of the output.
        q: ``[B, Sq, H, D]``; k: ``[B, Sk, Hkv, D]``; v: ``[B, Sk, Hkv, Dv]`` (``H % Hkv == 0``).
        out: ``[B, Sq, H, Dv]`` the forward's output; lse: ``[B, Sq, H]`` its natural-log LSE.
        softmax_scale: the forward's factor of ``q·k``.
        causal: bottom-right aligned causal mask (row ``i`` sees keys ``j <= i + Sk - Sq``).
        dlse: ``[B, Sq, H]`` gradient of the LSE, or None (no gradient flows into it).
        grad_dtype: dtype of the returned gradients; default each input's own dtype.

    Returns:
        ``(dq [B, Sq, H, D], dk [B, Sk, Hkv, D], dv [B, Sk, Hkv, Dv])``.
    """
    work = torch.promote_types(q.dtype, torch.float32)
    b, sq, h, d = q.shape
    sk, h_k, dv_dim = v.shape[1], v.shape[2], v.shape[3]
    g = h // h_k
    qf = q.to(work).view(b, sq, h_k, g, d)
    kf, vf = k.to(work), v.to(work)
    do = dout.to(work).view(b, sq, h_k, g, dv_dim)
    delta = (do * out.to(work).view(b, sq, h_k, g, dv_dim)).sum(-1)  # D_i: [B, Sq, Hkv, G]
    if dlse is not None:
        delta = delta - dlse.to(work).view(b, sq, h_k, g)
    lse_w = lse.to(work).view(b, sq, h_k, g)
    lse_w = torch.where(torch.isinf(lse_w), torch.zeros_like(lse_w), lse_w)  # no visible key: P = e^{-inf} = 0

    dq = torch.empty_like(qf)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    rows_per_chunk = max(1, MAX_SCORE_ELEMENTS // max(1, b * h * sk))
    for r0 in range(0, sq, rows_per_chunk):
        r1 = min(sq, r0 + rows_per_chunk)
        q_r, do_r = qf[:, r0:r1], do[:, r0:r1]
        # P_ij = exp(ℓ_ij - lse_i), [B, Hkv, G, rows, Sk]; 0 where masked
        logits = torch.einsum("brkgd,bnkd->bkgrn", q_r, kf).mul_(softmax_scale)
        visible = visible_keys(sq, sk, causal, device=q.device, row_start=r0, row_end=r1)
        logits.masked_fill_(~visible, float("-inf"))
        p = logits.sub_(lse_w[:, r0:r1].permute(0, 2, 3, 1)[..., None]).exp_()
        dv += torch.einsum("bkgrn,brkgd->bnkd", p, do_r)
        dp = torch.einsum("brkgd,bnkd->bkgrn", do_r, vf)
        ds = p.mul_(dp.sub_(delta[:, r0:r1].permute(0, 2, 3, 1)[..., None]))  # dS = P (dP - D), over p
        dq[:, r0:r1] = torch.einsum("bkgrn,bnkd->brkgd", ds, kf).mul_(softmax_scale)
        dk += torch.einsum("bkgrn,brkgd->bnkd", ds, q_r).mul_(softmax_scale)
    return (
        dq.view(b, sq, h, d).to(grad_dtype or q.dtype),
        dk.to(grad_dtype or k.dtype),
        dv.to(grad_dtype or v.dtype),
    )
