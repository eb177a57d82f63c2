"""How split-KV (flash-decoding) cuts the key range of one sequence.

With ``num_splits = n`` the keys ``[0, seqlen_k)`` of a sequence are cut into ``n`` consecutive
ranges of ``ceil(seqlen_k / n)`` keys (the last ones may be shorter or empty). Each range gives a
partial attention state; :func:`attn_ref.merge.merge_attention_states` folds them into the answer.
The reference and the kernels use this same function, so their per-split partials agree.
"""

from __future__ import annotations


def split_bounds(seqlen_k: int, num_splits: int) -> list[tuple[int, int]]:
    """``num_splits`` half-open key ranges ``[start, end)`` covering ``[0, seqlen_k)`` in order."""
    length = -(-seqlen_k // num_splits)
    return [(min(s * length, seqlen_k), min((s + 1) * length, seqlen_k)) for s in range(num_splits)]
