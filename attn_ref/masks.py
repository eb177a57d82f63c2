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
:func:`tile_key_range` gives, for a tile of rows, the keys some row sees and those every row sees
(the kernel's block skipping).
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
    key_start: int = 0,
    key_end: Optional[int] = None,
) -> torch.Tensor:
    """Boolean visibility matrix ``(rows, keys)``: ``True`` where row ``i`` may attend key ``j``.

    ``rows`` are query rows ``row_start .. row_end - 1`` and ``keys`` keys ``key_start .. key_end - 1``
    (all of them by default), so long problems can be processed in tiles without building the whole
    matrix.
    """
    row_end = seqlen_q if row_end is None else row_end
    key_end = seqlen_k if key_end is None else key_end
    left, right = window_size
    if causal:
        right = 0
    diag = torch.arange(row_start, row_end, device=device)[:, None] + (seqlen_k - seqlen_q)  # (rows, 1)
    j = torch.arange(key_start, key_end, device=device)[None, :]  # (1, keys)
    visible = torch.ones(row_end - row_start, key_end - key_start, dtype=torch.bool, device=device)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    if attention_chunk > 0:
        start = diag - torch.remainder(diag, attention_chunk)  # floor mod: right for negative diag
        visible &= (j >= start) & (j < start + attention_chunk)
    return visible


def tile_key_range(
    row_start: int,
    row_end: int,
    seqlen_q: int,
    seqlen_k: int,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    key_start: int = 0,
    key_end: Optional[int] = None,
) -> tuple[int, int, int, int]:
    """``(lo, hi, full_lo, full_hi)`` for the tile of query rows ``row_start .. row_end - 1`` (non-empty).

    Of the keys ``[key_start, key_end)`` (all ``seqlen_k`` by default: a split's keys), those that some
    row of the tile sees (:func:`visible_keys`) are exactly ``[lo, hi)`` and those that every row sees
    exactly ``[full_lo, full_hi)`` (empty when ``full_hi <= full_lo``). The kernel visits only
    ``[lo, hi)`` and needs no mask inside ``[full_lo, full_hi)`` (its block skipping). The first row
    bounds the left edge of the union and the right edge of the intersection, the last row the others.
    """
    key_end = seqlen_k if key_end is None else key_end
    left, right = window_size
    if causal:
        right = 0
    first = row_start + seqlen_k - seqlen_q  # i + Δ of the first and the last row
    last = row_end - 1 + seqlen_k - seqlen_q
    lo, hi = key_start, key_end
    full_lo, full_hi = key_start, key_end
    if left >= 0:
        lo = max(lo, first - left)
        full_lo = max(full_lo, last - left)
    if right >= 0:
        hi = min(hi, last + right + 1)
        full_hi = min(full_hi, first + right + 1)
    if attention_chunk > 0:
        c = attention_chunk  # Python's % is a floor modulo, as in visible_keys
        lo = max(lo, first - first % c)
        hi = min(hi, last - last % c + c)
        full_lo = max(full_lo, last - last % c)
        full_hi = min(full_hi, first - first % c + c)
    return lo, max(hi, lo), full_lo, full_hi
