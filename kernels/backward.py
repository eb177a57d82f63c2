"""The attention backward kernels: the gradients of q, k, v from the saved output and LSE.

Same math, signature and results as :func:`attn_ref.attention_backward` (see
:mod:`attn_ref.backward`
for the derivation). Per query row ``i`` and query head ``head`` (KV head ``head // g``)::

    P_ij  = exp(ℓ_ij - lse_i),  ℓ_ij = scale · q_i·k_j, or softcap · tanh(scale · q_i·k_j / softcap)
                                (-inf where masked)
    D_i   = dO_i · out_i - dlse_i
    dS_ij = P_ij (dO_i · v_j - D_i)  (· (1 - tanh²) with softcap)
    dV_j  = Σ_i P_ij dO_i      dK_j = scale · Σ_i dS_ij q_i      dQ_i = scale · Σ_j dS_ij k_j

Three kernels, in FlashAttention-2's arrangement:

1. ``_preprocess_kernel``: ``D`` for ``BLOCK_M`` rows of one (sequence, head), fp32, in the LSE's
   layout.
2. ``_dkdv_kernel``: one program per block of ``BLOCK_N`` keys of one (sequence, KV head); it loops
   over the ``g`` query heads of the group and over the query blocks that can see its keys,
   recomputing ``P`` from the saved LSE, and accumulates ``dK``/``dV`` in fp32 registers (GQA is
   summed there, so no atomics are needed and the result is bitwise repeatable).
3. ``_dq_kernel``: one program per block of ``BLOCK_M`` query rows of one (sequence, head); it loops
   over the key blocks the rows can see and accumulates ``dQ`` in fp32.

**Sequences.** One launch per kernel covers every sequence of a call. Sequence ``i`` is the query
rows ``q_starts[i] .. q_starts[i] + seqlens_q[i] - 1`` and the keys ``k_starts[i] .. k_starts[i] +
seqlens_k[i] - 1`` (a :class:`SequenceTable` of ``(n,)`` int32 device tensors, read in the kernel
by :func:`_sequence`), attended on their own with the masks aligned on those lengths. Two layouts:

* batched, as :func:`attention_backward` takes them: ``q (b, S_q, h, d)``, ``k (b, S_k, h_k, d)``,
  ``lse (b, h, S_q)``; sequence ``i`` is batch entry ``i`` (:func:`batch_sequences`: starts 0,
  every row and key);
* packed, as :func:`kernels.flash_attn.flash_attn_varlen_func` holds them: ``q (total_q, h, d)``,
  ``k (total_k, h_k, d)``, ``lse (h, total_q)``; the batch stride is 0 and the starts place each
  sequence (``cu_seqlens``), the lengths are the used ones (``seqused``).

The grids are sized from static bounds (the longest sequence); programs past their sequence's rows
or keys exit at once. Rows and keys outside every sequence get zero gradients (the buffers start
at 0) and ``D = 0``.

Both gradient kernels start from :func:`_head_pointers` (where a sequence's rows of a query head and
its keys of the KV head start),
read tiles with :func:`_load_rows` and recompute ``P`` and ``dS`` with :func:`_probabilities` and
:func:`_dscores`, the twins of the reference's pieces of the same names (:mod:`attn_ref.backward`).

The masks are the forward's, from :mod:`kernels.masks`, as one group of runtime values: bottom-right
``causal`` (passed as ``window_right = 0``), the sliding window ``(window_left, window_right)`` and
``chunk``, tested per tile by
:func:`kernels.masks.visible_keys`.
Tiles that no row sees are skipped with :func:`kernels.masks.tile_key_range`: the dQ program visits
only the key blocks of its rows' ``[lo, hi)``, the dK/dV program skips each query block whose
``[lo, hi)`` misses its keys. The logits are the forward's (:func:`kernels.attention._logits`, base
2);
with ``SOFTCAP`` the ``dS`` of :func:`_dscores` is multiplied by ``1 - tanh²``.
Probabilities and ``dS`` enter their matmuls in the tiles' dtype (fp16/bf16, as FlashAttention does;
fp32 tiles use exact fp32 matmuls), every accumulator is fp32, and the LSE is used in base 2
(``exp2(ℓ·log2 e - lse·log2 e)``). A row with ``lse = -inf`` (no visible key) gets ``P = 0``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from attn_ref.backward import check_backward_args
from attn_ref.error_notes import catalogued
from attn_ref.masks import NO_MASK, AttentionMask

from .attention import _logits, _row_strides
from .launch import Launch, Tile, compute_dtype, dot_precision, next_power_of_2
from .masks import tile_key_range, visible_keys
from .numerics import LOG2E


@catalogued
def attention_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, softmax_scale: float, mask: AttentionMask = NO_MASK,
    dlse: Optional[torch.Tensor] = None, grad_dtype: Optional[torch.dtype] = None, *,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k, v, as :func:`attn_ref.attention_backward` (same arguments, shapes,
    checks).

    Args:
        dout: ``(b, s_q, h, d_v)`` gradient of the output.
        q: ``(b, s_q, h, d)`` (``d, d_v <= 256``), fp16/bf16/fp32.
        k: ``(b, s_k, h_k, d)``, q's dtype.
        v: ``(b, s_k, h_k, d_v)``, q's dtype.
        out: ``(b, s_q, h, d_v)`` the forward's output.
        lse: ``(b, h, s_q)`` the forward's natural-log LSE, as FA returns it.
        softmax_scale: the forward's.
        mask: the forward's mask (:class:`~attn_ref.masks.AttentionMask`, e.g.
            ``AttentionMask(causal=True, window_size=(w, 0))``; FA's options ``causal``,
            ``window_size``, ``attention_chunk`` are its keywords).
        dlse: ``(b, h, s_q)`` gradient of the LSE, or None.
        grad_dtype: dtype of the returned gradients; default each input's own dtype.
        softcap: the forward's logit softcap (0 or None: off).

    Returns:
        ``(dq, dk, dv)`` in the shapes of q, k, v.
    """
    check_backward_args(dout, q, k, v, out, lse, dlse, mask)
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    sequences = batch_sequences(b, sq, sk, q.device)  # batch entry i: its s_q rows, its s_k keys
    return sequence_gradients(dout, q, k, v, out, lse, dlse, sequences, (sq, sk), softmax_scale,
                              mask, softcap, grad_dtype)[:3]


def sequence_gradients(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, dlse: Optional[torch.Tensor], sequences: SequenceTable,
    max_seqlens: tuple[int, int], softmax_scale: float, mask: AttentionMask = NO_MASK,
    softcap: float = 0.0, grad_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, delta)`` of every sequence of ``sequences``, one launch per kernel
    (unchecked: :func:`attention_backward` checks its arguments first, the packed entry points
    their forward's).

    Batched tensors (``q (b, S_q, h, d)``, ``k (b, S_k, h_k, d)``, ``v (b, S_k, h_k, d_v)``,
    ``out``, ``dout (b, S_q, h, d_v)``, ``lse``, ``dlse (b, h, S_q)``) or packed ones (``q
    (total_q, h, d)``, ``k (total_k, h_k, d)``, ``v (total_k, h_k, d_v)``, ``out``, ``dout
    (total_q, h, d_v)``, ``lse``, ``dlse (h, total_q)``), as the module docstring says;
    ``max_seqlens = (max seqlens_q, max seqlens_k)``, static bounds that size the grids. The
    gradients are accumulated in fp32 and returned in ``grad_dtype`` (default: each input's own);
    ``delta`` is ``D = rowsum(dO · out) - dlse``, fp32 in the LSE's layout (0 outside the
    sequences).
    """
    q, k, v, dout, out = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, dout, out))
    lse = lse.float().contiguous()  # (b, h, S_q) / (h, total_q): one row of stats per head
    dlse = None if dlse is None else dlse.float().contiguous()  # lse's layout
    delta = torch.zeros_like(lse)
    plan_preprocess(out, dout, dlse, delta, sequences, max_seqlens[0]).run()
    dq, dk, dv = (torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in (q, k, v))
    plan_dkdv(q, k, v, dout, lse, delta, dk, dv, sequences, max_seqlens, softmax_scale, mask,
              softcap).run()
    plan_dq(q, k, v, dout, lse, delta, dq, sequences, max_seqlens, softmax_scale, mask,
            softcap).run()
    return (dq.to(grad_dtype or q.dtype), dk.to(grad_dtype or k.dtype),
            dv.to(grad_dtype or v.dtype), delta)


class SequenceTable(NamedTuple):
    """The sequences of a backward call, the kernels' argument group ``sequences``: ``(n,)`` int32
    device tensors, entry ``i`` for sequence ``i`` (batch entry ``i`` of batched tensors). Its
    query rows are ``q_starts[i] ..`` (``seqlens_q[i]`` of them) of the q-like tensors' row axis,
    its keys ``k_starts[i] ..`` (``seqlens_k[i]``) of k's and v's."""

    q_starts: torch.Tensor
    seqlens_q: torch.Tensor
    k_starts: torch.Tensor
    seqlens_k: torch.Tensor


def batch_sequences(batch: int, seqlen_q: int, seqlen_k: int, device) -> SequenceTable:
    """The :class:`SequenceTable` of batched tensors: entry ``i`` is batch entry ``i``, all its
    ``seqlen_q`` rows and ``seqlen_k`` keys from row 0."""
    zeros = torch.zeros(batch, dtype=torch.int32, device=device)
    return SequenceTable(zeros, torch.full((batch,), seqlen_q, dtype=torch.int32, device=device),
                         zeros, torch.full((batch,), seqlen_k, dtype=torch.int32, device=device))


def plan_preprocess(out, dout, dlse, delta, sequences: SequenceTable, max_seqlen_q: int) -> Launch:
    """``delta = rowsum(dout · out) - dlse`` (``dlse`` None: no LSE gradient) of every sequence's
    rows; ``delta`` and ``dlse`` fp32 in the LSE's layout, ``(b, h, S_q)`` or ``(h, total_q)``."""
    h, dv = out.shape[-2:]
    block_dv = max(16, next_power_of_2(dv))
    block_m = max(1, min(64, 8192 // block_dv))
    args = dict(**_pointer("out", "o", out), **_pointer("dout", "d", dout), dlse_ptr=dlse,
                delta_ptr=delta, stride_stats=_stats_strides(delta), sequences=sequences,
                nheads=h)
    constexprs = dict(DV=dv, BLOCK_M=block_m, BLOCK_DV=block_dv, HAS_DLSE=dlse is not None)
    grid = (triton.cdiv(max_seqlen_q, block_m), sequences.q_starts.shape[0] * h)
    return Launch(_preprocess_kernel, grid, args, constexprs, num_warps=4, num_stages=1,
                  dummy_device=out.device)


def plan_dkdv(q, k, v, dout, lse, delta, dk, dv, sequences: SequenceTable,
              max_seqlens: tuple[int, int], softmax_scale, mask=NO_MASK, softcap=0.0) -> Launch:
    """``dk``, ``dv`` (fp32, shapes of k, v) over key blocks of ``BLOCK_N``, one program per
    (sequence, KV head)."""
    inputs, scalars, mask_group, constexprs = _common(q, k, v, dout, lse, delta, max_seqlens,
                                                      softmax_scale, mask, softcap)
    h_k = k.shape[-2]
    args = dict(**inputs, **_pointer("dk", "dk", dk), **_pointer("dv", "dv", dv),
                sequences=sequences, **scalars, nheads_k=h_k, **mask_group)
    grid = (triton.cdiv(max_seqlens[1], constexprs["TILE"].BLOCK_N),
            sequences.q_starts.shape[0] * h_k)
    return Launch(_dkdv_kernel, grid, args, constexprs, num_warps=4, num_stages=1,
                  dummy_device=q.device)


def plan_dq(q, k, v, dout, lse, delta, dq, sequences: SequenceTable, max_seqlens: tuple[int, int],
            softmax_scale, mask=NO_MASK, softcap=0.0) -> Launch:
    """``dq`` (fp32, shape of q) over query blocks of ``BLOCK_M``, one program per (sequence,
    head)."""
    inputs, scalars, mask_group, constexprs = _common(q, k, v, dout, lse, delta, max_seqlens,
                                                      softmax_scale, mask, softcap)
    h = q.shape[-2]
    args = dict(**inputs, **_pointer("dq", "dq", dq), sequences=sequences, **scalars, nheads=h,
                **mask_group)
    grid = (triton.cdiv(max_seqlens[0], constexprs["TILE"].BLOCK_M),
            sequences.q_starts.shape[0] * h)
    return Launch(_dq_kernel, grid, args, constexprs, num_warps=4, num_stages=1,
                  dummy_device=q.device)


def _common(q, k, v, dout, lse, delta, max_seqlens, softmax_scale, mask,
            softcap) -> tuple[dict, ...]:
    """``(inputs, scalars, mask_group, constexprs)``: the arguments the dK/dV and dQ kernels share,
    in their order; ``mask``: the forward's :class:`~attn_ref.masks.AttentionMask`, bounded by
    ``max_seqlens`` (FA3's normalisation, int32 values)."""
    d, dv = q.shape[-1], v.shape[-1]
    block_m, block_n = _blocks(max(d, dv))
    inputs = dict(**_pointer("q", "q", q), **_pointer("k", "k", k), **_pointer("v", "v", v),
                  **_pointer("dout", "do", dout), lse_ptr=lse, delta_ptr=delta,
                  stride_stats=_stats_strides(lse))
    softcap = float(softcap or 0.0)
    scalars = dict(softmax_scale=float(softmax_scale), softcap=softcap if softcap > 0 else 1.0)
    constexprs = dict(
        GROUP=q.shape[-2] // k.shape[-2], SOFTCAP=softcap > 0, D=d, DV=dv,
        TILE=Tile(block_m, block_n, max(16, next_power_of_2(d)), max(16, next_power_of_2(dv))),
        DTYPE=compute_dtype(q.dtype), PRECISION=dot_precision(q.dtype),
    )
    mask_group = dict(mask=mask.bounded(*max_seqlens).kernel_args())
    return inputs, scalars, mask_group, constexprs


def _blocks(head_dim: int) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)``: smaller tiles for wide heads (the dK/dV program holds four ``[N, d]``
    tiles)."""
    return (64, 64) if head_dim <= 64 else (32, 32) if head_dim <= 128 else (16, 16)


def _pointer(name: str, prefix: str, x: Optional[torch.Tensor]) -> dict:
    """``<name>_ptr`` and ``stride_<prefix> = (batch, row, head)`` of a batched ``(b, S, h, ...)``
    or packed ``(total, h, ...)`` tensor (batch stride 0: the row index already holds the
    sequence's start), as the kernels take them (strides 0 for None, a tensor not read)."""
    packed = x is not None and x.dim() == 3
    return {f"{name}_ptr": x, f"stride_{prefix}": _row_strides(x, packed)}


def _stats_strides(stats: torch.Tensor) -> tuple[int, int]:
    """``(batch, head)`` strides of row statistics (LSE, ``dlse``, ``D``) with contiguous rows:
    batched ``(b, h, S_q)`` or packed ``(h, total_q)`` (batch stride 0)."""
    return (0, stats.stride(0)) if stats.dim() == 2 else tuple(stats.stride()[:2])


# Strides come as (batch, row, head) groups, the sequence table as one group of pointers (Triton
# specialises both) and the mask as its group (kernels.masks). The lengths are read from the table,
# not passed as arguments: batches of new lengths run the compiled variants.
@triton.jit
def _preprocess_kernel(
    out_ptr, stride_o,  # (b, S_q, h, d_v) or (total_q, h, d_v); strides (batch, row, head)
    dout_ptr, stride_d,  # out's layout
    dlse_ptr,  # fp32 (b, h, S_q) or (h, total_q) (unused unless HAS_DLSE)
    delta_ptr,  # fp32 output, dlse's layout
    stride_stats,  # (batch, head) strides of dlse and delta (rows contiguous; batch 0 when packed)
    sequences,  # SequenceTable: (n,) int32 q_starts, seqlens_q, k_starts, seqlens_k
    nheads,
    DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_DLSE: tl.constexpr,
):
    """``D_i = dO_i · out_i - dlse_i`` of ``BLOCK_M`` rows of one (sequence, head)."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // nheads).to(tl.int64), (pid_bh % nheads).to(tl.int64)
    q_start, seqlen_q, _, _ = _sequence(sequences, b)
    if pid_m * BLOCK_M < seqlen_q:  # programs past the sequence's rows have nothing to do
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) the sequence's rows
        o = _load_rows(_at(out_ptr, stride_o, b, h, q_start), offs_m, seqlen_q, stride_o[1], DV,
                       BLOCK_DV, tl.float32)  # (BLOCK_M, BLOCK_DV)
        do = _load_rows(_at(dout_ptr, stride_d, b, h, q_start), offs_m, seqlen_q, stride_d[1], DV,
                        BLOCK_DV, tl.float32)  # (BLOCK_M, BLOCK_DV)
        delta = tl.sum(o * do, axis=1)  # (BLOCK_M,) D_i = dO_i · out_i
        row_mask = offs_m < seqlen_q  # (BLOCK_M,)
        stats = _stats_at(stride_stats, b, h, q_start)  # the sequence's row 0 of this head
        if HAS_DLSE:
            delta -= tl.load(dlse_ptr + stats + offs_m, mask=row_mask, other=0.0)
        tl.store(delta_ptr + stats + offs_m, delta, mask=row_mask)


@triton.jit
def _dkdv_kernel(
    q_ptr, stride_q,  # (b, S_q, h, d) or (total_q, h, d); strides (batch, row, head)
    k_ptr, stride_k,  # (b, S_k, h_k, d) or (total_k, h_k, d)
    v_ptr, stride_v,  # (b, S_k, h_k, d_v) or (total_k, h_k, d_v)
    dout_ptr, stride_do,  # (b, S_q, h, d_v) or (total_q, h, d_v)
    lse_ptr, delta_ptr,  # fp32 (b, h, S_q) or (h, total_q)
    stride_stats,  # (batch, head) strides of lse and delta (rows contiguous; batch 0 when packed)
    dk_ptr, stride_dk,  # fp32 output, k's shape
    dv_ptr, stride_dv,  # fp32 output, v's shape
    sequences,  # SequenceTable: (n,) int32 q_starts, seqlens_q, k_starts, seqlens_k
    softmax_scale, softcap, nheads_k,
    mask,  # the mask group, AttentionMask.kernel_args() (unpacked in kernels.masks)
    GROUP: tl.constexpr, SOFTCAP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    TILE: tl.constexpr,  # Tile(BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV) (kernels.launch)
    DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    """``dK``, ``dV`` of ``BLOCK_N`` keys of one (sequence, KV head), summed over its ``GROUP``
    query heads."""
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    BLOCK_D: tl.constexpr = TILE.BLOCK_D
    BLOCK_DV: tl.constexpr = TILE.BLOCK_DV
    # float32, as on a GPU (the interpreter passes Python floats on, fp64 when subnormal)
    softmax_scale, softcap = tl.cast(softmax_scale, tl.float32), tl.cast(softcap, tl.float32)
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    b, hk = (pid_bh // nheads_k).to(tl.int64), (pid_bh % nheads_k).to(tl.int64)
    q_start, seqlen_q, k_start, seqlen_k = _sequence(sequences, b)
    if pid_n * BLOCK_N < seqlen_k:  # programs past the sequence's keys have nothing to do
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) the sequence's keys
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)  # (BLOCK_N, BLOCK_D)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)  # (BLOCK_N, BLOCK_DV)
        n_end = tl.minimum(pid_n * BLOCK_N + BLOCK_N, seqlen_k)  # one past this program's last key
        for g in range(GROUP):  # the query heads of this KV head (GQA): dK/dV sum over them
            q_head, k_head, v_head, do_head, lse_head, delta_head = _head_pointers(
                q_ptr, stride_q, k_ptr, stride_k, v_ptr, stride_v, dout_ptr, stride_do, lse_ptr,
                delta_ptr, stride_stats, b, hk * GROUP + g, q_start, k_start, GROUP)
            # the same k, v tiles for every g: one load per query head, beside the s_q / BLOCK_M q
            # tiles it streams
            # (BLOCK_N, BLOCK_D), (BLOCK_N, BLOCK_DV)
            k = _load_rows(k_head, offs_n, seqlen_k, stride_k[1], D, BLOCK_D, DTYPE)
            v = _load_rows(v_head, offs_n, seqlen_k, stride_v[1], DV, BLOCK_DV, DTYPE)
            for m0 in range(0, seqlen_q, BLOCK_M):
                # the keys some row of this query block sees, among this program's: none, skip it
                lo, hi, _, _ = tile_key_range(mask, m0, tl.minimum(m0 + BLOCK_M, seqlen_q),
                                              seqlen_q, seqlen_k, pid_n * BLOCK_N, n_end)
                if lo < hi:
                    offs_m = m0 + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query rows
                    # (BLOCK_M, BLOCK_D), (BLOCK_M, BLOCK_DV)
                    q = _load_rows(q_head, offs_m, seqlen_q, stride_q[1], D, BLOCK_D, DTYPE)
                    do = _load_rows(do_head, offs_m, seqlen_q, stride_do[1], DV, BLOCK_DV, DTYPE)
                    lse, delta = _row_stats(lse_head, delta_head, offs_m, seqlen_q)
                    p, softcap_grad = _probabilities(q, k, lse, offs_m, offs_n, seqlen_q, seqlen_k,
                                                     softmax_scale, softcap, mask, SOFTCAP,
                                                     PRECISION)  # (BLOCK_M, BLOCK_N) each
                    # dV = Pᵀ dO: (BLOCK_N, BLOCK_DV)
                    dv += tl.dot(tl.trans(p.to(DTYPE)), do, input_precision=PRECISION)
                    ds = _dscores(p, do, v, delta, softcap_grad, SOFTCAP, PRECISION)
                    # dK = dSᵀ Q (· scale): (BLOCK_N, BLOCK_D)
                    dk += tl.dot(tl.trans(ds.to(DTYPE)), q, input_precision=PRECISION)
        _store_rows(_at(dk_ptr, stride_dk, b, hk, k_start), dk * softmax_scale, offs_n, seqlen_k,
                    stride_dk[1], D, BLOCK_D)
        _store_rows(_at(dv_ptr, stride_dv, b, hk, k_start), dv, offs_n, seqlen_k, stride_dv[1], DV,
                    BLOCK_DV)


@triton.jit
def _dq_kernel(
    q_ptr, stride_q,  # (b, S_q, h, d) or (total_q, h, d); strides (batch, row, head)
    k_ptr, stride_k,  # (b, S_k, h_k, d) or (total_k, h_k, d)
    v_ptr, stride_v,  # (b, S_k, h_k, d_v) or (total_k, h_k, d_v)
    dout_ptr, stride_do,  # (b, S_q, h, d_v) or (total_q, h, d_v)
    lse_ptr, delta_ptr,  # fp32 (b, h, S_q) or (h, total_q)
    stride_stats,  # (batch, head) strides of lse and delta (rows contiguous; batch 0 when packed)
    dq_ptr, stride_dq,  # fp32 output, q's shape
    sequences,  # SequenceTable: (n,) int32 q_starts, seqlens_q, k_starts, seqlens_k
    softmax_scale, softcap, nheads,
    mask,  # the mask group, AttentionMask.kernel_args() (unpacked in kernels.masks)
    GROUP: tl.constexpr, SOFTCAP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    TILE: tl.constexpr,  # Tile(BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV) (kernels.launch)
    DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    """``dQ`` of ``BLOCK_M`` query rows of one (sequence, head), over the key blocks the rows can
    see."""
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    BLOCK_D: tl.constexpr = TILE.BLOCK_D
    BLOCK_DV: tl.constexpr = TILE.BLOCK_DV
    # float32, as on a GPU (the interpreter passes Python floats on, fp64 when subnormal)
    softmax_scale, softcap = tl.cast(softmax_scale, tl.float32), tl.cast(softcap, tl.float32)
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = (pid_bh // nheads).to(tl.int64), (pid_bh % nheads).to(tl.int64)
    q_start, seqlen_q, k_start, seqlen_k = _sequence(sequences, b)
    if pid_m * BLOCK_M < seqlen_q:  # programs past the sequence's rows have nothing to do
        q_head, k_head, v_head, do_head, lse_head, delta_head = _head_pointers(
            q_ptr, stride_q, k_ptr, stride_k, v_ptr, stride_v, dout_ptr, stride_do, lse_ptr,
            delta_ptr, stride_stats, b, h, q_start, k_start, GROUP)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) the sequence's rows
        # (BLOCK_M, BLOCK_D), (BLOCK_M, BLOCK_DV)
        q = _load_rows(q_head, offs_m, seqlen_q, stride_q[1], D, BLOCK_D, DTYPE)
        do = _load_rows(do_head, offs_m, seqlen_q, stride_do[1], DV, BLOCK_DV, DTYPE)
        lse, delta = _row_stats(lse_head, delta_head, offs_m, seqlen_q)  # (BLOCK_M,) each
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # (BLOCK_M, BLOCK_D)
        # the keys some row of this block sees, [lo, hi), visited in whole blocks of BLOCK_N
        lo, hi, _, _ = tile_key_range(mask, pid_m * BLOCK_M,
                                      tl.minimum(pid_m * BLOCK_M + BLOCK_M, seqlen_q),
                                      seqlen_q, seqlen_k, 0, seqlen_k)
        for n0 in range((lo // BLOCK_N) * BLOCK_N, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,) keys
            # (BLOCK_N, BLOCK_D), (BLOCK_N, BLOCK_DV)
            k = _load_rows(k_head, offs_n, seqlen_k, stride_k[1], D, BLOCK_D, DTYPE)
            v = _load_rows(v_head, offs_n, seqlen_k, stride_v[1], DV, BLOCK_DV, DTYPE)
            p, softcap_grad = _probabilities(q, k, lse, offs_m, offs_n, seqlen_q, seqlen_k,
                                             softmax_scale, softcap, mask, SOFTCAP, PRECISION)
            ds = _dscores(p, do, v, delta, softcap_grad, SOFTCAP, PRECISION)  # (BLOCK_M, BLOCK_N)
            dq += tl.dot(ds.to(DTYPE), k, input_precision=PRECISION)  # dQ = dS K (· scale)
        _store_rows(_at(dq_ptr, stride_dq, b, h, q_start), dq * softmax_scale, offs_m, seqlen_q,
                    stride_dq[1], D, BLOCK_D)


@triton.jit
def _sequence(sequences, b):
    """``(q_start, seqlen_q, k_start, seqlen_k)`` of sequence ``b`` of the :class:`SequenceTable`
    group ``sequences``: the row of its first query and of its first key in the tensors' row axes
    (int64: they scale strides), and how many of its rows and keys take part (int32)."""
    q_start = tl.load(sequences.q_starts + b).to(tl.int64)
    k_start = tl.load(sequences.k_starts + b).to(tl.int64)
    return q_start, tl.load(sequences.seqlens_q + b), k_start, tl.load(sequences.seqlens_k + b)


@triton.jit
def _head_pointers(
    q_ptr, stride_q, k_ptr, stride_k,  # (b, S_q, h, d), (b, S_k, h_k, d) or packed (total, ·)
    v_ptr, stride_v, dout_ptr, stride_do,  # (b, S_k, h_k, d_v), (b, S_q, h, d_v) or packed
    lse_ptr, delta_ptr,  # fp32 (b, h, S_q) or (h, total_q)
    stride_stats,  # (batch, head) strides of lse and delta
    b, h, q_start, k_start, GROUP: tl.constexpr,
):
    """Where sequence ``b``'s rows of the query head at index ``h`` (``head`` in docs/notation.md)
    and its keys of the KV head ``h // GROUP`` start: the ``[s_q, d]`` view of q, ``[s_k, d]`` of
    k, ``[s_k, d_v]`` of v, ``[s_q, d_v]`` of dO (rows at the inputs' strides) and the ``[s_q]``
    rows of lse and D, from the sequence's first query row ``q_start`` and first key ``k_start``;
    both backward kernels read their tiles from these."""
    hk = h // GROUP
    stats = _stats_at(stride_stats, b, h, q_start)
    return (_at(q_ptr, stride_q, b, h, q_start), _at(k_ptr, stride_k, b, hk, k_start),
            _at(v_ptr, stride_v, b, hk, k_start), _at(dout_ptr, stride_do, b, h, q_start),
            lse_ptr + stats, delta_ptr + stats)


@triton.jit
def _at(ptr, strides, b, h, row):
    """``ptr`` moved to batch entry ``b``, row ``row`` and head ``h`` of a ``(b, S, h, ...)`` tensor
    (packed ``(total, h, ...)``: batch stride 0) with ``strides = (batch, row, head)``: the start of
    the ``[S, ...]`` view of a sequence whose first row is ``row``."""
    return ptr + b * strides[0] + row * strides[1] + h * strides[2]


@triton.jit
def _stats_at(stride_stats, b, h, row):
    """Offset of row ``row`` of head ``h`` and batch entry ``b`` in row statistics (LSE, ``dlse``,
    ``D``) of contiguous rows, ``stride_stats = (batch, head)``: ``(b, h, S_q)`` or packed ``(h,
    total_q)``."""
    return b * stride_stats[0] + h * stride_stats[1] + row


@triton.jit
def _load_rows(ptr, offs, n_rows, stride_s, D: tl.constexpr, BLOCK_D: tl.constexpr,
               DTYPE: tl.constexpr):
    """Rows ``offs`` (BLOCK, BLOCK_D) of a ``[S, d]`` view (stride ``stride_s``), 0 out of
    bounds."""
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    mask = (offs[:, None] < n_rows) & (offs_d[None, :] < D)
    return tl.load(ptr + offs[:, None] * stride_s + offs_d[None, :], mask=mask, other=0.0).to(DTYPE)


@triton.jit
def _store_rows(ptr, x, offs, n_rows, stride_s, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store ``x`` (BLOCK, BLOCK_D) as rows ``offs`` of a ``[S, d]`` view (stride ``stride_s``), in
    bounds."""
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    mask = (offs[:, None] < n_rows) & (offs_d[None, :] < D)
    tl.store(ptr + offs[:, None] * stride_s + offs_d[None, :], x, mask=mask)


@triton.jit
def _row_stats(lse_ptr, delta_ptr, offs_m, seqlen_q):
    """Saved LSE (``-inf`` read as 0: its row has ``P = 0`` anyway) and ``D`` of rows ``offs_m``,
    (BLOCK_M,) each."""
    row_mask = offs_m < seqlen_q
    lse = tl.load(lse_ptr + offs_m, mask=row_mask, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    return lse, tl.load(delta_ptr + offs_m, mask=row_mask, other=0.0)


@triton.jit
def _probabilities(q, k, lse, offs_m, offs_n, seqlen_q, seqlen_k, softmax_scale, softcap,
                   mask, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """``P`` (BLOCK_M, BLOCK_N) fp32 of q rows ``offs_m`` over keys ``offs_n`` (0 where masked), and
    the softcap's factor ``1 - tanh²`` of ``dS`` (same shape; ``P`` itself, unread, without
    SOFTCAP).

    ``q`` (BLOCK_M, BLOCK_D), ``k`` (BLOCK_N, BLOCK_D), ``lse`` (BLOCK_M,) natural log. The logits
    are the forward's in base 2, ``t = ℓ · log2 e`` (:func:`kernels.attention._logits`), so ``P =
    exp2(t - lse · log2 e)`` and ``tanh = t / (softcap · log2 e)``.
    """
    t = _logits(tl.dot(q, tl.trans(k), input_precision=PRECISION), softmax_scale, softcap, SOFTCAP)
    diag = offs_m + (seqlen_k - seqlen_q)  # (BLOCK_M,) i + Δ
    visible = (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
    visible &= visible_keys(mask, offs_n, diag)  # (BLOCK_M, BLOCK_N)
    p = tl.where(visible, tl.exp2(t - lse[:, None] * LOG2E), 0.0)
    if SOFTCAP:
        tanh = t / (softcap * LOG2E)
        softcap_grad = 1.0 - tanh * tanh
    else:
        softcap_grad = p
    return p, softcap_grad


@triton.jit
def _dscores(p, do, v, delta, softcap_grad, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """``dS = P (dP - D)`` (BLOCK_M, BLOCK_N) fp32 with ``dP = dO Vᵀ``, times ``softcap_grad`` with
    SOFTCAP: ``p``, ``softcap_grad`` (BLOCK_M, BLOCK_N), ``do`` (BLOCK_M, BLOCK_DV), ``v`` (BLOCK_N,
    BLOCK_DV), ``delta`` (BLOCK_M,)."""
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * softcap_grad
    return ds
