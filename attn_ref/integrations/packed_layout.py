"""A boolean attention mask as one ``flash_attn_varlen_func`` call: which query rows and keys to
pack, the sequences' offsets, and the window; or None when no such call gives the same mask.

The mask ``visible (b, sq, skv)`` says which keys each query row sees (row ``i`` of batch entry
``n`` sees key ``j`` when ``visible[n, i, j]``). A varlen call attends packed sequences: sequence
``s`` is ``nq_s`` query rows and ``nk_s`` keys, and its row ``r`` (``0 <= r < nq_s``) sees key ``c``
when, with FA3's bottom-right causal alignment and ``window_size = (left, 0)``::

    r + nk_s - nq_s - left  <=  c  <=  r + nk_s - nq_s          (no lower bound when left = -1)

:func:`packed_layout` finds such sequences for a mask:

1. **Compact.** Keys that no row of the batch entry sees are dropped (padding, empty cache slots,
   keys out of every row's window), and so are rows that see no key (left-padding queries: their
   output is 0). The kept keys are numbered in order over the whole batch, ``0 .. total_k - 1``;
   the kept rows likewise, ``0 .. total_q - 1``.
2. **Read each row.** Row ``t`` sees packed keys ``lo_t .. hi_t``, which must be contiguous
   (``count_t = hi_t - lo_t + 1``).
3. **Cut sequences.** Row ``t`` continues the sequence of row ``t - 1`` when it sees the next key
   (``hi_t = hi_{t-1} + 1``) and shares keys with it (``lo_t <= hi_{t-1}``); otherwise it starts
   a sequence: a new packed sequence or batch entry (``lo_t > hi_{t-1}``), or a row that sees no
   key of its own (a right-padding query sees the tokens before it: ``hi_t = hi_{t-1}``).
   Sequence ``s`` holds the keys from ``lo`` of its first row to ``hi`` of its last; the keys of
   two sequences may overlap (each sequence gathers its own).
4. **Find the window.** A row whose ``lo`` is past its sequence's first key is cut by a window of
   ``hi_t - lo_t + 1`` keys; ``left`` is the largest of them minus 1 (-1 when no row is cut).
5. **Check.** Every row must see exactly what the call above gives it. If one does not (a
   bidirectional block, a row that sees a key after its own, two different windows, holes inside
   a row's keys), the mask is not a varlen call: None.

The check makes the layout exact by construction: whatever the mask is (left or right padding,
padding between tokens, packed sequences, chunks, a sliding window nobody passed on), the call
computes that mask or the layout is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class PackedLayout:
    """The ``flash_attn_varlen_func`` call of a mask (see the module docstring).

    ``query_batch``/``query_position`` ``(total_q,)`` and ``key_batch``/``key_position``
    ``(total_k,)`` (int64) pick the packed rows and keys out of ``(b, sq, ...)`` and ``(b, skv,
    ...)``, sequence after sequence; ``cu_seqlens_q`` / ``cu_seqlens_k`` ``(n + 1,)`` int32 are
    the sequences' offsets in them; ``window_left`` is FA3's left window (-1: none)."""

    query_batch: torch.Tensor
    query_position: torch.Tensor
    key_batch: torch.Tensor
    key_position: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    window_left: int


def packed_layout(visible: torch.Tensor) -> Optional[PackedLayout]:
    """The varlen call that computes ``visible (b, sq, skv)`` bool exactly, or None."""
    b, sq, skv = visible.shape
    device = visible.device
    used_keys = visible.any(dim=1)  # (b, skv)
    keys_per_entry = used_keys.sum(dim=1)  # (b,)
    first_key = keys_per_entry.cumsum(0) - keys_per_entry  # (b,) packed index of each entry's first
    packed_key = first_key[:, None] + used_keys.cumsum(dim=1) - 1  # (b, skv), valid where used
    key_batch, key_position = used_keys.nonzero(as_tuple=True)  # (used keys,) each, packed order
    query_batch, query_position = visible.any(dim=2).nonzero(as_tuple=True)  # (total_q,) each
    total_q = query_batch.numel()
    empty = torch.zeros(1, dtype=torch.int32, device=device)
    if total_q == 0:
        return PackedLayout(
            query_batch, query_position, key_batch, key_position, empty, empty, 0, 0, -1
        )

    rows = visible[query_batch, query_position].to(torch.int8)  # (total_q, skv)
    first = rows.argmax(dim=1)  # the first key a row sees
    last = skv - 1 - rows.flip(1).argmax(dim=1)  # the last
    lo, hi = packed_key[query_batch, first], packed_key[query_batch, last]  # (total_q,) each
    contiguous = rows.sum(dim=1) == hi - lo + 1

    starts = torch.ones(total_q, dtype=torch.bool, device=device)
    starts[1:] = (hi[1:] != hi[:-1] + 1) | (lo[1:] > hi[:-1])
    sequence = starts.cumsum(0) - 1  # (total_q,) each row's sequence
    q_start = starts.nonzero().flatten()  # (n,) first row of each sequence
    q_end = torch.cat([q_start[1:], q_start.new_tensor([total_q])])
    k_start, k_end = lo[q_start], hi[q_end - 1] + 1  # (n,) each: packed keys
    offset = torch.arange(total_q, device=device) - q_start[sequence]  # row within its sequence
    expected_hi = (k_end - 1 - (q_end - 1 - q_start))[sequence] + offset
    cut = lo > k_start[sequence]
    left = int((hi - lo)[cut].max()) if bool(cut.any()) else -1
    expected_lo = k_start[sequence] if left < 0 else torch.maximum(k_start[sequence], hi - left)
    if not bool((contiguous & (hi == expected_hi) & (lo == expected_lo)).all()):
        return None

    lengths_q, lengths_k = q_end - q_start, k_end - k_start  # (n,) each
    cu_seqlens_k = torch.nn.functional.pad(lengths_k.cumsum(0), (1, 0))
    keys = torch.arange(int(cu_seqlens_k[-1]), device=device)  # the sequences' keys, gathered
    keys = keys + (k_start - cu_seqlens_k[:-1]).repeat_interleave(lengths_k)
    return PackedLayout(
        query_batch,
        query_position,
        key_batch[keys],
        key_position[keys],
        torch.nn.functional.pad(q_end, (1, 0)).to(torch.int32),
        cu_seqlens_k.to(torch.int32),
        int(lengths_q.max()),
        int(lengths_k.max()),
        left,
    )
