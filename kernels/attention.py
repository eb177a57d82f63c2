"""The attention forward kernel: decode (sq = 1) and chunked prefill (sq > 1), split-KV, pack-GQA.

For one batch entry (``s_q`` query rows, ``s_k`` valid keys), query row ``i`` and query head
``head`` (KV head ``kv_head = head // g``, ``g = h / h_k``), over the valid keys ``j in [0, s_k)``
at cache positions ``cache_leftpad + j`` (:mod:`attn_ref.attention`)::

    s_ij  = q_i · K_j  (+ qv_i · V_j)        or  qv_i · V_j  alone when ONLY_QV
    ℓ_ij  = scale · s_ij,  or  softcap · tanh(scale · s_ij / softcap)       (before masking)
    ℓ_ij  = -inf where key j is not visible to row i (bottom-right causal / window / chunk)
    lse_i = log(Σ_j e^{ℓ_ij} (+ e^{σ_head}))    out_i = Σ_j e^{ℓ_ij - lse_i} V_j

``scale`` includes ``q_descale · k_descale`` for fp8, whose output is multiplied by ``v_descale``.
With rotary tables q is rotated in fp32 at load (row ``i`` at ``rotary_start + i``, or every row at
``rotary_start`` when the call is neither causal nor local) and split into 16-bit parts ``q = hi +
mid + lo`` (:func:`kernels.numerics.split_parts`), so ``q·K`` keeps the fp32 reference's accuracy.

**Tiling.** One program owns one KV head of one batch entry and ``ROWS = BLOCK_M // g`` query rows;
its M tile packs the ``g`` query heads that share the KV head (pack-GQA), tile entry ``m`` being row
``m // g``, head ``kv_head·g + m % g``. K/V blocks of ``BLOCK_N`` keys are therefore read once for
all ``g`` heads. Grid: ``(cdiv(sq, ROWS), b · h_k, num_splits)`` (varlen: ``max_seqlen_q`` for
``sq``, a static bound; programs past the entry's ``s_q`` rows exit at once).

**Pieces**, in call order, each with a reference twin of the same name (side-by-side page
``attention``): the program :func:`_split_states_kernel` (:func:`attn_ref.attention._split_states`)
places its tile, loads it (:func:`_load_q`), folds the fp8 factors into the scale
(:func:`_dequantize`), takes its split's keys (:func:`kernels.splits.split_bounds`), attends them
(:func:`_attention_with_lse` over :func:`kernels.masks.tile_key_range`; its key loop
:func:`_attend_key_blocks` uses
:func:`_scores`, :func:`_logits` and :func:`kernels.masks.visible_keys`), normalises
(:func:`_softmax_state`) and stores (:func:`_store_state`).

**Online softmax** in fp32 and base 2: logits are kept as ``t = ℓ · log2(e)``, with a running max
``m``, sum ``l = Σ 2^{t - m}`` and ``acc = Σ 2^{t - m} V``. A block rescales by ``2^{m_old -
m_new}``; while a row has seen no visible key its max is ``-inf`` and the shift used is 0, so
nothing becomes NaN. At the end ``out = acc / l`` (0 when ``l = 0``) and ``lse = ln 2 · (m + log2
l)`` (``-inf`` when ``l = 0``): the natural-log LSE of the reference. A sink ``σ_head`` (split 0
only) adds ``2^{σ_head log2 e - m}`` to ``l`` before that.

**Split-KV.** Program ``s`` of the third grid axis covers keys ``[k0, k1)`` of
:func:`attn_ref.splits.split_bounds` (``ceil(s_k / num_splits)`` keys each), so its partial state
is exactly the reference's split ``s``. With ``num_splits = 1`` it writes the final ``out`` (in the
output dtype) and ``lse``; with ``num_splits > 1`` it writes fp32 partials that :mod:`kernels.merge`
combines. The launcher decides which by the pointers and strides it passes; the kernel does not
know.

**Masks** (bottom-right causal = window ``(left, 0)``, sliding window, chunk) are runtime values,
passed as one argument group (:mod:`kernels.masks`): a model's fixed mask compiles one variant.
The mask test and the key range of a tile live in :mod:`kernels.masks`, beside the reference's.

**Block skipping.** Of the key range ``[k0, k1)`` only ``[lo, hi)``, the keys some row of the tile
can see, is visited (:func:`kernels.masks.tile_key_range`). Inside it, ``[full_lo, full_hi)`` holds
the keys every row sees: those blocks run without any mask (``MASKED=False``); the blocks before and
after run masked. So a causal prefill masks only the diagonal blocks and a decode step masks only
its last, partial block.

**Optimisations and their effect** (llm.c style). A row gets a number only from a GPU run, never
from interpreter timings, and no GPU has run these kernels yet: ``benchmarks/gpu_check.sh`` measures
them, and ``benchmarks/results/`` will hold the figures.

Each optimisation, what it saves, and its measured effect:

* pack-GQA M tile: K/V read once per KV head instead of once per query head (G-fold less K/V
  traffic in decode). Measured: not yet (GPU).
* split-KV (``num_splits``): fills the SMs when ``b · h_k · m-blocks`` is small (decode). Measured:
  not yet (GPU).
* block skipping: fully masked key blocks are never loaded (causal prefill: about half). Measured:
  not yet (GPU).
* unmasked inner blocks: no mask arithmetic where every row of the tile sees every key. Measured:
  not yet (GPU).
* base-2 online softmax: ``exp2`` instead of ``exp``, the ``log2(e)`` factor folded into the scale.
  Measured: not yet (GPU).
* the mask as one runtime argument group: a model's fixed mask compiles one variant; the variants
  are listed by ``tests/test_kernel_compile.py``.
* static grid: sized from shapes and bounds with no host read, so the call can be captured in a
  CUDA graph. Measured: host time of the call 350 -> 130-142 µs (CPU, value checks off,
  2026-12-01).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .launch import (
    Launch,
    Tile,
    compute_dtype,
    dot_precision,
    explicit_rounding,
    next_power_of_2,
    rotated_q_parts,
)
from .masks import tile_key_range, visible_keys
from .numerics import LN2, LOG2E, split_parts, store_as, tanh
from .paged import cache_slots
from .rotary import apply_rotary
from .splits import AttentionTiles, split_bounds


def plan_attention(call, out: torch.Tensor, lse: torch.Tensor, num_splits: int,
                   tiles: AttentionTiles) -> Launch:
    """The attention launch for a validated call (:class:`attn_ref.call.KVCacheCall`).

    ``out`` is ``(n, A0, h, rows, dv)`` and ``lse`` ``(n, A0, h, rows)`` with ``A0 = b`` (batched
    queries) or 1 (packed queries, rows = ``total_q``): the final output viewed with a unit split
    axis when ``num_splits == 1``, the fp32 partials otherwise. The kernel reads the per-batch
    values from ``call.batch`` (``(b,)`` int32 tensors, :class:`attn_ref.call.BatchTable`).
    """
    q, qv, kc, vc = call.q, call.qv, call.k_cache, call.v_cache
    g = call.num_heads // call.num_heads_k
    rows_per_tile = tiles.block_m // g
    # a static bound: programs past the entry's s_q rows exit
    m_blocks = triton.cdiv(call.seqlen_q_bound, rows_per_tile)
    packed = call.varlen_q
    call_descales = (call.q_descale, call.k_descale, call.v_descale)
    fp8_descale = call.is_fp8 and any(x is not None for x in call_descales)
    descales = [_descale_or_ones(call, x) if fp8_descale else None for x in call_descales]
    out_strides, lse_strides = list(out.stride()[:4]), list(lse.stride())
    if packed:  # one row axis for all batch entries: the batch index must not move the pointer
        out_strides[1] = lse_strides[1] = 0
    rotary = call.rotary_dim > 0 and not call.only_qv
    args = dict(
        q_ptr=q, qv_ptr=qv, k_cache_ptr=kc, v_cache_ptr=vc,
        stride_kc=tuple(kc.stride()[:3]), stride_vc=tuple(vc.stride()[:3]),
        page_table_ptr=call.page_table,
        rotary_tables=(call.rotary_cos, call.rotary_sin) if rotary else (None, None),
        sinks_ptr=call.sinks, descales=tuple(descales), batch_table=call.batch,
        out_ptr=out, lse_ptr=lse,
        stride_q=_row_strides(q, packed), stride_qv=_row_strides(qv, packed),
        stride_table=call.page_table.stride(0) if call.paged else 0,
        page_size=max(call.page_size, 1),
        stride_rotary=call.rotary_cos.stride(0) if rotary else 0, rotary_dim=call.rotary_dim,
        stride_descale=descales[0].stride(0) if fp8_descale else 0,
        stride_out=tuple(out_strides),
        stride_ls=lse_strides[0], stride_lb=lse_strides[1],
        stride_lh=lse_strides[2], stride_lt=lse_strides[3],
        scales=(call.softmax_scale, call.softcap if call.softcap > 0 else 1.0),
        mask=call.mask.kernel_args(), has_sinks=int(call.sinks is not None), num_splits=num_splits,
    )
    constexprs = dict(
        HEADS=HeadLayout(call.num_heads_k, g, call.head_dim, call.head_dim_v),
        TILE=Tile(tiles.block_m, tiles.block_n, max(16, next_power_of_2(call.head_dim)),
                  max(16, next_power_of_2(call.head_dim_v))),
        # rotary switches only where they matter, so calls without rotary share one variant
        FEATURES=AttentionFeatures(
            PAGED=call.paged, HAS_QV=call.qv is not None and not call.only_qv, ONLY_QV=call.only_qv,
            SOFTCAP=call.softcap > 0, ROTARY=rotary, INTERLEAVED=rotary and call.rotary_interleaved,
            ROTARY_FIXED=rotary and call.rotary_q_fixed_position, HAS_DESCALE=fp8_descale,
        ),
        COMPUTE_DTYPE=compute_dtype(q.dtype), DOT_PRECISION=dot_precision(q.dtype),
        ROUND_TO=explicit_rounding(out.dtype), Q_PARTS=rotated_q_parts(q.dtype) if rotary else 1,
    )
    grid = (m_blocks, call.batch_size * call.num_heads_k, num_splits)
    return Launch(_split_states_kernel, grid, args, constexprs, num_warps=tiles.num_warps,
                  num_stages=tiles.num_stages, dummy_device=vc.device)


def _row_strides(x, packed: bool) -> tuple[int, int, int]:
    """``(batch, token, head)`` strides of q-like ``x``: batched ``(b, sq, h, dim)`` or packed
    ``(total_q, h, dim)`` (batch stride 0; the token index already includes ``q_start``)."""
    if x is None:
        return 0, 0, 0
    return (0, *x.stride()[:2]) if packed else tuple(x.stride()[:3])


def _descale_or_ones(call, descale):
    """A ``(b, h_k)`` fp32 descale factor, or ones when this one was not given."""
    if descale is not None:
        return descale
    return torch.ones(call.batch_size, call.num_heads_k, dtype=torch.float32, device=call.q.device)


class HeadLayout(NamedTuple):
    """The kernel's compile-time head layout (``HEADS``): ``H_K`` KV heads, ``G`` query heads per KV
    head, head dims ``D`` (q, k) and ``DV`` (v, out)."""

    H_K: int
    G: int
    D: int
    DV: int


class AttentionFeatures(NamedTuple):
    """The kernel's compile-time switches (``FEATURES``): a paged cache, qv added to (``HAS_QV``) or
    alone in (``ONLY_QV``) the scores, the logit softcap, rotary q (GPT-J ``INTERLEAVED`` or NeoX
    layout, ``ROTARY_FIXED``: every row at ``rotary_start``), fp8 descale factors."""

    PAGED: bool
    HAS_QV: bool
    ONLY_QV: bool
    SOFTCAP: bool
    ROTARY: bool
    INTERLEAVED: bool
    ROTARY_FIXED: bool
    HAS_DESCALE: bool


# Triton specialises int arguments on divisibility by 16 (for vectorised loads) and on == 1; that
# matters for the cache strides (the K/V stream) but not for per-call scalars or the lse strides
# (written once per program), which would only multiply the compiled variants. It
# specialises every int inside a tuple argument whatever do_not_specialize says, so the groups
# hold values whose specialisation costs little: pointers, the cache strides, the q / qv strides
# (measured: no more variants), the out strides (two more over the feature tests), the float
# scales (floats are not specialised) and the mask, whose values are fixed for a model (a causal or
# sliding-window model compiles one variant; the feature tests' many windows compile about twice
# the variants). The others are parameters of their own.
@triton.jit(do_not_specialize=[
    "stride_table", "page_size", "stride_rotary", "rotary_dim", "stride_descale",
    "stride_ls", "stride_lb", "stride_lh", "stride_lt",
    "has_sinks", "num_splits",
])
def _split_states_kernel(
    q_ptr,  # (b, sq, h, d) or (total_q, h, d)
    qv_ptr,  # (b, sq, h, dv) or (total_q, h, dv) (HAS_QV or ONLY_QV only)
    k_cache_ptr,  # (b_cache, s_cache, h_k, d) or (num_pages, P, h_k, d)
    v_cache_ptr,  # (b_cache, s_cache, h_k, dv) or (num_pages, P, h_k, dv)
    stride_kc, stride_vc,  # (major, minor, head): strides 0, 1, 2 of k_cache, v_cache
    page_table_ptr,  # (b_k, max_pages) int32 (PAGED only)
    rotary_tables,  # (cos_ptr, sin_ptr): (seqlen_rotary, rotary_dim / 2) each (ROTARY only)
    sinks_ptr,  # (h,) sink logits (has_sinks only)
    descales,  # (q, k, v) descale pointers: (b, h_k) fp32 each (HAS_DESCALE only)
    batch_table,  # attn_ref.call.BatchTable: (b,) int32 per batch entry
    # final out (b, sq, h, dv) / (total_q, h, dv), or fp32 partials (n, b, h, sq, dv) / (n, h,
    # total_q, dv)
    out_ptr,
    lse_ptr,  # fp32 (b, h, sq) / (h, total_q), or partials (n, b, h, sq) / (n, h, total_q)
    stride_q, stride_qv,  # (batch, token, head) strides of q and qv (batch 0 when packed)
    stride_table,  # page_table.stride(0)
    page_size,  # P (PAGED only)
    stride_rotary,  # cos.stride(0)
    rotary_dim,  # channels of q rotated (ROTARY only)
    stride_descale,  # descale.stride(0)
    stride_out,  # (split, batch, head, row) strides of out (unused axes: 0)
    stride_ls, stride_lb, stride_lh, stride_lt,  # lse: split, batch, head, row
    scales,  # (softmax_scale, softcap) fp32 (softcap only read with SOFTCAP)
    mask,  # the mask group, AttentionMask.kernel_args() (unpacked in kernels.masks)
    has_sinks,  # 1: add the sink logit of each head (in split 0)
    num_splits,  # n: split s covers keys [s·ceil(s_k/n), (s+1)·ceil(s_k/n)) ∩ [0, s_k)
    HEADS: tl.constexpr,  # HeadLayout(H_K, G, D, DV)
    TILE: tl.constexpr,  # kernels.launch.Tile(BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
    FEATURES: tl.constexpr,  # AttentionFeatures(PAGED, HAS_QV, ONLY_QV, SOFTCAP, ROTARY, ...)
    COMPUTE_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, ROUND_TO: tl.constexpr,
    Q_PARTS: tl.constexpr,  # 16-bit parts of the rotated q (1 without rotary or for fp32 tiles)
):
    """One program: the state of ``ROWS`` query rows x ``g`` heads of one KV head over split
    ``split``."""
    G: tl.constexpr = HEADS.G
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    ROWS: tl.constexpr = BLOCK_M // G  # query rows per tile
    pid_m, pid_bh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    batch, kv_head = pid_bh // HEADS.H_K, pid_bh % HEADS.H_K
    seqlen_q = tl.load(batch_table.seqlens_q + batch)
    if pid_m * ROWS < seqlen_q:
        seqlen_k = tl.load(batch_table.seqlens_k + batch)
        token0 = tl.load(batch_table.q_starts + batch)  # row of this entry's query 0 in q / out
        batch64, kv_head64 = batch.to(tl.int64), kv_head.to(tl.int64)
        # ---- the M tile: ROWS query rows x G heads of this KV head --------------------
        offs_m = tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        rows = pid_m * ROWS + offs_m // G  # (BLOCK_M,) query row i
        heads = (kv_head * G + offs_m % G).to(tl.int64)  # (BLOCK_M,) query head
        row_ok = (offs_m < ROWS * G) & (rows < seqlen_q)  # (BLOCK_M,)
        token = (token0 + rows).to(tl.int64)  # (BLOCK_M,) row in the q / out tensors
        # (BLOCK_D,), (BLOCK_DV,)
        offs_d, offs_dv = tl.arange(0, TILE.BLOCK_D), tl.arange(0, TILE.BLOCK_DV)
        d_ok = _lanes_below(offs_d, HEADS.D, TILE.BLOCK_D)  # (BLOCK_D,) bool
        dv_ok = _lanes_below(offs_dv, HEADS.DV, TILE.BLOCK_DV)  # (BLOCK_DV,) bool
        cos_ptr, sin_ptr = rotary_tables
        q, q_mid, q_lo, qv = _load_q(
            _token_rows(q_ptr, stride_q, batch64, token, heads),
            _token_rows(qv_ptr, stride_qv, batch64, token, heads),
            rows, row_ok, offs_d, offs_dv, d_ok, dv_ok,
            batch_table.rotary_starts + batch, cos_ptr, sin_ptr, stride_rotary, rotary_dim,
            BLOCK_M, TILE.BLOCK_D, TILE.BLOCK_DV, FEATURES.HAS_QV, FEATURES.ONLY_QV,
            FEATURES.ROTARY, FEATURES.INTERLEAVED, FEATURES.ROTARY_FIXED, COMPUTE_DTYPE, Q_PARTS)
        descale_at = batch64 * stride_descale + kv_head
        q_descale_ptr, k_descale_ptr, v_descale_ptr = descales
        # float32, as on a GPU (the interpreter passes Python floats on, fp64 when subnormal)
        softmax_scale, softcap = tl.cast(scales[0], tl.float32), tl.cast(scales[1], tl.float32)
        scale, v_scale = _dequantize(softmax_scale, q_descale_ptr + descale_at,
                                     k_descale_ptr + descale_at, v_descale_ptr + descale_at,
                                     FEATURES.HAS_DESCALE)
        k0, k1 = split_bounds(seqlen_k, split, num_splits)
        # this sequence's KV cache at this KV head (kernels.paged: contiguous rows or pages)
        cache = (k_cache_ptr + kv_head64 * stride_kc[2], v_cache_ptr + kv_head64 * stride_vc[2],
                 stride_kc, stride_vc, page_table_ptr, stride_table, page_size,
                 tl.load(batch_table.cache_rows + batch), tl.load(batch_table.leftpads + batch))
        out, lse = _attention_with_lse(
            (q, q_mid, q_lo, qv), rows, pid_m * ROWS, tl.minimum(pid_m * ROWS + ROWS, seqlen_q),
            seqlen_q, seqlen_k, k0, k1, mask, scale, softcap,
            sinks_ptr + heads, row_ok, (has_sinks != 0) & (split == 0), v_scale, cache,
            (offs_d, offs_dv, d_ok, dv_ok), TILE, FEATURES, COMPUTE_DTYPE, DOT_PRECISION, Q_PARTS)
        split64 = split.to(tl.int64)
        _store_state(out_ptr + split64 * stride_out[0] + batch64 * stride_out[1],
                     lse_ptr + split64 * stride_ls + batch64 * stride_lb, out, lse, heads, token,
                     offs_dv, row_ok, dv_ok, stride_out[2], stride_out[3], stride_lh, stride_lt,
                     ROUND_TO)


@triton.jit
def _token_rows(ptr, strides, batch, token, heads):
    """(BLOCK_M, 1) pointers to channel 0 of each tile entry's row of a q-like tensor: batch entry
    ``batch``, row ``token`` (BLOCK_M,), head ``heads`` (BLOCK_M,), at ``strides = (batch, token,
    head)``."""
    return ptr + batch * strides[0] + token[:, None] * strides[1] + heads[:, None] * strides[2]


@triton.jit
def _lanes_below(offs, N: tl.constexpr, BLOCK: tl.constexpr):
    """(BLOCK,) bool ``offs < N``; a constant all-true mask when ``N == BLOCK``, which the compiler
    folds away (unmasked, vectorised loads)."""
    if N == BLOCK:
        return tl.full((BLOCK,), 1, tl.int1)
    else:
        return offs < N


@triton.jit
def _load_q(
    q_ptrs,  # (BLOCK_M, 1) pointers to channel 0 of each tile entry's q row (not read when ONLY_QV)
    qv_ptrs,  # (BLOCK_M, 1) the same for qv (read with HAS_QV or ONLY_QV only)
    rows, row_ok,  # (BLOCK_M,) int32 query row i, (BLOCK_M,) bool: entries to load
    offs_d, offs_dv, d_ok, dv_ok,  # (BLOCK_D,), (BLOCK_DV,) channel indices and their masks
    rotary_start_ptr,  # () int32: rotary_start, the rotary position of query row 0 (ROTARY only)
    cos_ptr, sin_ptr, stride_rotary, rotary_dim,  # rotary tables (ROTARY only)
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_QV: tl.constexpr, ONLY_QV: tl.constexpr,
    ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, ROTARY_FIXED: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr, Q_PARTS: tl.constexpr,
):
    """``(q, q_mid, q_lo, qv)``: the q tile ``(BLOCK_M, BLOCK_D)`` as ``Q_PARTS`` parts in
    COMPUTE_DTYPE (``q + q_mid + q_lo``: rotated in fp32 at ``rotary_start + i``, or
    ``rotary_start`` when ROTARY_FIXED, and split so that ``q·K`` keeps fp32 accuracy; zero parts
    unused) and the qv tile ``(BLOCK_M,
    BLOCK_DV)`` (zeros without qv)."""
    q = tl.zeros((BLOCK_M, BLOCK_D), dtype=COMPUTE_DTYPE)  # (BLOCK_M, BLOCK_D)
    q_mid = q
    q_lo = q
    if not ONLY_QV:
        q_mask = row_ok[:, None] & d_ok[None, :]  # (BLOCK_M, BLOCK_D)
        if ROTARY:
            if ROTARY_FIXED:
                # (BLOCK_M,) every row at rotary_start
                positions = tl.load(rotary_start_ptr) + 0 * rows
            else:
                positions = tl.load(rotary_start_ptr) + rows  # (BLOCK_M,) row i at rotary_start + i
            # (BLOCK_M, BLOCK_D) fp32
            q_rotated = apply_rotary(q_ptrs, offs_d, q_mask, positions, cos_ptr, sin_ptr,
                                     stride_rotary, rotary_dim, INTERLEAVED)
            q, q_mid, q_lo = split_parts(q_rotated, COMPUTE_DTYPE, Q_PARTS)
        else:
            q = tl.load(q_ptrs + offs_d[None, :], mask=q_mask, other=0.0).to(COMPUTE_DTYPE)
    qv = tl.zeros((BLOCK_M, BLOCK_DV), dtype=COMPUTE_DTYPE)  # (BLOCK_M, BLOCK_DV)
    if HAS_QV or ONLY_QV:
        qv_mask = row_ok[:, None] & dv_ok[None, :]  # (BLOCK_M, BLOCK_DV)
        qv = tl.load(qv_ptrs + offs_dv[None, :], mask=qv_mask, other=0.0).to(COMPUTE_DTYPE)
    return q, q_mid, q_lo, qv


@triton.jit
def _dequantize(softmax_scale, q_descale_ptr, k_descale_ptr, v_descale_ptr,
                HAS_DESCALE: tl.constexpr):
    """fp8: ``(softmax_scale · q_descale · k_descale, v_descale)`` of this batch entry and KV head
    (the pointers are at ``[b, g]``), folded into the logit scale and the output instead of
    multiplying q, K and V; ``(softmax_scale, 1)`` without descales."""
    scale = softmax_scale
    v_scale = 1.0
    if HAS_DESCALE:
        scale = scale * tl.load(q_descale_ptr) * tl.load(k_descale_ptr)
        v_scale = tl.load(v_descale_ptr)
    return scale, v_scale


@triton.jit
def _attention_with_lse(
    q_parts,  # (q, q_mid, q_lo, qv): the q parts, q = q + q_mid + q_lo, and qv (_attend_key_blocks)
    rows,  # (BLOCK_M,) int32: query row i of each tile entry
    row_start, row_end,  # the tile's rows [row_start, row_end)
    seqlen_q, seqlen_k, k0, k1,  # the sequence's lengths; this split's keys [k0, k1)
    mask,  # the mask group, AttentionMask.kernel_args() (unpacked in kernels.masks)
    softmax_scale, softcap,  # fp32 (softcap only read with SOFTCAP)
    # (BLOCK_M,) pointers to each entry's sink logit; (BLOCK_M,) bool; bool
    sink_ptrs, row_ok, add_sink,
    v_scale,  # fp32: output factor (fp8 v_descale, else 1)
    cache,  # the KV cache group of _attend_key_blocks
    channels,  # (offs_d, offs_dv, d_ok, dv_ok): (BLOCK_D,), (BLOCK_DV,) channel indices and masks
    TILE: tl.constexpr, FEATURES: tl.constexpr,  # as the kernel's
    COMPUTE_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, Q_PARTS: tl.constexpr,
):
    """``(out (BLOCK_M, BLOCK_DV), lse (BLOCK_M,))`` fp32: the tile's attention over the keys ``[k0,
    k1)`` of a sequence of ``seqlen_k`` keys, with the masks of the whole sequence (the reference's
    ``attention_with_lse`` with ``key_offset = k0``). Only ``[lo, hi)`` is visited; inside it the
    whole ``BLOCK_N`` blocks of ``[full_lo, full_hi)`` run without a mask, the blocks before and
    after masked."""
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    BLOCK_DV: tl.constexpr = TILE.BLOCK_DV
    diag = rows + seqlen_k - seqlen_q  # (BLOCK_M,) i + Δ, the bottom-right diagonal of each row
    lo, hi, full_lo, full_hi = tile_key_range(mask, row_start, row_end, seqlen_q, seqlen_k, k0, k1)
    unmasked_start = tl.minimum(lo + tl.cdiv(tl.maximum(full_lo - lo, 0), BLOCK_N) * BLOCK_N, hi)
    unmasked_end = unmasked_start + tl.maximum(full_hi - unmasked_start, 0) // BLOCK_N * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)  # (BLOCK_M, BLOCK_DV) Σ 2^{t - m} V
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # (BLOCK_M,) running max of t
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # (BLOCK_M,) Σ 2^{t - m}
    for phase in tl.static_range(3):  # masked head, unmasked middle, masked tail
        if phase == 0:
            start, end = lo, unmasked_start
        elif phase == 1:
            start, end = unmasked_start, unmasked_end
        else:
            start, end = unmasked_end, hi
        acc, m_i, l_i = _attend_key_blocks(
            acc, m_i, l_i, q_parts, start, end, diag, k1, mask, softmax_scale, softcap, cache,
            channels, BLOCK_N, FEATURES.PAGED, FEATURES.HAS_QV, FEATURES.ONLY_QV, FEATURES.SOFTCAP,
            COMPUTE_DTYPE, DOT_PRECISION, Q_PARTS, MASKED=phase != 1,
        )
    return _softmax_state(acc, m_i, l_i, sink_ptrs, row_ok, add_sink, v_scale)


@triton.jit
def _attend_key_blocks(
    acc, m_i, l_i,  # (BLOCK_M, BLOCK_DV) fp32, (BLOCK_M,) fp32, (BLOCK_M,) fp32: running state
    q_parts,  # (q, q_mid, q_lo, qv): the q parts (BLOCK_M, BLOCK_D), qv (BLOCK_M, BLOCK_DV)
    start, end,  # key range [start, end) to visit, in BLOCK_N steps
    diag,  # (BLOCK_M,) int32: i + s_k - s_q, the bottom-right diagonal of each row
    k1,  # int32: end of this split's keys
    mask,  # the mask group, AttentionMask.kernel_args() (unpacked in kernels.masks)
    softmax_scale, softcap,  # fp32
    cache,  # (k_cache_ptr, v_cache_ptr, stride_kc, stride_vc, page_table_ptr, stride_table,
    #         page_size, cache_row, leftpad): the caches at this KV head (+ h·stride_h added),
    #         their (major, minor, head) strides, the sequence's row, pages and left padding
    channels,  # (offs_d, offs_dv, d_ok, dv_ok): (BLOCK_D,), (BLOCK_DV,) channel indices and masks
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    HAS_QV: tl.constexpr, ONLY_QV: tl.constexpr, SOFTCAP: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, Q_PARTS: tl.constexpr,
    MASKED: tl.constexpr,  # False only for blocks every row of the tile fully sees
):
    """Online softmax over the key blocks of ``[start, end)``; returns the updated ``(acc, m_i,
    l_i)``."""
    q, q_mid, q_lo, qv = q_parts
    (k_cache_ptr, v_cache_ptr, stride_kc, stride_vc, page_table_ptr, stride_table, page_size,
     cache_row, leftpad) = cache
    offs_d, offs_dv, d_ok, dv_ok = channels
    for block_start in range(start, end, BLOCK_N):
        offs_n = block_start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices j
        if MASKED:
            key_ok = offs_n < k1  # (BLOCK_N,)
        else:
            key_ok = tl.full((BLOCK_N,), 1, tl.int1)  # the block lies inside [k0, k1): no mask
        positions = leftpad + offs_n  # (BLOCK_N,) cache positions L_b + j
        v_slots = cache_slots(positions, key_ok, cache_row, page_table_ptr, stride_table,
                              stride_vc[0], stride_vc[1], page_size, PAGED)  # (BLOCK_N,) int64
        v = tl.load(v_cache_ptr + v_slots[:, None] + offs_dv[None, :],
                    # (BLOCK_N, BLOCK_DV)
                    mask=key_ok[:, None] & dv_ok[None, :], other=0.0).to(COMPUTE_DTYPE)
        if ONLY_QV:
            k = v  # not read
        else:
            k_slots = cache_slots(positions, key_ok, cache_row, page_table_ptr, stride_table,
                                  stride_kc[0], stride_kc[1], page_size, PAGED)  # (BLOCK_N,) int64
            k = tl.load(k_cache_ptr + k_slots[:, None] + offs_d[None, :],
                        # (BLOCK_N, BLOCK_D)
                        mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(COMPUTE_DTYPE)
        t = _logits(_scores(q, q_mid, q_lo, qv, k, v, HAS_QV, ONLY_QV, DOT_PRECISION, Q_PARTS),
                    softmax_scale, softcap, SOFTCAP)  # (BLOCK_M, BLOCK_N) fp32, base 2
        if MASKED:
            # The mask test (kernels.masks): only the few masked blocks pay for it.
            visible = visible_keys(mask, offs_n, diag)  # (BLOCK_M, BLOCK_N)
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


@triton.jit
def _scores(q, q_mid, q_lo, qv, k, v, HAS_QV: tl.constexpr, ONLY_QV: tl.constexpr,
            DOT_PRECISION: tl.constexpr, Q_PARTS: tl.constexpr):
    """``(BLOCK_M, BLOCK_N)`` fp32 scores ``q·Kᵀ (+ qv·Vᵀ)``, or ``qv·Vᵀ`` alone when ONLY_QV, of
    the q parts ``(BLOCK_M, BLOCK_D)``, qv ``(BLOCK_M, BLOCK_DV)``, k ``(BLOCK_N, BLOCK_D)``, v
    ``(BLOCK_N, BLOCK_DV)``."""
    if ONLY_QV:
        s = tl.dot(qv, tl.trans(v), input_precision=DOT_PRECISION)
    else:
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if Q_PARTS > 1:
            s += tl.dot(q_mid, tl.trans(k), input_precision=DOT_PRECISION)
        if Q_PARTS > 2:
            s += tl.dot(q_lo, tl.trans(k), input_precision=DOT_PRECISION)
        if HAS_QV:
            s += tl.dot(qv, tl.trans(v), input_precision=DOT_PRECISION)
    return s


@triton.jit
def _logits(s, softmax_scale, softcap, SOFTCAP: tl.constexpr):
    """Logits in base 2, ``t = ℓ · log2(e)``: ``ℓ = scale · s``, or ``softcap · tanh(scale · s /
    softcap)`` (before the mask), of the scores ``s (BLOCK_M, BLOCK_N)``."""
    if SOFTCAP:
        t = tanh(s * (softmax_scale / softcap)) * (softcap * LOG2E)
    else:
        t = s * (softmax_scale * LOG2E)
    return t


@triton.jit
def _softmax_state(acc, m_i, l_i, sink_ptrs, row_ok, add_sink, v_scale):
    """``(out (BLOCK_M, BLOCK_DV), lse (BLOCK_M,))`` fp32 of the running state (``acc (BLOCK_M,
    BLOCK_DV)``, base-2 ``m_i``, ``l_i (BLOCK_M,)``): with ``add_sink`` the sink logits at
    ``sink_ptrs (BLOCK_M,)`` join ``l``; ``out = v_scale · acc / l`` and ``lse = ln 2 · (m + log2
    l)``, or 0 and ``-inf`` when ``l = 0``."""
    if add_sink:
        sink = tl.load(sink_ptrs, mask=row_ok, other=0.0).to(tl.float32) * LOG2E  # (BLOCK_M,)
        m_fin = tl.maximum(m_i, sink)
        shift = tl.where(m_fin == float("-inf"), 0.0, m_fin)
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.exp2(sink - shift)
        acc = acc * alpha[:, None]
        m_i = m_fin
    has_mass = l_i > 0.0
    inv_l = tl.where(has_mass, 1.0 / tl.where(has_mass, l_i, 1.0), 0.0) * v_scale  # (BLOCK_M,)
    out = acc * inv_l[:, None]  # (BLOCK_M, BLOCK_DV)
    # (BLOCK_M,)
    lse = tl.where(has_mass, (m_i + tl.log2(tl.where(has_mass, l_i, 1.0))) * LN2, float("-inf"))
    return out, lse


@triton.jit
def _store_state(out_ptr, lse_ptr, out, lse, heads, token, offs_dv, row_ok, dv_ok,
                 stride_oh, stride_ot, stride_lh, stride_lt, ROUND_TO: tl.constexpr):
    """Write the tile's state: ``out (BLOCK_M, BLOCK_DV)`` rounded once into the output (or fp32
    partial) dtype and ``lse (BLOCK_M,)``, at head ``heads`` and row ``token`` (``(BLOCK_M,)``
    int64) of ``out_ptr`` / ``lse_ptr`` (already at this split and batch entry)."""
    # (BLOCK_M, BLOCK_DV)
    out_ptrs = out_ptr + heads[:, None] * stride_oh + token[:, None] * stride_ot + offs_dv[None, :]
    store_as(out_ptrs, out, row_ok[:, None] & dv_ok[None, :], ROUND_TO)
    tl.store(lse_ptr + heads * stride_lh + token * stride_lt, lse, mask=row_ok)  # (BLOCK_M,)
