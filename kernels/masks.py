"""Which keys a query row sees, inside the kernel: the mask test of a tile and the key range of a
tile.

The same bottom-right causal / sliding window / chunk semantics as :mod:`attn_ref.masks`, with the
mask as one argument group of runtime values, ``mask = (window_left, window_right, chunk)``
(:meth:`attn_ref.masks.AttentionMask.kernel_args`): window sides are ``-1`` when unbounded (causal
is ``window_right = 0``), ``chunk`` is 0 when off, and a switched-off condition is or-ed with True.
``diag`` is ``i + Δ``, ``Δ = seqlen_k - seqlen_q``, as in the reference.

A launched kernel takes the group as one tuple argument. Triton specialises the ints of a tuple
(divisibility by 16, ``== 1``): a model's mask is fixed, so it compiles one variant; calls with many
different windows compile a few more (the feature tests: about twice the variants).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def visible_keys(mask, keys, diag):
    """(BLOCK_M, BLOCK_N) bool: key ``keys[n]`` (BLOCK_N,) is visible to the row at ``diag[m]``
    (BLOCK_M,) under ``mask = (window_left, window_right, chunk)``."""
    window_left, window_right, chunk = mask
    keys = keys[None, :]  # (1, BLOCK_N)
    left_ok = (keys >= diag[:, None] - window_left) | (window_left < 0)  # (BLOCK_M, BLOCK_N)
    right_ok = (keys <= diag[:, None] + window_right) | (window_right < 0)
    chunk_lo = _chunk_start(diag, tl.maximum(chunk, 1))[:, None]  # (BLOCK_M, 1)
    chunk_ok = ((keys >= chunk_lo) & (keys < chunk_lo + chunk)) | (chunk <= 0)
    return left_ok & right_ok & chunk_ok


@triton.jit
def tile_key_range(mask, row_start, row_end, seqlen_q, seqlen_k, key_start, key_end):
    """``(lo, hi, full_lo, full_hi)`` int32 of :meth:`attn_ref.masks.AttentionMask.tile_key_range`
    for the rows ``row_start .. row_end - 1`` and the keys ``[key_start, key_end)``: the keys some
    row sees are ``[lo, hi)``, those every row sees ``[full_lo, full_hi)``."""
    window_left, window_right, chunk = mask
    first = row_start + seqlen_k - seqlen_q  # i + Δ of the first and the last row
    last = row_end - 1 + seqlen_k - seqlen_q
    lo, hi = key_start, key_end
    full_lo, full_hi = key_start, key_end
    if window_left >= 0:
        lo = tl.maximum(lo, first - window_left)
        full_lo = tl.maximum(full_lo, last - window_left)
    if window_right >= 0:
        hi = tl.minimum(hi, last + window_right + 1)
        full_hi = tl.minimum(full_hi, first + window_right + 1)
    if chunk > 0:
        lo = tl.maximum(lo, _chunk_start(first, chunk))
        hi = tl.minimum(hi, _chunk_start(last, chunk) + chunk)
        full_lo = tl.maximum(full_lo, _chunk_start(last, chunk))
        full_hi = tl.minimum(full_hi, _chunk_start(first, chunk) + chunk)
    return lo, tl.maximum(hi, lo), full_lo, full_hi


@triton.jit
def _chunk_start(x, CHUNK):
    """``x - (x mod CHUNK)`` with a floor modulo (right for negative ``x`` on every backend)."""
    r = x % CHUNK
    return x - tl.where(r < 0, r + CHUNK, r)
