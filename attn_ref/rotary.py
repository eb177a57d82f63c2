"""Rotary position embedding (RoPE), GPT-J (interleaved) and GPT-NeoX (half-split) layouts.

Tables ``cos, sin`` have shape ``(seqlen_rotary, rotary_dim / 2)``; position ``p`` uses row ``p``.
Only the first ``rotary_dim`` channels of a head are rotated; the rest pass through unchanged.
For each pair ``(x1, x2)`` with angle row ``(c, s)``::

    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s

* interleaved (GPT-J): pairs are channels ``(2m, 2m + 1)``;
* not interleaved (GPT-NeoX): pairs are channels ``(m, m + rotary_dim / 2)``.
"""

from __future__ import annotations

import torch


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    """Rotate ``x (n, heads, dim)`` whose token ``t`` sits at ``positions[t]``; returns fp32 ``(n,
    heads, dim)``."""
    half = cos.shape[1]
    c = cos[positions].float()[:, None, :]  # (n, 1, rd/2)
    s = sin[positions].float()[:, None, :]
    x = x.float()
    rotated, rest = x[..., : 2 * half], x[..., 2 * half :]
    if interleaved:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
        y = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = rotated[..., :half], rotated[..., half:]
        y = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((y, rest), dim=-1)
