"""Attention as one dense formula: the specification that the rest of the package optimises.

For query row ``i`` of a sequence, query head ``head`` (reading KV head ``kv_head = head // g``,
``g = h / h_k``: GQA) and key ``j``::

    s_ij  = q_i · k_j  (+ qv_i · v_j  when qv is given;  only qv_i · v_j  when q is None)
    ℓ_ij  = scale · s_ij                                 (softcap = 0)
          = softcap · tanh(scale · s_ij / softcap)       (softcap > 0, applied before masking)
    ℓ_ij  = -inf where key j is not visible to row i     (visible: causal, window, chunk)
    lse_i = log( Σ_j e^{ℓ_ij} + e^{sink_head} )          (sink_head: the head's sink logit, if any)
    out_i = Σ_j e^{ℓ_ij - lse_i} v_j

A row that sees no key (and has no sink) gives ``out = 0`` and ``lse = -inf``.

Everything is materialised: the mask as a matrix, the KV heads repeated for their query heads, the
``(b, h, s_q, s_k)`` logits. That makes it the specification and no implementation:
:mod:`attn_ref.attention` computes the same numbers tile by tile in bounded memory, the kernels
block by block, and the tests check both against this file. It shares no code with them (the
conformance oracle, :mod:`attn_ref.conformance.oracle`, is built on it and must stay independent of
what it checks) and runs no in-place operation, so ``torch.autograd`` differentiates it (the
backward tests' reference gradients).
"""

from __future__ import annotations

from typing import Optional

import torch


def visible(
    seqlen_q: int,
    seqlen_k: int,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: Optional[int] = 0,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """``(s_q, s_k)`` bool, True where query row ``i`` sees key ``j`` (FA3's masks).

    Bottom-right aligned: row ``i`` sits at key position ``pos = i + s_k - s_q`` (the last row is
    the last key). A key is visible when every mask that is on allows it:

    * window ``(left, right)``: ``pos - left <= j <= pos + right``; a side of -1 is unbounded;
    * causal: the window's right side is 0, so ``j <= pos`` (its left side stays);
    * chunk ``c > 0`` (None or 0: off): ``start <= j < start + c``, ``start = pos - (pos mod c)``,
      a floor modulo (right for the negative positions of rows that sit before the first key).
    """
    pos = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)  # (s_q, 1)
    j = torch.arange(seqlen_k, device=device)[None, :]  # (1, s_k)
    left, right = int(window_size[0]), 0 if causal else int(window_size[1])
    seen = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        seen = seen & (j >= pos - left)
    if right >= 0:
        seen = seen & (j <= pos + right)
    if attention_chunk and attention_chunk > 0:
        start = pos - pos % attention_chunk  # torch's % is a floor modulo
        seen = seen & (j >= start) & (j < start + attention_chunk)
    return seen


def attention(
    q: Optional[torch.Tensor],
    k: Optional[torch.Tensor],
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: Optional[int] = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    qv: Optional[torch.Tensor] = None,
    *,
    upcast: bool = True,
    p_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a batch of sequences of equal lengths, by the formula of the module docstring.

    Args:
        q: ``(b, s_q, h, d)`` queries, or None: the scores are then ``qv · v`` alone (``only_qv``).
        k: ``(b, s_k, h_k, d)`` keys (not read when ``q`` is None).
        v: ``(b, s_k, h_k, d_v)`` values.
        softmax_scale: ``scale``; default ``1 / sqrt(d + d_qv)`` (``d_qv``: qv's head dim, or 0).
        causal: bottom-right aligned causal mask (:func:`visible`).
        window_size: ``(left, right)`` keys visible around each row's position; -1 is unbounded.
        attention_chunk: keys only from the row's own chunk of this size (None or 0: off).
        softcap: logits ``softcap · tanh(scale · s / softcap)`` before masking (0: off).
        sinks: ``(h,)`` sink logits (in the space of ``ℓ``: neither scaled nor capped), or None.
        qv: ``(b, s_q, h, d_v)`` second query part, dotted with the values (MLA), or None.
        upcast: True computes in the inputs' dtype promoted to at least fp32 (float64 stays
            float64). False is FlashAttention's low-precision test baseline instead (its reference's
            ``upcast=False, reorder_ops=True``): the inputs' own dtype, the scale on the keys (and
            on the values in the ``qv`` term) rather than on the queries.
        p_dtype: round the probabilities through this dtype before they weight the values (as an fp8
            kernel does), or None.

    Returns:
        ``out (b, s_q, h, d_v)`` in the compute dtype and ``lse (b, h, s_q)`` (natural log; fp32,
        or float64 when the compute dtype is).
    """
    ref = q if q is not None else qv  # (b, s_q, h, ·)
    dtype = torch.promote_types(ref.dtype, torch.float32) if upcast else ref.dtype
    b, s_q, h = ref.shape[:3]
    s_k = v.shape[1]
    if softmax_scale is None:
        softmax_scale = sum(x.shape[-1] for x in (q, qv) if x is not None) ** -0.5

    def heads(x):  # (b, s_k, h_k, ·) -> (b, s_k, h, ·): query head `head` reads KV head head // g
        return x.to(dtype).repeat_interleave(h // x.shape[2], dim=2)

    # With softcap the scale goes inside the tanh, after the dot products (as in FA3's kernel):
    # scaling q first would overflow for a huge scale that the tanh then saturates.
    factor = 1.0 if softcap > 0 else softmax_scale
    scores = sum(  # (b, h, s_q, s_k)
        torch.einsum("bihd,bjhd->bhij", x.to(dtype) * factor, heads(y))
        if upcast
        else torch.einsum("bihd,bjhd->bhij", x.to(dtype), heads(y) * factor)
        for x, y in ((q, k), (qv, v))
        if x is not None
    )
    if softcap > 0:
        scores = torch.tanh(scores * (softmax_scale / softcap)) * softcap
    hidden = ~visible(s_q, s_k, causal, window_size, attention_chunk, device=v.device)
    logits = scores.masked_fill(hidden, float("-inf"))
    if sinks is not None:  # one more logit per head, with no value
        sink_column = sinks.to(dtype)[None, :, None, None].expand(b, h, s_q, 1)
        logits = torch.cat((logits, sink_column), dim=-1)
    lse = torch.logsumexp(logits.to(torch.promote_types(dtype, torch.float32)), dim=-1)
    p = torch.softmax(logits, dim=-1).nan_to_num(0.0)[..., :s_k]  # a row of -inf: NaN -> 0
    if p_dtype is not None:
        p = p.to(p_dtype).to(dtype)
    return torch.einsum("bhij,bjhd->bihd", p, heads(v)), lse
