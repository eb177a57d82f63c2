"""FlashAttention-3's ``flash_attn_combine`` on the Triton merge kernel.

The twin of :func:`attn_ref.flash_attn.flash_attn_combine`: the same arguments, checks
(:func:`attn_ref.flash_attn.check_combine_args`) and return layout
(:func:`attn_ref.flash_attn.combined_to_caller`); the fold of the split states is
:func:`kernels.merge.combine_attention_states`.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_ref.error_notes import catalogued
from attn_ref.flash_attn import check_combine_args, combined_to_caller

from .merge import combine_attention_states


@catalogued
def flash_attn_combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FA3's ``flash_attn_combine``, as :func:`attn_ref.flash_attn.flash_attn_combine`.

    Args:
        out_partial: ``(n, b, s, h, d)``: the partial outputs of ``n`` KV splits.
        lse_partial: ``(n, b, s, h)``: their natural-log LSEs.
        out: ``(b, s, h, d)`` of dtype ``out_dtype``, written and returned; default: a new tensor.
        out_dtype: float32 (default), float16 or bfloat16.

    Returns:
        ``(out (b, s, h, d), softmax_lse (b, s, h))``: ``lse = log Σ_s e^{lse_s}``,
        ``out = Σ_s e^{lse_s - lse} o_s`` in ``out_dtype``; ``softmax_lse`` fp32, a
        ``(b, s, h)`` view of ``(b, h, s)`` memory.
    """
    out_dtype = check_combine_args(out_partial, lse_partial, out, out_dtype)
    merged, lse = combine_attention_states(out_partial, lse_partial)
    return combined_to_caller(merged, lse, out, out_dtype)
