"""Rotary position embedding inside a kernel (mirrors :mod:`attn_ref.rotary`).

Tables ``cos, sin`` are ``(seqlen_rotary, rotary_dim / 2)``; a token at position ``pos`` uses row
``pos``. Channel ``c < rotary_dim`` is rotated with its pair partner ``c'`` and angle index ``m``::

    y_c = x_c * cos[pos, m] + sign_c * x_{c'} * sin[pos, m]

* interleaved (GPT-J): pairs ``(2m, 2m+1)``: ``c' = c xor 1``, ``m = c // 2``, sign ``-1`` on even
  ``c``;
* GPT-NeoX: pairs ``(m, m + rotary_dim/2)``: ``c' = c ± rotary_dim/2``, ``m = c mod rotary_dim/2``,
  sign ``-1`` on the first half.

Channels ``c >= rotary_dim`` pass through (``cos = 1``, ``sin = 0``). This is the reference's
``y1 = x1 c - x2 s``, ``y2 = x2 c + x1 s`` written per channel, so one tile load of ``x`` and one of
its partners do the whole rotation. Used for the new keys (:mod:`kernels.append`) and for q
(:mod:`kernels.attention`).
"""

import triton
import triton.language as tl


@triton.jit
def apply_rotary(
    row_ptrs,  # (R, 1) pointers to channel 0 of each token
    offs_d,  # (BLOCK_D,) channel indices
    mask,  # (R, BLOCK_D) bool: elements to load
    positions,  # (R,) int32 rotary positions of the tokens
    cos_ptr,  # (seqlen_rotary, rotary_dim / 2)
    sin_ptr,  # (seqlen_rotary, rotary_dim / 2)
    stride_rotary,  # cos.stride(0) (== sin.stride(0))
    rotary_dim,  # channels rotated (runtime: one compiled variant for every rotary_dim)
    INTERLEAVED: tl.constexpr,
):
    """Load ``x`` (R, BLOCK_D) and return it rotated, in fp32."""
    half = rotary_dim // 2
    rotated = offs_d < rotary_dim  # (BLOCK_D,)
    if INTERLEAVED:
        partner = offs_d ^ 1
        angle = offs_d // 2
        sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
    else:
        partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
        # c mod half, for the rotated c < 2·half
        angle = tl.where(offs_d < half, offs_d, offs_d - half)
        sign = tl.where(offs_d < half, -1.0, 1.0)
    partner = tl.where(rotated, partner, offs_d)  # (BLOCK_D,)
    x = tl.load(row_ptrs + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)  # (R, BLOCK_D)
    # (R, BLOCK_D)
    x_partner = tl.load(row_ptrs + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    table = positions.to(tl.int64)[:, None] * stride_rotary + angle[None, :]  # (R, BLOCK_D)
    table_mask = mask & rotated[None, :]
    cos = tl.load(cos_ptr + table, mask=table_mask, other=1.0).to(tl.float32)  # (R, BLOCK_D)
    sin = tl.load(sin_ptr + table, mask=table_mask, other=0.0).to(tl.float32)  # (R, BLOCK_D)
    return x * cos + sign[None, :] * x_partner * sin
