"""Which keys a query row sees: causal, sliding window and chunked masks, FA3 semantics.

All masks are aligned to the **bottom-right** corner. For a problem with ``seqlen_q`` rows and
``seqlen_k`` keys, row ``i`` sits at key coordinate ``i + Δ`` with ``Δ = seqlen_k - seqlen_q``
(the last query is the last key). Key ``j`` is visible to row ``i`` iff

* causal:            ``j <= i + Δ``
* window (wl, wr):   ``i + Δ - wl <= j <= i + Δ + wr``  (a side of -1 is unbounded; causal forces wr = 0)
* chunk c > 0:       ``start <= j < start + c`` with ``start = (i + Δ) - ((i + Δ) mod c)`` (floor mod)

and all the conditions that are switched on hold together. Example, ``seqlen_q=2, seqlen_k=5``,
causal::

    1 1 1 1 0
    1 1 1 1 1

With ``seqlen_q=5, seqlen_k=2`` causal, the first three rows see nothing (their output is 0).
Key ``j`` is the j-th *valid* key; with ``cache_leftpad`` it lives at cache position ``leftpad + j``.
"""

from __future__ import annotations

from typing import Optional

import torch


def visible_keys(
    seqlen_q: int,
    seqlen_k: int,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    device: Optional[torch.device] = None,
    row_start: int = 0,
    row_end: Optional[int] = None,
) -> torch.Tensor:
    """Boolean visibility matrix ``(rows, seqlen_k)``: ``True`` where row ``i`` may attend key ``j``.

    ``rows`` are query rows ``row_start .. row_end - 1`` (all rows by default), so long problems can
    be processed in row chunks without building the whole matrix.
    """
    row_end = seqlen_q if row_end is None else row_end
    left, right = window_size
    if causal:
        right = 0
    diag = torch.arange(row_start, row_end, device=device)[:, None] + (seqlen_k - seqlen_q)  # (rows, 1)
    j = torch.arange(seqlen_k, device=device)[None, :]  # (1, sk)
    visible = torch.ones(row_end - row_start, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    if attention_chunk > 0:
        start = diag - torch.remainder(diag, attention_chunk)  # floor mod: right for negative diag
        visible &= (j >= start) & (j < start + attention_chunk)
    return visible
