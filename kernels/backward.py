"""The attention backward kernels: the gradients of q, k, v from the saved output and LSE.

Same math, signature and results as :func:`attn_ref.attention_backward` (see :mod:`attn_ref.backward`
for the derivation). Per query row ``i`` and head ``h`` (KV head ``h // G``)::

    P_ij  = exp(ℓ_ij - lse_i),  ℓ_ij = scale · q_i·k_j  (-inf where masked)
    D_i   = dO_i · out_i - dlse_i
    dS_ij = P_ij (dO_i · v_j - D_i)
    dV_j  = Σ_i P_ij dO_i      dK_j = scale · Σ_i dS_ij q_i      dQ_i = scale · Σ_j dS_ij k_j

Three kernels, in FlashAttention-2's arrangement:

1. ``_preprocess_kernel``: ``D`` for ``BLOCK_M`` rows of one (batch, head), fp32 ``[B, H, Sq]``.
2. ``_dkdv_kernel``: one program per block of ``BLOCK_N`` keys of one (batch, KV head); it loops over
   the ``G`` query heads of the group and over the query blocks that can see its keys, recomputing
   ``P`` from the saved LSE, and accumulates ``dK``/``dV`` in fp32 registers (GQA is summed there, so
   no atomics are needed).
3. ``_dq_kernel``: one program per block of ``BLOCK_M`` query rows of one (batch, head); it loops over
   the key blocks the rows can see and accumulates ``dQ`` in fp32.

``causal`` is bottom-right aligned (row ``i`` sees keys ``j <= i + Sk - Sq``); query blocks before
a key block's first visible row and key blocks after a query block's last visible key are skipped.
Probabilities and ``dS`` enter their matmuls in the tiles' dtype (fp16/bf16, as FlashAttention does;
fp32 tiles use exact fp32 matmuls), every accumulator is fp32, and the LSE is used in base 2
(``exp2(ℓ·log2 e - lse·log2 e)``). A row with ``lse = -inf`` (no visible key) gets ``P = 0``.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .launch import Launch, compute_dtype, dot_precision, next_power_of_2
from .numerics import LOG2E


@triton.jit(do_not_specialize=["seqlen_q"])
def _preprocess_kernel(
    out_ptr, dout_ptr, dlse_ptr,  # [B, Sq, H, Dv], [B, Sq, H, Dv], [B, Sq, H] (or unused)
    delta_ptr,  # [B, H, Sq] fp32 output
    seqlen_q, nheads,
    stride_ob, stride_os, stride_oh,
    stride_db, stride_ds, stride_dh,
    stride_lb, stride_ls, stride_lh,
    DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_DLSE: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // nheads).to(tl.int64), (pid_bh % nheads).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_d = tl.arange(0, BLOCK_DV)
    row_mask = offs_m < seqlen_q
    mask = row_mask[:, None] & (offs_d[None, :] < DV)
    o = tl.load(out_ptr + b * stride_ob + offs_m[:, None] * stride_os + h * stride_oh + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(dout_ptr + b * stride_db + offs_m[:, None] * stride_ds + h * stride_dh + offs_d[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)  # D_i = dO_i · out_i
    if HAS_DLSE:
        delta -= tl.load(dlse_ptr + b * stride_lb + offs_m * stride_ls + h * stride_lh, mask=row_mask, other=0.0)
    tl.store(delta_ptr + pid_bh.to(tl.int64) * seqlen_q + offs_m, delta, mask=row_mask)


@triton.jit
def _probabilities(q, k, lse, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, CAUSAL: tl.constexpr,
                   PRECISION: tl.constexpr):
    """``P`` (BLOCK_M, BLOCK_N) fp32 of q rows ``offs_m`` over keys ``offs_n`` (0 where masked)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    visible = (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
    if CAUSAL:
        visible &= offs_n[None, :] <= offs_m[:, None] + (seqlen_k - seqlen_q)
    return tl.where(visible, tl.exp2(s * qk_scale - lse[:, None] * LOG2E), 0.0)


@triton.jit
def _load_rows(ptr, offs, n_rows, stride_s, D: tl.constexpr, BLOCK_D: tl.constexpr, DTYPE: tl.constexpr):
    """Rows ``offs`` (BLOCK, BLOCK_D) of a ``[S, D]`` view (stride ``stride_s``), 0 out of bounds."""
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs[:, None] < n_rows) & (offs_d[None, :] < D)
    return tl.load(ptr + offs[:, None] * stride_s + offs_d[None, :], mask=mask, other=0.0).to(DTYPE)


@triton.jit
def _row_stats(lse_ptr, delta_ptr, offs_m, seqlen_q):
    """Saved LSE (``-inf`` read as 0: its row has ``P = 0`` anyway) and ``D`` of rows ``offs_m``."""
    row_mask = offs_m < seqlen_q
    lse = tl.load(lse_ptr + offs_m, mask=row_mask, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    return lse, tl.load(delta_ptr + offs_m, mask=row_mask, other=0.0)


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k"])
def _dkdv_kernel(
    q_ptr, k_ptr, v_ptr, dout_ptr,  # [B, Sq, H, D], [B, Sk, Hkv, D], [B, Sk, Hkv, Dv], [B, Sq, H, Dv]
    lse_ptr, delta_ptr,  # [B, H, Sq] fp32
    dk_ptr, dv_ptr,  # [B, Sk, Hkv, D], [B, Sk, Hkv, Dv] fp32 outputs
    seqlen_q, seqlen_k, softmax_scale, nheads_k,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    b, hk = (pid_bh // nheads_k).to(tl.int64), (pid_bh % nheads_k).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = _load_rows(k_ptr + b * stride_kb + hk * stride_kh, offs_n, seqlen_k, stride_ks, D, BLOCK_D, DTYPE)
    v = _load_rows(v_ptr + b * stride_vb + hk * stride_vh, offs_n, seqlen_k, stride_vs, DV, BLOCK_DV, DTYPE)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    m_start = 0
    if CAUSAL:  # the first row that sees key pid_n·BLOCK_N, rounded down to a block
        m_start = (tl.maximum(pid_n * BLOCK_N - (seqlen_k - seqlen_q), 0) // BLOCK_M) * BLOCK_M
    qk_scale = softmax_scale * LOG2E
    for g in range(GROUP):  # the query heads of this KV head (GQA): dK/dV sum over them
        h = hk * GROUP + g
        q_base = q_ptr + b * stride_qb + h * stride_qh
        do_base = dout_ptr + b * stride_dob + h * stride_doh
        stats = (b * nheads_k * GROUP + h) * seqlen_q
        for m0 in range(m_start, seqlen_q, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            q = _load_rows(q_base, offs_m, seqlen_q, stride_qs, D, BLOCK_D, DTYPE)
            do = _load_rows(do_base, offs_m, seqlen_q, stride_dos, DV, BLOCK_DV, DTYPE)
            lse, delta = _row_stats(lse_ptr + stats, delta_ptr + stats, offs_m, seqlen_q)
            p = _probabilities(q, k, lse, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, CAUSAL, PRECISION)
            dv += tl.dot(tl.trans(p.to(DTYPE)), do, input_precision=PRECISION)  # dV = Pᵀ dO
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # dP = dO Vᵀ
            ds = p * (dp - delta[:, None])  # dS = P (dP - D)
            dk += tl.dot(tl.trans(ds.to(DTYPE)), q, input_precision=PRECISION)  # dK = dSᵀ Q (· scale)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    n_mask = offs_n[:, None] < seqlen_k
    tl.store(dk_ptr + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :],
             dk * softmax_scale, mask=n_mask & (offs_d[None, :] < D))
    tl.store(dv_ptr + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvs + offs_dv[None, :],
             dv, mask=n_mask & (offs_dv[None, :] < DV))


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k"])
def _dq_kernel(
    q_ptr, k_ptr, v_ptr, dout_ptr,  # as in _dkdv_kernel
    lse_ptr, delta_ptr,  # [B, H, Sq] fp32
    dq_ptr,  # [B, Sq, H, D] fp32 output
    seqlen_q, seqlen_k, softmax_scale, nheads,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // nheads).to(tl.int64), (pid_bh % nheads).to(tl.int64)
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(q_ptr + b * stride_qb + h * stride_qh, offs_m, seqlen_q, stride_qs, D, BLOCK_D, DTYPE)
    do = _load_rows(dout_ptr + b * stride_dob + h * stride_doh, offs_m, seqlen_q, stride_dos, DV, BLOCK_DV, DTYPE)
    stats = pid_bh.to(tl.int64) * seqlen_q
    lse, delta = _row_stats(lse_ptr + stats, delta_ptr + stats, offs_m, seqlen_q)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    n_end = seqlen_k
    if CAUSAL:  # one past the last key the block's last row sees
        n_end = tl.minimum(seqlen_k, tl.maximum(pid_m * BLOCK_M + BLOCK_M + (seqlen_k - seqlen_q), 0))
    qk_scale = softmax_scale * LOG2E
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_vb + hk * stride_vh
    for n0 in range(0, n_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, offs_n, seqlen_k, stride_ks, D, BLOCK_D, DTYPE)
        v = _load_rows(v_base, offs_n, seqlen_k, stride_vs, DV, BLOCK_DV, DTYPE)
        p = _probabilities(q, k, lse, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, CAUSAL, PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(DTYPE), k, input_precision=PRECISION)  # dQ = dS K (· scale)
    offs_d = tl.arange(0, BLOCK_D)
    tl.store(dq_ptr + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqs + offs_d[None, :],
             dq * softmax_scale, mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < D))


def _blocks(head_dim: int) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)``: smaller tiles for wide heads (the dK/dV program holds four ``[N, D]`` tiles)."""
    return (64, 64) if head_dim <= 64 else (32, 32) if head_dim <= 128 else (16, 16)


def _strides3(prefix: str, x: torch.Tensor) -> dict[str, int]:
    """``stride_<prefix>b/s/h`` of a ``[B, S, H, ...]`` tensor."""
    return {f"stride_{prefix}{axis}": stride for axis, stride in zip("bsh", x.stride()[:3])}


def plan_preprocess(out, dout, dlse, delta) -> Launch:
    """``delta [B, H, Sq] = rowsum(dout · out) - dlse`` (``dlse`` None: no LSE gradient)."""
    b, sq, h, dv = out.shape
    block_dv = max(16, next_power_of_2(dv))
    block_m = max(1, min(64, 8192 // block_dv))
    args = dict(out_ptr=out, dout_ptr=dout, dlse_ptr=dlse, delta_ptr=delta, seqlen_q=sq, nheads=h,
                **_strides3("o", out), **_strides3("d", dout))
    args.update(zip(("stride_lb", "stride_ls", "stride_lh"), dlse.stride() if dlse is not None else (0, 0, 0)))
    constexprs = dict(DV=dv, BLOCK_M=block_m, BLOCK_DV=block_dv, HAS_DLSE=dlse is not None)
    return Launch(_preprocess_kernel, (triton.cdiv(sq, block_m), b * h), args, constexprs,
                  num_warps=4, num_stages=1, dummy_device=out.device)


def _common(q, k, v, dout, lse_bhs, delta, softmax_scale, causal) -> tuple[dict, dict]:
    """Runtime arguments and constexprs shared by the dK/dV and dQ kernels."""
    d, dv = q.shape[-1], v.shape[-1]
    block_m, block_n = _blocks(max(d, dv))
    args = dict(q_ptr=q, k_ptr=k, v_ptr=v, dout_ptr=dout, lse_ptr=lse_bhs, delta_ptr=delta)
    sizes = dict(seqlen_q=q.shape[1], seqlen_k=k.shape[1], softmax_scale=float(softmax_scale))
    strides = {**_strides3("q", q), **_strides3("k", k), **_strides3("v", v), **_strides3("do", dout)}
    constexprs = dict(
        GROUP=q.shape[2] // k.shape[2], CAUSAL=bool(causal), D=d, DV=dv, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, next_power_of_2(d)), BLOCK_DV=max(16, next_power_of_2(dv)),
        DTYPE=compute_dtype(q.dtype), PRECISION=dot_precision(q.dtype),
    )
    return dict(args=args, sizes=sizes, strides=strides), constexprs


def plan_dkdv(q, k, v, dout, lse_bhs, delta, dk, dv, softmax_scale, causal) -> Launch:
    """``dk``, ``dv`` (fp32, shapes of k, v) over key blocks of ``BLOCK_N``, one program per (batch, KV head)."""
    parts, constexprs = _common(q, k, v, dout, lse_bhs, delta, softmax_scale, causal)
    args = dict(**parts["args"], dk_ptr=dk, dv_ptr=dv, **parts["sizes"], nheads_k=k.shape[2],
                **parts["strides"], **_strides3("dk", dk), **_strides3("dv", dv))
    grid = (triton.cdiv(k.shape[1], constexprs["BLOCK_N"]), k.shape[0] * k.shape[2])
    return Launch(_dkdv_kernel, grid, args, constexprs, num_warps=4, num_stages=1, dummy_device=q.device)


def plan_dq(q, k, v, dout, lse_bhs, delta, dq, softmax_scale, causal) -> Launch:
    """``dq`` (fp32, shape of q) over query blocks of ``BLOCK_M``, one program per (batch, head)."""
    parts, constexprs = _common(q, k, v, dout, lse_bhs, delta, softmax_scale, causal)
    args = dict(**parts["args"], dq_ptr=dq, **parts["sizes"], nheads=q.shape[2],
                **parts["strides"], **_strides3("dq", dq))
    grid = (triton.cdiv(q.shape[1], constexprs["BLOCK_M"]), q.shape[0] * q.shape[2])
    return Launch(_dq_kernel, grid, args, constexprs, num_warps=4, num_stages=1, dummy_device=q.device)


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
    """Gradients of q, k, v, as :func:`attn_ref.attention_backward` (same arguments and shapes).

    Args:
        dout: ``[B, Sq, H, Dv]``; q: ``[B, Sq, H, D]``; k: ``[B, Sk, Hkv, D]``; v: ``[B, Sk, Hkv, Dv]``
            (fp16/bf16/fp32, one dtype; ``D, Dv <= 256``); out: ``[B, Sq, H, Dv]``; lse: ``[B, Sq, H]``.
        softmax_scale, causal: the forward's (bottom-right causal).
        dlse: ``[B, Sq, H]`` gradient of the LSE, or None.
        grad_dtype: dtype of the returned gradients; default each input's own dtype.

    Returns:
        ``(dq, dk, dv)`` in the shapes of q, k, v.
    """
    q, k, v, dout, out = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, dout, out))
    b, sq, h, _ = q.shape
    device = q.device
    lse_bhs = lse.float().transpose(1, 2).contiguous()  # [B, H, Sq]: one row of stats per (batch, head)
    delta = torch.empty(b, h, sq, dtype=torch.float32, device=device)
    plan_preprocess(out, dout, None if dlse is None else dlse.float(), delta).run()
    dq = torch.empty(q.shape, dtype=torch.float32, device=device)
    dk = torch.empty(k.shape, dtype=torch.float32, device=device)
    dv = torch.empty(v.shape, dtype=torch.float32, device=device)
    plan_dkdv(q, k, v, dout, lse_bhs, delta, dk, dv, softmax_scale, causal).run()
    plan_dq(q, k, v, dout, lse_bhs, delta, dq, softmax_scale, causal).run()
    return dq.to(grad_dtype or q.dtype), dk.to(grad_dtype or k.dtype), dv.to(grad_dtype or v.dtype)
