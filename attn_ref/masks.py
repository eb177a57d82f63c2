"""Which keys a query row sees: causal, sliding window and chunked masks, FA3 semantics.

All masks are aligned to the **bottom-right** corner. For a problem with ``seqlen_q`` rows and
``seqlen_k`` keys, row ``i`` sits at key coordinate ``i + Δ`` with ``Δ = seqlen_k - seqlen_q``
(the last query is the last key). Key ``j`` is visible to row ``i`` iff

* window (wl, wr):  ``i + Δ - wl <= j <= i + Δ + wr``  (a side of -1 is unbounded)
* chunk c > 0:      ``start <= j < start + c``, ``start = (i + Δ) - ((i + Δ) mod c)`` (floor mod)

and both hold. Causal is the window ``(-1, 0)``: ``j <= i + Δ`` (with a left side, ``(wl, 0)``).
Example, ``seqlen_q=2, seqlen_k=5``, causal::

    1 1 1 1 0
    1 1 1 1 1

With ``seqlen_q=5, seqlen_k=2`` causal, the first three rows see nothing (their output is 0).
Key ``j`` is the j-th *valid* key; with ``cache_leftpad`` it lives at cache position ``leftpad +
j``.

:class:`AttentionMask` is the one object that says this: it turns FA's options (``causal``,
``window_size``, ``attention_chunk``, read by :func:`_window_pair`, :func:`_chunk_size`) into the
normalised triple ``(window_left, window_right, chunk)`` once, and owns the reference's predicate
(:meth:`AttentionMask.visible_keys`) and the key range of a tile of rows
(:meth:`AttentionMask.tile_key_range`, the kernels' block skipping). The kernels take the same
triple as one argument group (:meth:`AttentionMask.kernel_args`) and test it with their twins in
:mod:`kernels.masks`. :mod:`attn_ref.dense` writes the rule independently, as the specification the
tests check this one against.
"""

from __future__ import annotations

from typing import Optional

import torch

from .argument_checks import _flag, _int64


class AttentionMask:
    """The mask of an attention call, normalised as FA3 does: ``window_left``, ``window_right``
    (-1: unbounded) and ``chunk`` (0: off).

    ``AttentionMask(causal=True)``, ``AttentionMask(window_size=(128, 0))``,
    ``AttentionMask(causal=True, attention_chunk=8192)``: FA's options and their checks (the same
    errors as ``flash_attn_with_kvcache``: a window side must be an int, ``causal`` a bool...).
    Causal sets the right side to 0; a negative side is unbounded; ``attention_chunk`` None or
    ``<= 0`` is off. Immutable, hashable, equal when the masks are equal.
    """

    __slots__ = ("window_left", "window_right", "chunk")

    def __init__(
        self,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        attention_chunk: Optional[int] = 0,
    ) -> None:
        left, right = _window_pair(window_size)
        if _flag("causal", causal):
            right = 0
        chunk = _chunk_size(attention_chunk)
        object.__setattr__(self, "window_left", max(left, -1))
        object.__setattr__(self, "window_right", max(right, -1))
        object.__setattr__(self, "chunk", max(chunk, 0))

    def __setattr__(self, name, value):
        raise AttributeError("AttentionMask is immutable")

    def __eq__(self, other) -> bool:
        return isinstance(other, AttentionMask) and self.kernel_args() == other.kernel_args()

    def __hash__(self) -> int:
        return hash(self.kernel_args())

    def __repr__(self) -> str:
        return (
            f"AttentionMask(window_size=({self.window_left}, {self.window_right}), "
            f"attention_chunk={self.chunk})"
        )

    @property
    def causal(self) -> bool:
        """Exactly the causal mask: keys up to the row's diagonal, no left side, no chunk."""
        return self.window_left < 0 and self.window_right == 0 and self.chunk == 0

    @property
    def window_size(self) -> tuple[int, int]:
        """``(window_left, window_right)``, FA's ``window_size`` of this mask (causal included)."""
        return self.window_left, self.window_right

    @property
    def hides_keys(self) -> bool:
        """Some side or the chunk is bounded (FA3's causal or local mode; rotary moves q with
        it)."""
        return self.window_left >= 0 or self.window_right >= 0 or self.chunk > 0

    def bounded(self, seqlen_q: int, seqlen_k: int) -> AttentionMask:
        """The same mask on problems of at most ``seqlen_q`` rows and ``seqlen_k`` keys, as FA3
        normalises it: a left side ``>= seqlen_k - 1`` or a right side ``>= seqlen_q - 1`` hides no
        key and becomes unbounded (causal keeps its right side 0); a chunk longer than both is the
        same as any longer chunk and is capped at ``max(seqlen_k, seqlen_q, 1)`` (kernels take
        int32)."""
        left = -1 if self.window_left >= seqlen_k - 1 else self.window_left
        right = self.window_right
        if right != 0 and right >= seqlen_q - 1:
            right = -1
        chunk = min(self.chunk, max(seqlen_k, seqlen_q, 1))
        return AttentionMask(window_size=(left, right), attention_chunk=chunk)

    def options(self) -> dict:
        """FA's keyword arguments of this mask: ``AttentionMask(**mask.options()) == mask``, and
        ``flash_attn_with_kvcache(..., **mask.options())`` attends with it."""
        return dict(window_size=self.window_size, attention_chunk=self.chunk)

    def kernel_args(self) -> tuple[int, int, int]:
        """``(window_left, window_right, chunk)``: the kernels' mask argument group."""
        return self.window_left, self.window_right, self.chunk

    def visible_keys(
        self,
        seqlen_q: int,
        seqlen_k: int,
        device: Optional[torch.device] = None,
        row_start: int = 0,
        row_end: Optional[int] = None,
        key_start: int = 0,
        key_end: Optional[int] = None,
    ) -> torch.Tensor:
        """Boolean visibility ``(rows, keys)``: ``True`` where row ``i`` may attend key ``j``.

        ``rows`` are query rows ``row_start .. row_end - 1`` and ``keys`` keys
        ``key_start .. key_end - 1`` (all of them by default), so long problems can be processed in
        tiles without building the whole matrix.
        """
        row_end = seqlen_q if row_end is None else row_end
        key_end = seqlen_k if key_end is None else key_end
        rows = torch.arange(row_start, row_end, device=device)[:, None]  # (rows, 1)
        diag = rows + (seqlen_k - seqlen_q)  # (rows, 1): i + Δ
        j = torch.arange(key_start, key_end, device=device)[None, :]  # (1, keys)
        visible = torch.ones(
            row_end - row_start, key_end - key_start, dtype=torch.bool, device=device
        )
        if self.window_left >= 0:
            visible &= j >= diag - self.window_left
        if self.window_right >= 0:
            visible &= j <= diag + self.window_right
        if self.chunk > 0:
            start = diag - torch.remainder(diag, self.chunk)  # floor mod: right for negative diag
            visible &= (j >= start) & (j < start + self.chunk)
        return visible

    def tile_key_range(
        self,
        row_start: int,
        row_end: int,
        seqlen_q: int,
        seqlen_k: int,
        key_start: int = 0,
        key_end: Optional[int] = None,
    ) -> tuple[int, int, int, int]:
        """``(lo, hi, full_lo, full_hi)`` for the tile of rows ``row_start .. row_end - 1``
        (non-empty).

        Of the keys ``[key_start, key_end)`` (all ``seqlen_k`` by default: a split's keys), those
        that some row of the tile sees (:meth:`visible_keys`) are exactly ``[lo, hi)`` and those
        that every row sees exactly ``[full_lo, full_hi)`` (empty when ``full_hi <= full_lo``). The
        kernel visits only ``[lo, hi)`` and needs no mask inside ``[full_lo, full_hi)`` (its block
        skipping). The first row bounds the left edge of the union and the right edge of the
        intersection, the last row the others.
        """
        key_end = seqlen_k if key_end is None else key_end
        first = row_start + seqlen_k - seqlen_q  # i + Δ of the first and the last row
        last = row_end - 1 + seqlen_k - seqlen_q
        lo, hi = key_start, key_end
        full_lo, full_hi = key_start, key_end
        if self.window_left >= 0:
            lo = max(lo, first - self.window_left)
            full_lo = max(full_lo, last - self.window_left)
        if self.window_right >= 0:
            hi = min(hi, last + self.window_right + 1)
            full_hi = min(full_hi, first + self.window_right + 1)
        if self.chunk > 0:
            c = self.chunk  # Python's % is a floor modulo, as in visible_keys
            lo = max(lo, first - first % c)
            hi = min(hi, last - last % c + c)
            full_lo = max(full_lo, last - last % c)
            full_hi = min(full_hi, first - first % c + c)
        return lo, max(hi, lo), full_lo, full_hi


def _window_pair(window_size) -> tuple[int, int]:
    """``(left, right)`` from ``window_size[0]``, ``window_size[1]`` (FA3 reads only those two)."""
    try:
        sides = _int64(window_size[0]), _int64(window_size[1])
    except (TypeError, IndexError, KeyError):
        sides = None, None
    if None in sides:
        raise ValueError(
            f"window_size must hold two ints (left, right) in int64 range, a negative side meaning "
            f"unbounded, got {window_size!r}"
        )
    return sides


def _chunk_size(attention_chunk) -> int:
    """sglang's ``0 if attention_chunk is None else int(attention_chunk)``; ``<= 0`` is off
    (FA3)."""
    try:
        chunk = _int64(0 if attention_chunk is None else int(attention_chunk))
    except (TypeError, ValueError, OverflowError, RuntimeError):
        chunk = None
    if chunk is None:
        raise ValueError(
            f"attention_chunk must be None or convertible with int() to an int64 (<= 0 = off), "
            f"got {attention_chunk!r}"
        )
    return max(chunk, 0)


#: No mask: every row sees every key.
NO_MASK = AttentionMask()
#: The bottom-right causal mask.
CAUSAL = AttentionMask(causal=True)
