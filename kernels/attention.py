"""The attention forward kernel: decode (sq = 1) and chunked prefill (sq > 1), split-KV, pack-GQA.

For batch entry ``b``, query row ``i`` and query head ``h`` (KV head ``g = h // G``, ``G = h / h_k``),
over the valid keys ``j in [0, Sk_b)`` at cache positions ``L_b + j`` (:mod:`attn_ref.attention`)::

    s_ij  = q_i · K_j  (+ qv_i · V_j)        or  qv_i · V_j  alone when ONLY_QV
    ℓ_ij  = scale · s_ij,  or  softcap · tanh(scale · s_ij / softcap)       (before masking)
    ℓ_ij  = -inf where key j is not visible to row i (bottom-right causal / window / chunk)
    lse_i = log(Σ_j e^{ℓ_ij} (+ e^{σ_h}))    out_i = Σ_j e^{ℓ_ij - lse_i} V_j

``scale`` includes ``q_descale · k_descale`` for fp8, whose output is multiplied by ``v_descale``.
With rotary tables q is rotated in fp32 at load (row ``i`` at ``P0 + i``, or every row at ``P0``
when the call is neither causal nor local) and split into 16-bit parts ``q = hi + mid + lo``
(:func:`kernels.numerics.split_parts`), so ``q·K`` keeps the fp32 reference's accuracy.

**Tiling.** One program owns one KV head of one batch entry and ``ROWS = BLOCK_M // G`` query rows;
its M tile packs the ``G`` query heads that share the KV head (pack-GQA), tile entry ``m`` being
row ``m // G``, head ``g·G + m % G``. K/V blocks of ``BLOCK_N`` keys are therefore read once for all
``G`` heads. Grid: ``(cdiv(sq, ROWS), b · h_k, num_splits)`` (varlen: ``max_seqlen_q`` for ``sq``, a
static bound; programs past ``Sq_b`` rows exit at once).

**Online softmax** in fp32 and base 2: logits are kept as ``t = ℓ · log2(e)``, with a running max
``m``, sum ``l = Σ 2^{t - m}`` and ``acc = Σ 2^{t - m} V``. A block rescales by ``2^{m_old - m_new}``;
while a row has seen no visible key its max is ``-inf`` and the shift used is 0, so nothing becomes
NaN. At the end ``out = acc / l`` (0 when ``l = 0``) and ``lse = ln 2 · (m + log2 l)`` (``-inf`` when
``l = 0``): the natural-log LSE of the reference. A sink ``σ_h`` (split 0 only) adds ``2^{σ_h log2 e - m}``
to ``l`` before that.

**Split-KV.** Program ``s`` of the third grid axis covers keys ``[k0, k1)`` of
:func:`attn_ref.splits.split_bounds` (``ceil(Sk_b / n)`` keys each), so its partial state is exactly
the reference's split ``s``. With ``n = 1`` it writes the final ``out`` (in the output dtype) and
``lse``; with ``n > 1`` it writes fp32 partials that :mod:`kernels.merge` combines. The launcher
decides which by the pointers and strides it passes; the kernel does not know.

**Masks** (bottom-right causal = window ``(left, 0)``, sliding window, chunk) are runtime values, so
one compiled variant serves every mask; Triton's integer specialisation is switched off for them.
The mask test and the key range of a tile live in :mod:`kernels.masks`, beside the reference's.

**Block skipping.** Of the key range ``[k0, k1)`` only ``[lo, hi)``, the keys some row of the tile can
see, is visited (:func:`kernels.masks.tile_key_range`). Inside it, ``[full_lo, full_hi)`` holds the
keys every row sees: those blocks run without any mask (``MASKED=False``); the blocks before and
after run masked. So a causal prefill
masks only the diagonal blocks and a decode step masks only its last, partial block.

**Optimisations and their effect** (llm.c style). A row gets a number only from a GPU run, never
from interpreter timings, and no GPU has run these kernels yet: ``benchmarks/gpu_check.sh`` measures
them, and ``benchmarks/results/`` will hold the figures.

| optimisation | what it saves | measured |
|---|---|---|
| pack-GQA M tile | K/V read once per KV head instead of once per query head (G-fold less K/V traffic in decode) | not yet (GPU) |
| split-KV (`num_splits`) | fills the SMs when `b · h_k · m-blocks` is small (decode) | not yet (GPU) |
| block skipping | fully masked key blocks are never loaded (causal prefill: about half) | not yet (GPU) |
| unmasked inner blocks | no mask arithmetic where every row of the tile sees every key | not yet (GPU) |
| base-2 online softmax | `exp2` instead of `exp`, the `log2(e)` factor folded into the scale | not yet (GPU) |
| one variant per mask | masks are runtime values: one compile serves every window and chunk | variants listed by `tests/test_kernel_compile.py` |
| static grid | sized from shapes and bounds with no host read, so the call can be captured in a CUDA graph | host time of the call 350 -> 130-142 µs (CPU, value checks off, 2026-12-01) |
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import Launch, compute_dtype, dot_precision, explicit_rounding, next_power_of_2, rotated_q_parts
from .masks import tile_key_range, visible_keys
from .numerics import LN2, LOG2E, split_parts, store_as, tanh
from .paged import cache_slots
from .rotary import apply_rotary
from .splits import AttentionTiles


@triton.jit
def _lanes_below(offs, N: tl.constexpr, BLOCK: tl.constexpr):
    """(BLOCK,) bool ``offs < N``; a constant all-true mask when ``N == BLOCK``, which the compiler
    folds away (unmasked, vectorised loads)."""
    if N == BLOCK:
        return tl.full((BLOCK,), 1, tl.int1)
    else:
        return offs < N


@triton.jit
def _attend_key_blocks(
    acc, m_i, l_i,  # (BLOCK_M, BLOCK_DV) fp32, (BLOCK_M,) fp32, (BLOCK_M,) fp32: running state
    q, q_mid, q_lo,  # (BLOCK_M, BLOCK_D) in COMPUTE_DTYPE: q = q + q_mid + q_lo (Q_PARTS > 1: rotated q)
    qv,  # (BLOCK_M, BLOCK_DV) in COMPUTE_DTYPE (unused without HAS_QV / ONLY_QV)
    start, end,  # key range [start, end) to visit, in BLOCK_N steps
    diag,  # (BLOCK_M,) int32: i + Sk - Sq, the bottom-right diagonal of each row
    k1,  # int32: end of this split's keys
    window_left, window_right, chunk,  # masks: window sides (-1 = unbounded), chunk size (0 = off)
    logit_scale,  # fp32: scale · log2(e), or scale / softcap with SOFTCAP
    softcap_log2,  # fp32: softcap · log2(e) (SOFTCAP only)
    k_cache_ptr, v_cache_ptr,  # caches at this KV head (+ h·stride_h already added)
    page_table_ptr, cache_row, leftpad,
    stride_table, page_size, stride_kc_major, stride_kc_minor, stride_vc_major, stride_vc_minor,
    offs_d, offs_dv,  # (BLOCK_D,), (BLOCK_DV,) channel indices
    d_ok, dv_ok,  # (BLOCK_D,), (BLOCK_DV,) bool: channels below D / DV
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    HAS_QV: tl.constexpr, ONLY_QV: tl.constexpr, SOFTCAP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, Q_PARTS: tl.constexpr,
    MASKED: tl.constexpr,  # False only for blocks every row of the tile fully sees
):
    """Online softmax over the key blocks of ``[start, end)``; returns the updated ``(acc, m_i, l_i)``."""
    for block_start in range(start, end, BLOCK_N):
        offs_n = block_start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices j
        if MASKED:
            key_ok = offs_n < k1  # (BLOCK_N,)
        else:
            key_ok = tl.full((BLOCK_N,), 1, tl.int1)  # the block lies inside [k0, k1): no mask
        positions = leftpad + offs_n  # (BLOCK_N,) cache positions L_b + j
        k_slots = cache_slots(positions, key_ok, cache_row, page_table_ptr, stride_table,
                                stride_kc_major, stride_kc_minor, page_size, PAGED)  # (BLOCK_N,) int64
        v_slots = cache_slots(positions, key_ok, cache_row, page_table_ptr, stride_table,
                                stride_vc_major, stride_vc_minor, page_size, PAGED)  # (BLOCK_N,) int64
        v = tl.load(v_cache_ptr + v_slots[:, None] + offs_dv[None, :],
                    mask=key_ok[:, None] & dv_ok[None, :], other=0.0).to(COMPUTE_DTYPE)  # (BLOCK_N, BLOCK_DV)

        # ---- scores s = q·Kᵀ (+ qv·Vᵀ): (BLOCK_M, BLOCK_N) fp32 ---------------------------------
        if ONLY_QV:
            s = tl.dot(qv, tl.trans(v), input_precision=DOT_PRECISION)
        else:
            k = tl.load(k_cache_ptr + k_slots[:, None] + offs_d[None, :],
                        mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(COMPUTE_DTYPE)  # (BLOCK_N, BLOCK_D)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            if Q_PARTS > 1:
                s += tl.dot(q_mid, tl.trans(k), input_precision=DOT_PRECISION)
            if Q_PARTS > 2:
                s += tl.dot(q_lo, tl.trans(k), input_precision=DOT_PRECISION)
            if HAS_QV:
                s += tl.dot(qv, tl.trans(v), input_precision=DOT_PRECISION)

        # ---- logits in base 2, softcap before the mask --------------------------------------
        if SOFTCAP:
            t = tanh(s * logit_scale) * softcap_log2
        else:
            t = s * logit_scale
        if MASKED:
            # The mask test (kernels.masks): only the few masked blocks pay for it.
            visible = visible_keys(offs_n, diag, window_left, window_right, chunk)  # (BLOCK_M, BLOCK_N)
            t = tl.where(key_ok[None, :] & visible, t, float("-inf"))

        # ---- online softmax update -------------------------------------------------------------
        m_new = tl.maximum(m_i, tl.max(t, 1))  # (BLOCK_M,)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp2(m_i - shift)  # (BLOCK_M,)
        p = tl.exp2(t - shift[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


# Triton specialises int arguments on divisibility by 16 (for vectorised loads) and on == 1; that
# matters for the cache strides (the K/V stream) but not for per-call scalars or the q / out / lse
# strides (read or written once per program), which would only multiply the compiled variants.
@triton.jit(do_not_specialize=[
    "window_left", "window_right", "chunk", "has_sinks", "num_splits", "stride_table", "page_size", "stride_rotary", "rotary_dim",
    "stride_descale", "stride_qb", "stride_qt", "stride_qh", "stride_qvb", "stride_qvt", "stride_qvh",
    "stride_os", "stride_ob", "stride_oh", "stride_ot", "stride_ls", "stride_lb", "stride_lh", "stride_lt",
])
def _attention_with_lse_kernel(
    q_ptr,  # (b, sq, h, d) or (total_q, h, d)
    qv_ptr,  # (b, sq, h, dv) or (total_q, h, dv) (HAS_QV or ONLY_QV only)
    k_cache_ptr,  # (b_cache, s_cache, h_k, d) or (num_pages, P, h_k, d)
    v_cache_ptr,  # (b_cache, s_cache, h_k, dv) or (num_pages, P, h_k, dv)
    page_table_ptr,  # (b_k, max_pages) int32 (PAGED only)
    cos_ptr, sin_ptr,  # (seqlen_rotary, rotary_dim / 2) (ROTARY only)
    sinks_ptr,  # (h,) sink logits (has_sinks only)
    q_descale_ptr, k_descale_ptr, v_descale_ptr,  # (b, h_k) fp32 (HAS_DESCALE only)
    seqlens_q_ptr, q_starts_ptr, cache_rows_ptr, leftpads_ptr, seqlens_k_ptr, rotary_starts_ptr,  # (b,) int32
    out_ptr,  # final out (b, sq, h, dv) / (total_q, h, dv), or fp32 partials (n, b, h, sq, dv) / (n, h, total_q, dv)
    lse_ptr,  # fp32 (b, h, sq) / (h, total_q), or partials (n, b, h, sq) / (n, h, total_q)
    stride_qb, stride_qt, stride_qh,  # q (stride_qb = 0 when packed)
    stride_qvb, stride_qvt, stride_qvh,  # qv
    stride_kc_major, stride_kc_minor, stride_kc_h,  # k_cache strides 0, 1, 2
    stride_vc_major, stride_vc_minor, stride_vc_h,
    stride_table,  # page_table.stride(0)
    page_size,  # P (PAGED only)
    stride_rotary,  # cos.stride(0)
    rotary_dim,  # channels of q rotated (ROTARY only)
    stride_descale,  # descale.stride(0)
    stride_os, stride_ob, stride_oh, stride_ot,  # out: split, batch, head, row (unused axes: 0)
    stride_ls, stride_lb, stride_lh, stride_lt,  # lse: split, batch, head, row
    softmax_scale, softcap,
    window_left, window_right,  # window sides, -1 = unbounded (causal: window_right = 0)
    chunk,  # attention_chunk, 0 = off
    has_sinks,  # 1: add the sink logit of each head (in split 0)
    num_splits,  # n: split s covers keys [s·ceil(Sk/n), (s+1)·ceil(Sk/n)) ∩ [0, Sk)
    H_K: tl.constexpr, G: tl.constexpr,  # KV heads, query heads per KV head
    D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PAGED: tl.constexpr,
    HAS_QV: tl.constexpr, ONLY_QV: tl.constexpr, SOFTCAP: tl.constexpr,
    ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, ROTARY_FIXED: tl.constexpr,
    HAS_DESCALE: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, ROUND_TO: tl.constexpr,
    Q_PARTS: tl.constexpr,  # 16-bit parts of the rotated q (1 without rotary or for fp32 tiles)
):
    ROWS: tl.constexpr = BLOCK_M // G  # query rows per tile
    pid_m, pid_bh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    batch, kv_head = pid_bh // H_K, pid_bh % H_K
    seqlen_q = tl.load(seqlens_q_ptr + batch)
    if pid_m * ROWS < seqlen_q:
        q_start = tl.load(q_starts_ptr + batch)
        cache_row = tl.load(cache_rows_ptr + batch)
        leftpad = tl.load(leftpads_ptr + batch)
        seqlen_k = tl.load(seqlens_k_ptr + batch)
        batch64 = batch.to(tl.int64)

        # ---- the M tile: ROWS query rows x G heads of this KV head ----------------------------
        offs_m = tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        rows = pid_m * ROWS + offs_m // G  # (BLOCK_M,) query row i
        heads = kv_head * G + offs_m % G  # (BLOCK_M,) query head
        row_ok = (offs_m < ROWS * G) & (rows < seqlen_q)  # (BLOCK_M,)
        token = (q_start + rows).to(tl.int64)  # (BLOCK_M,) row in the q / out tensors
        heads64 = heads.to(tl.int64)
        diag = rows + seqlen_k - seqlen_q  # (BLOCK_M,) i + Δ
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        d_ok = _lanes_below(offs_d, D, BLOCK_D)  # (BLOCK_D,)
        dv_ok = _lanes_below(offs_dv, DV, BLOCK_DV)  # (BLOCK_DV,)

        # ---- load q (rotated in fp32 if needed) and qv ------------------------------------------
        q = tl.zeros((BLOCK_M, BLOCK_D), dtype=COMPUTE_DTYPE)  # (BLOCK_M, BLOCK_D)
        q_mid = q  # (BLOCK_M, BLOCK_D): rotated q = q + q_mid + q_lo, exact to ~fp32
        q_lo = q
        if not ONLY_QV:
            q_rows = q_ptr + batch64 * stride_qb + token[:, None] * stride_qt + heads64[:, None] * stride_qh  # (BLOCK_M, 1)
            q_mask = row_ok[:, None] & d_ok[None, :]
            if ROTARY:
                ro_start = tl.load(rotary_starts_ptr + batch)
                if ROTARY_FIXED:
                    ro_positions = ro_start + 0 * rows  # every row at P0
                else:
                    ro_positions = ro_start + rows  # row i at P0 + i
                q_rotated = apply_rotary(q_rows, offs_d, q_mask, ro_positions, cos_ptr, sin_ptr, stride_rotary,
                                         rotary_dim, INTERLEAVED)  # (BLOCK_M, BLOCK_D) fp32
                q, q_mid, q_lo = split_parts(q_rotated, COMPUTE_DTYPE, Q_PARTS)
            else:
                q = tl.load(q_rows + offs_d[None, :], mask=q_mask, other=0.0).to(COMPUTE_DTYPE)
        qv = tl.zeros((BLOCK_M, BLOCK_DV), dtype=COMPUTE_DTYPE)  # (BLOCK_M, BLOCK_DV)
        if HAS_QV or ONLY_QV:
            qv_ptrs = (qv_ptr + batch64 * stride_qvb + token[:, None] * stride_qvt
                       + heads64[:, None] * stride_qvh + offs_dv[None, :])
            qv = tl.load(qv_ptrs, mask=row_ok[:, None] & dv_ok[None, :], other=0.0).to(COMPUTE_DTYPE)

        # ---- logit scale (fp8: times q_descale · k_descale of this batch entry and KV head) ----
        scale = softmax_scale
        if HAS_DESCALE:
            descale_at = batch64 * stride_descale + kv_head
            scale = scale * tl.load(q_descale_ptr + descale_at) * tl.load(k_descale_ptr + descale_at)
        if SOFTCAP:
            logit_scale = scale / softcap
        else:
            logit_scale = scale * LOG2E
        softcap_log2 = softcap * LOG2E

        # ---- key ranges: this split, the part some row sees, the part every row sees -----------
        split_len = tl.cdiv(seqlen_k, num_splits)
        k0 = tl.minimum(split * split_len, seqlen_k)
        k1 = tl.minimum(k0 + split_len, seqlen_k)
        first_row = pid_m * ROWS
        lo, hi, full_lo, full_hi = tile_key_range(first_row, tl.minimum(first_row + ROWS, seqlen_q), seqlen_q, seqlen_k,
                                                  k0, k1, window_left, window_right, chunk)
        # Unmasked blocks: whole BLOCK_N blocks, counted from lo, lying inside [full_lo, full_hi).
        unmasked_start = tl.minimum(lo + tl.cdiv(tl.maximum(full_lo - lo, 0), BLOCK_N) * BLOCK_N, hi)
        unmasked_end = unmasked_start + tl.maximum(full_hi - unmasked_start, 0) // BLOCK_N * BLOCK_N

        # ---- online softmax over [lo, hi): masked head, unmasked middle, masked tail --------------
        acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        k_head = k_cache_ptr + kv_head.to(tl.int64) * stride_kc_h
        v_head = v_cache_ptr + kv_head.to(tl.int64) * stride_vc_h
        for phase in tl.static_range(3):
            if phase == 0:
                start, end = lo, unmasked_start
            elif phase == 1:
                start, end = unmasked_start, unmasked_end
            else:
                start, end = unmasked_end, hi
            acc, m_i, l_i = _attend_key_blocks(
                acc, m_i, l_i, q, q_mid, q_lo, qv, start, end, diag, k1, window_left, window_right, chunk,
                logit_scale, softcap_log2, k_head, v_head, page_table_ptr, cache_row, leftpad,
                stride_table, page_size, stride_kc_major, stride_kc_minor, stride_vc_major, stride_vc_minor,
                offs_d, offs_dv, d_ok, dv_ok, BLOCK_N, PAGED, HAS_QV, ONLY_QV, SOFTCAP,
                COMPUTE_DTYPE, DOT_PRECISION, Q_PARTS,
                MASKED=phase != 1,
            )

        # ---- finalize: sink (split 0), normalise, natural-log LSE --------------------------------
        if (has_sinks != 0) & (split == 0):
            sink = tl.load(sinks_ptr + heads, mask=row_ok, other=0.0).to(tl.float32) * LOG2E  # (BLOCK_M,)
            m_fin = tl.maximum(m_i, sink)
            shift = tl.where(m_fin == float("-inf"), 0.0, m_fin)
            alpha = tl.exp2(m_i - shift)
            l_i = l_i * alpha + tl.exp2(sink - shift)
            acc = acc * alpha[:, None]
            m_i = m_fin
        has_mass = l_i > 0.0
        inv_l = tl.where(has_mass, 1.0 / tl.where(has_mass, l_i, 1.0), 0.0)  # (BLOCK_M,)
        if HAS_DESCALE:
            inv_l = inv_l * tl.load(v_descale_ptr + descale_at)
        out = acc * inv_l[:, None]  # (BLOCK_M, BLOCK_DV) fp32
        lse = tl.where(has_mass, (m_i + tl.log2(tl.where(has_mass, l_i, 1.0))) * LN2, float("-inf"))  # (BLOCK_M,)

        split64 = split.to(tl.int64)
        out_ptrs = (out_ptr + split64 * stride_os + batch64 * stride_ob + heads64[:, None] * stride_oh
                    + token[:, None] * stride_ot + offs_dv[None, :])  # (BLOCK_M, BLOCK_DV)
        store_as(out_ptrs, out, row_ok[:, None] & dv_ok[None, :], ROUND_TO)
        lse_ptrs = lse_ptr + split64 * stride_ls + batch64 * stride_lb + heads64 * stride_lh + token * stride_lt
        tl.store(lse_ptrs, lse, mask=row_ok)


def plan_attention(call, meta: dict, out: torch.Tensor, lse: torch.Tensor, num_splits: int,
                   tiles: AttentionTiles) -> Launch:
    """The attention launch for a validated call (:class:`attn_ref.validation.KVCacheCall`).

    ``out`` is ``(n, A0, h, rows, dv)`` and ``lse`` ``(n, A0, h, rows)`` with ``A0 = b`` (batched
    queries) or 1 (packed queries, rows = ``total_q``): the final output viewed with a unit split
    axis when ``num_splits == 1``, the fp32 partials otherwise. ``meta`` holds the per-batch int32
    tensors of :func:`kernels.kvcache.batch_metadata`.
    """
    q, qv, kc, vc = call.q, call.qv, call.k_cache, call.v_cache
    g = call.num_heads // call.num_heads_k
    rows_per_tile = tiles.block_m // g
    m_blocks = triton.cdiv(call.seqlen_q_bound, rows_per_tile)  # a static bound: programs past Sq_b exit
    packed = call.varlen_q
    fp8_descale = call.is_fp8 and any(x is not None for x in (call.q_descale, call.k_descale, call.v_descale))
    descales = [_descale_or_ones(call, x) if fp8_descale else None
                for x in (call.q_descale, call.k_descale, call.v_descale)]
    out_strides, lse_strides = list(out.stride()[:4]), list(lse.stride())
    if packed:  # one row axis for all batch entries: the batch index must not move the pointer
        out_strides[1] = lse_strides[1] = 0
    rotary = call.rotary_dim > 0 and not call.only_qv
    args = dict(
        q_ptr=q, qv_ptr=qv, k_cache_ptr=kc, v_cache_ptr=vc, page_table_ptr=call.page_table,
        cos_ptr=call.rotary_cos if rotary else None, sin_ptr=call.rotary_sin if rotary else None,
        sinks_ptr=call.sinks, q_descale_ptr=descales[0], k_descale_ptr=descales[1], v_descale_ptr=descales[2],
        seqlens_q_ptr=meta["seqlens_q"], q_starts_ptr=meta["q_starts"], cache_rows_ptr=meta["cache_rows"],
        leftpads_ptr=meta["leftpads"], seqlens_k_ptr=meta["seqlens_k"], rotary_starts_ptr=meta["rotary_starts"],
        out_ptr=out, lse_ptr=lse,
        **_row_strides("stride_q", q, packed), **_row_strides("stride_qv", qv, packed),
        stride_kc_major=kc.stride(0), stride_kc_minor=kc.stride(1), stride_kc_h=kc.stride(2),
        stride_vc_major=vc.stride(0), stride_vc_minor=vc.stride(1), stride_vc_h=vc.stride(2),
        stride_table=call.page_table.stride(0) if call.paged else 0, page_size=max(call.page_size, 1),
        stride_rotary=call.rotary_cos.stride(0) if rotary else 0, rotary_dim=call.rotary_dim,
        stride_descale=descales[0].stride(0) if fp8_descale else 0,
        stride_os=out_strides[0], stride_ob=out_strides[1], stride_oh=out_strides[2], stride_ot=out_strides[3],
        stride_ls=lse_strides[0], stride_lb=lse_strides[1], stride_lh=lse_strides[2], stride_lt=lse_strides[3],
        softmax_scale=call.softmax_scale, softcap=call.softcap if call.softcap > 0 else 1.0,
        window_left=call.window_size[0], window_right=call.window_size[1], chunk=call.attention_chunk,
        has_sinks=int(call.sinks is not None), num_splits=num_splits,
    )
    constexprs = dict(
        H_K=call.num_heads_k, G=g, D=call.head_dim, DV=call.head_dim_v,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        BLOCK_D=max(16, next_power_of_2(call.head_dim)), BLOCK_DV=max(16, next_power_of_2(call.head_dim_v)),
        PAGED=call.paged,
        HAS_QV=call.qv is not None and not call.only_qv, ONLY_QV=call.only_qv, SOFTCAP=call.softcap > 0,
        # rotary switches only where they matter, so calls without rotary share one variant
        ROTARY=rotary, INTERLEAVED=rotary and call.rotary_interleaved,
        ROTARY_FIXED=rotary and call.rotary_q_fixed_position, HAS_DESCALE=fp8_descale,
        COMPUTE_DTYPE=compute_dtype(q.dtype), DOT_PRECISION=dot_precision(q.dtype),
        ROUND_TO=explicit_rounding(out.dtype), Q_PARTS=rotated_q_parts(q.dtype) if rotary else 1,
    )
    grid = (m_blocks, call.batch_size * call.num_heads_k, num_splits)
    return Launch(_attention_with_lse_kernel, grid, args, constexprs, num_warps=tiles.num_warps,
                  num_stages=tiles.num_stages, dummy_device=vc.device)


def _row_strides(prefix: str, x, packed: bool) -> dict[str, int]:
    """``(batch, token, head)`` strides of q-like ``x``: batched ``(b, sq, h, dim)`` or packed
    ``(total_q, h, dim)`` (batch stride 0; the token index already includes ``q_start``)."""
    if x is None:
        return {prefix + "b": 0, prefix + "t": 0, prefix + "h": 0}
    b, t, h = (0, *x.stride()[:2]) if packed else x.stride()[:3]
    return {prefix + "b": b, prefix + "t": t, prefix + "h": h}


def _descale_or_ones(call, descale):
    """A ``(b, h_k)`` fp32 descale factor, or ones when this one was not given."""
    if descale is not None:
        return descale
    return torch.ones(call.batch_size, call.num_heads_k, dtype=torch.float32, device=call.q.device)
