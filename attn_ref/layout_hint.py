"""A hint for the most common layout mistake: tensors in ``(batch, heads, seqlen, dim)`` order.

transformers' attention functions and ``torch.nn.functional.scaled_dot_product_attention`` hold q,
k and v as ``(b, h, s, d)``; ``flash_attn_with_kvcache`` takes ``(b, s, h, d)``. Passed as they are,
the sequence lengths are read as head counts, and the first check that notices is the head-count
divisibility of :func:`attn_ref.validation.check_kvcache_args`. :func:`check_heads_first` runs where
that check fails: when the heads-first reading of the same shapes would divide, it raises the error
with the fix in its message instead. It changes no verdict, only the text of a rejection.
"""

from __future__ import annotations

import torch


def check_heads_first(q: torch.Tensor, k_cache: torch.Tensor, page_table) -> None:
    """Raise the layout hint when q ``(b, h, sq, d)`` and k_cache ``(b_k, h_k, s_k, d)`` (dense, no
    ``page_table``) look heads-first: read that way, ``h_k`` divides ``h``. Called only where
    ``q.shape[2]`` is not a multiple of ``k_cache.shape[2]``."""
    if q.dim() != 4 or page_table is not None:
        return
    heads, heads_k = q.shape[1], k_cache.shape[1]
    if heads_k > 0 and heads % heads_k == 0:
        raise ValueError(
            f"the number of key/value heads ({k_cache.shape[2]}) must divide the number of query "
            "heads "
            f"({q.shape[2]}); q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)} look like "
            "(batch, heads, seqlen, dim), the layout of transformers and "
            "scaled_dot_product_attention: pass q.transpose(1, 2), k_cache.transpose(1, 2) and "
            "v_cache.transpose(1, 2), the (batch, seqlen, "
            f"heads, dim) views flash_attn_with_kvcache takes"
        )
