"""Backward of attention from the saved output and log-sum-exp: the gradients of q, k and v.

The forward (:mod:`attn_ref.attention`) gives, per query row ``i`` and query head ``head`` (served
by key/value head ``kv_head = head // g``, ``g = h / h_k``, GQA), ``ℓ_ij = scale · q_i·k_j``
(``-inf`` where key ``j`` is masked), ``lse_i = log Σ_j e^{ℓ_ij}`` and ``out_i = Σ_j P_ij v_j`` with
``P_ij = e^{ℓ_ij - lse_i}``. Given the gradient ``dO`` of the output (and optionally ``dlse`` of the
LSE), the chain rule through the
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
block to ``dQ``, and that block's own ``dK``/``dV``, can be computed on their own: a ring or
split-KV backward is exact, not an approximation. The one row-level quantity is ``D_i``, which needs
only the final ``out_i`` and ``dO_i``.

**Masks and softcap**, with the forward's names and meaning (:mod:`attn_ref.masks`, bottom-right
aligned): ``causal`` (row ``i`` sees keys ``j <= i + s_k - s_q``), ``window_size = (left, right)``
and ``attention_chunk``; a masked key has ``P = 0``, so it gets no gradient. A row that sees no key
(``lse = -inf``) has ``P = 0`` and gets zero gradients. With ``softcap > 0`` the logit is ``ℓ_ij =
softcap · tanh(scale · s_ij / softcap)`` (``s_ij = q_i·k_j``), whose derivative is ``scale · (1 -
tanh²)``: ``dS`` is multiplied by ``1 - (ℓ_ij / softcap)²`` before it enters ``dQ`` and ``dK``.

The arithmetic is fp32 for fp16/bf16/fp32 inputs (float64 for float64 inputs, so that
``torch.autograd.gradcheck`` can check it), with bounded memory: query rows are processed in the
forward's tiles (:func:`_row_tiles`), so no score tensor has more than
:data:`~attn_ref.attention.MAX_SCORE_ELEMENTS` entries, and each tile only over the keys its rows
see (the forward's block skipping: a causal backward computes about half of the score matrix). The
pieces have the names of their Triton twins in :mod:`kernels.backward` (same signature
for :func:`attention_backward`), in FlashAttention-2's arrangement: :func:`_preprocess` (``D``),
:func:`_dkdv` (``dK``, ``dV``) and :func:`_dq` (``dQ``), each recomputing ``P`` with
:func:`_probabilities` and ``dS`` with :func:`_dscores`. Inside, query and output tensors are viewed
by KV head, ``[b, s_q, h_k, g, ·]`` with ``g = h / h_k``, so a KV head's query heads sit on one
axis.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from .argument_checks import (
    _require_device,
    _require_dtype,
    _require_float,
    _require_heads_divide,
    _require_ndim,
    _require_shape,
    _require_tensor,
)
from .attention import MAX_SCORE_ELEMENTS, ROWS_PER_TILE, _logits
from .error_notes import catalogued
from .masks import NO_MASK, AttentionMask


@catalogued
def attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    mask: AttentionMask = NO_MASK,
    dlse: Optional[torch.Tensor] = None,
    grad_dtype: Optional[torch.dtype] = None,
    *,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k, v for attention of ``q`` over all of ``k``/``v`` (see the module
    docstring).

    Takes what the forward returned: ``out, lse, *_ = flash_attn_with_kvcache(q, k, v, ...,
    return_softmax_lse=True)`` with the same ``softmax_scale``, and the mask of the forward's
    options (``AttentionMask(**options)``, :mod:`attn_ref.masks`). The arguments are checked first
    (:func:`check_backward_args`, shared with :func:`kernels.attention_backward`).

    Args:
        dout: ``(b, s_q, h, d_v)`` gradient of the output.
        q: ``(b, s_q, h, d)``.
        k: ``(b, s_k, h_k, d)`` (``h % h_k == 0``), q's dtype.
        v: ``(b, s_k, h_k, d_v)``, q's dtype.
        out: ``(b, s_q, h, d_v)`` the forward's output.
        lse: ``(b, h, s_q)`` the forward's natural-log LSE, as FA returns it.
        softmax_scale: the forward's factor of ``q·k``.
        mask: the forward's mask (:class:`~attn_ref.masks.AttentionMask`, e.g.
            ``AttentionMask(causal=True, window_size=(w, 0))``; FA's options ``causal``,
            ``window_size``, ``attention_chunk`` are its keywords).
        dlse: ``(b, h, s_q)`` gradient of the LSE, or None (no gradient flows into it).
        grad_dtype: dtype of the returned gradients; default each input's own dtype.
        softcap: the forward's logit softcap (0 or None: off).

    Returns:
        ``(dq (b, s_q, h, d), dk (b, s_k, h_k, d), dv (b, s_k, h_k, d_v))``.
    """
    check_backward_args(dout, q, k, v, out, lse, dlse, mask)
    work = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[2] // k.shape[2]

    def by_kv_head(x):  # (b, s_q, h, ...) -> (b, s_q, h_k, g, ...) in the working dtype
        return x.to(work).unflatten(2, (-1, group))

    def rows_first(stat):  # (b, h, s_q) -> (b, s_q, h_k, g): the layout of out[..., 0]
        return by_kv_head(stat.transpose(1, 2))

    q_w, dout_w, lse_w = by_kv_head(q), by_kv_head(dout), rows_first(lse)
    delta = _preprocess(by_kv_head(out), dout_w, None if dlse is None else rows_first(dlse))
    k_w, v_w = k.to(work), v.to(work)
    dk, dv = _dkdv(q_w, k_w, v_w, dout_w, lse_w, delta, softmax_scale, softcap or 0.0, mask)
    dq = _dq(q_w, k_w, v_w, dout_w, lse_w, delta, softmax_scale, softcap or 0.0, mask)
    return (
        dq.flatten(2, 3).to(grad_dtype or q.dtype),
        dk.to(grad_dtype or k.dtype),
        dv.to(grad_dtype or v.dtype),
    )


def check_backward_args(dout, q, k, v, out, lse, dlse, mask) -> None:
    """The arguments of both ``attention_backward``: tensors on q's device, floating point, k and v
    in q's dtype, ``q (b, s_q, h, d)``, ``k (b, s_k, h_k, d)``, ``v (b, s_k, h_k, d_v)`` with
    ``h_k`` dividing ``h``, ``out`` and ``dout (b, s_q, h, d_v)``, ``lse`` and ``dlse (b, h, s_q)``,
    ``mask`` an :class:`~attn_ref.masks.AttentionMask`."""
    named = {"dout": dout, "q": q, "k": k, "v": v, "out": out, "lse": lse}
    if dlse is not None:
        named["dlse"] = dlse
    for name, x in named.items():
        _require_tensor(name, x)
    _require_ndim("q", q, 4, "(b, s_q, h, d)")
    _require_ndim("k", k, 4, "(b, s_k, h_k, d)")
    b, sq, h, d = q.shape
    sk, h_k, dv = k.shape[1], k.shape[2], v.shape[-1] if v.dim() else 0
    _require_shape("k", k, (b, sk, h_k, d), "(b, s_k, h_k, d)")
    _require_shape("v", v, (b, sk, h_k, dv), "(b, s_k, h_k, d_v)")
    _require_heads_divide(h, h_k)
    _require_shape("out", out, (b, sq, h, dv), "(b, s_q, h, d_v)")
    _require_shape("dout", dout, (b, sq, h, dv), "(the shape of out)")
    _require_shape("lse", lse, (b, h, sq), "((b, h, s_q), as the forward returns it)")
    if dlse is not None:
        _require_shape("dlse", dlse, (b, h, sq), "(the shape of lse)")
    for name, x in named.items():
        _require_float(name, x)
        _require_device(name, x, q.device)
    _require_dtype("k", k, q.dtype)
    _require_dtype("v", v, q.dtype)
    if not isinstance(mask, AttentionMask):
        raise TypeError(
            f"mask must be an attn_ref.AttentionMask (e.g. AttentionMask(causal=True)), got "
            f"{type(mask).__name__}"
        )


def _preprocess(
    out: torch.Tensor, dout: torch.Tensor, dlse: Optional[torch.Tensor]
) -> torch.Tensor:
    """``D_i = dO_i · out_i - dlse_i`` (no ``dlse`` term when ``dlse`` is None), ``[b, s_q, h_k,
    g]``.

    ``out``, ``dout``: ``[b, s_q, h_k, g, d_v]``; ``dlse``: ``[b, s_q, h_k, g]``. ``D_i = Σ_j P_ij
    dP_ij`` is the one row-level quantity of the backward: the ``dS`` of every key block subtracts
    it.
    """
    delta = (dout * out).sum(-1)
    if dlse is not None:
        delta = delta - dlse
    return delta


def _dkdv(
    q, k, v, dout, lse, delta, softmax_scale: float, softcap: float, mask: AttentionMask
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dK [b, s_k, h_k, d]`` and ``dV [b, s_k, h_k, d_v]`` of every key, over all query rows.

    ``dV_j = Σ_i P_ij dO_i`` and ``dK_j = scale · Σ_i dS_ij q_i``, the sums running over the rows
    and over the ``g`` query heads of each KV head (GQA). ``q [b, s_q, h_k, g, d]``, ``k [b, s_k,
    h_k, d]``, ``v [b, s_k, h_k, d_v]``, ``dout [b, s_q, h_k, g, d_v]``, ``lse``, ``delta`` ``[b,
    s_q, h_k, g]``; ``mask``: the forward's :class:`~attn_ref.masks.AttentionMask`. The rows are
    taken in tiles (:func:`_row_tiles`), as the kernel takes them in blocks of ``BLOCK_M``, each
    over the keys ``[lo, hi)`` its rows see: the other keys get nothing from it.
    """
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for r0, r1, key_range in _row_tiles(q, k, mask):
        keys = slice(*key_range[:2])  # [lo, hi)
        q_r, do_r = q[:, r0:r1], dout[:, r0:r1]  # [b, rows, h_k, g, d], [b, rows, h_k, g, d_v]
        lse_r, delta_r = _row_stats(lse, delta, r0, r1)
        p, softcap_grad = _probabilities(
            q_r, k, lse_r, r0, q.shape[1], key_range, softmax_scale, softcap, mask
        )
        dv[:, keys] += torch.einsum("bkgrn,brkgd->bnkd", p, do_r)  # dV = Pᵀ dO, summed over G
        ds = _dscores(p, do_r, v[:, keys], delta_r, softcap_grad)
        # dK = dSᵀ Q (· scale), summed over G
        dk[:, keys] += torch.einsum("bkgrn,brkgd->bnkd", ds, q_r)
    return dk.mul_(softmax_scale), dv


def _dq(
    q, k, v, dout, lse, delta, softmax_scale: float, softcap: float, mask: AttentionMask
) -> torch.Tensor:
    """``dQ_i = scale · Σ_j dS_ij k_j`` over all keys, ``[b, s_q, h_k, g, d]`` (arguments as
    :func:`_dkdv`).

    Each tile of rows is finished on its own: its ``P`` and ``dS`` over the keys ``[lo, hi)`` it
    sees give its ``dQ``, as a kernel program finishes its ``BLOCK_M`` rows by looping over the
    key blocks of ``[lo, hi)``. Rows of a tile that sees no key keep ``dQ = 0``.
    """
    dq = torch.zeros_like(q)
    for r0, r1, key_range in _row_tiles(q, k, mask):
        keys = slice(*key_range[:2])  # [lo, hi)
        lse_r, delta_r = _row_stats(lse, delta, r0, r1)
        p, softcap_grad = _probabilities(
            q[:, r0:r1], k, lse_r, r0, q.shape[1], key_range, softmax_scale, softcap, mask
        )
        ds = _dscores(p, dout[:, r0:r1], v[:, keys], delta_r, softcap_grad)
        # dQ = dS K · scale
        dq[:, r0:r1] = torch.einsum("bkgrn,bnkd->brkgd", ds, k[:, keys]).mul_(softmax_scale)
    return dq


def _row_tiles(
    q: torch.Tensor, k: torch.Tensor, mask: AttentionMask
) -> Iterator[tuple[int, int, tuple[int, int, int, int]]]:
    """``(r0, r1, (lo, hi, full_lo, full_hi))``: tiles of :data:`~attn_ref.attention.ROWS_PER_TILE`
    query rows (fewer when their scores ``[b, h, rows, s_k]`` would exceed ``MAX_SCORE_ELEMENTS``),
    with the keys some row of the tile sees, ``[lo, hi)``, and those all of them see
    (:meth:`~attn_ref.masks.AttentionMask.tile_key_range`, the forward's block skipping). A tile
    that sees no key is left out."""
    b, sq, h_k, g = q.shape[:4]
    sk = k.shape[1]
    rows = max(1, min(ROWS_PER_TILE, MAX_SCORE_ELEMENTS // max(1, b * h_k * g * sk)))
    for r0 in range(0, sq, rows):
        r1 = min(sq, r0 + rows)
        key_range = mask.tile_key_range(r0, r1, sq, sk)
        if key_range[0] < key_range[1]:
            yield r0, r1, key_range


def _row_stats(
    lse: torch.Tensor, delta: torch.Tensor, r0: int, r1: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """LSE (infinite read as 0: a row with no visible key has ``P = 0`` anyway) and ``D`` of rows
    ``r0:r1``, each ``[b, h_k, g, rows, 1]`` (from ``[b, s_q, h_k, g]``), to broadcast over the
    keys."""
    lse_r, delta_r = (x[:, r0:r1].permute(0, 2, 3, 1)[..., None] for x in (lse, delta))
    return torch.where(torch.isinf(lse_r), torch.zeros_like(lse_r), lse_r), delta_r


def _probabilities(
    q,
    k,
    lse,
    row_start: int,
    seqlen_q: int,
    key_range: tuple[int, int, int, int],
    softmax_scale: float,
    softcap: float,
    mask: AttentionMask,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``P_ij = exp(ℓ_ij - lse_i)`` ``[b, h_k, g, rows, hi - lo]`` of rows ``row_start ..`` over
    keys ``lo .. hi - 1``, 0 where masked, and the softcap's factor ``1 - tanh² = 1 - (ℓ_ij /
    softcap)²`` of ``dS`` (same shape; None without softcap).

    ``q [b, rows, h_k, g, d]`` (rows ``row_start .. row_start + rows - 1`` of ``seqlen_q``),
    ``k [b, s_k, h_k, d]`` (every key), ``lse [b, h_k, g, rows, 1]`` from :func:`_row_stats`,
    ``key_range = (lo, hi, full_lo, full_hi)`` from :func:`_row_tiles`; the logits ``ℓ`` are the
    forward's (:func:`attn_ref.attention._logits`), the mask is ``mask``'s
    (:meth:`~attn_ref.masks.AttentionMask.visible_keys`), tested only on the keys that not every
    row sees, outside ``[full_lo, full_hi)``.
    """
    lo, hi, full_lo, full_hi = key_range
    logits = _logits(torch.einsum("brkgd,bnkd->bkgrn", q, k[:, lo:hi]), softmax_scale, softcap)
    softcap_grad = 1 - (logits / softcap).square() if softcap > 0 else None
    if not full_lo <= lo < hi <= full_hi:  # some row of the tile does not see some of its keys
        visible = mask.visible_keys(
            seqlen_q,
            k.shape[1],
            device=q.device,
            row_start=row_start,
            row_end=row_start + q.shape[1],
            key_start=lo,
            key_end=hi,
        )  # (rows, hi - lo)
        logits.masked_fill_(~visible, float("-inf"))
    return logits.sub_(lse).exp_(), softcap_grad


def _dscores(
    p: torch.Tensor,
    dout: torch.Tensor,
    v: torch.Tensor,
    delta: torch.Tensor,
    softcap_grad: Optional[torch.Tensor],
) -> torch.Tensor:
    """``dS_ij = P_ij (dP_ij - D_i)`` with ``dP_ij = dO_i · v_j``, ``[b, h_k, g, rows, s_k]``,
    written over ``p``; times ``softcap_grad`` (``1 - tanh²``) with softcap.

    ``p [b, h_k, g, rows, s_k]``, ``dout [b, rows, h_k, g, d_v]``, ``v [b, s_k, h_k, d_v]``,
    ``delta [b, h_k, g, rows, 1]``, ``softcap_grad`` as ``p`` or None.
    """
    dp = torch.einsum("brkgd,bnkd->bkgrn", dout, v)
    ds = p.mul_(dp.sub_(delta))
    return ds if softcap_grad is None else ds.mul_(softcap_grad)
