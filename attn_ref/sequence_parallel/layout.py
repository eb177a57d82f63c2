"""Which tokens of a full sequence each SP rank holds: contiguous or zigzag sharding.

SP rank ``p = g·U + u`` (ring rank ``g``, Ulysses rank ``u``; see :mod:`.groups`) holds, of a
sequence of ``S`` tokens:

* **contiguous**: tokens ``[p·S/P, (p+1)·S/P)``. Ulysses group ``g`` together holds block ``g`` of
  ``S/R`` tokens.
* **zigzag** (load-balanced causal ring): cut ``S`` into ``2R`` chunks of ``c = S/(2R)``; ring block
  ``g`` is chunk ``g`` followed by chunk ``2R-1-g``, and Ulysses rank ``u`` holds part ``u`` of
  that block's ``2c`` rows split ``U`` ways. Example ``R=2, U=1, S=8``: rank 0 holds tokens
  ``0 1 6 7``, rank 1 holds ``2 3 4 5``: every rank then has the same causal work.

Replicated tokens (a text prefix/suffix every rank holds whole) are not sharded and not listed here.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..error_notes import catalogued
from .checks import check_positive_int


@catalogued
def shard_positions(
    seq_len: int, sp_rank: int, ulysses_degree: int = 1, ring_degree: int = 1, zigzag: bool = False
) -> torch.Tensor:
    """Global positions (int64, in local row order) of the tokens SP rank ``sp_rank`` holds."""
    check_shard_args(seq_len, sp_rank, ulysses_degree, ring_degree, zigzag)
    world = ulysses_degree * ring_degree
    if not zigzag:
        n = seq_len // world
        return torch.arange(sp_rank * n, (sp_rank + 1) * n)
    g, u = sp_rank // ulysses_degree, sp_rank % ulysses_degree
    c = seq_len // (2 * ring_degree)
    late = 2 * ring_degree - 1 - g  # the chunk paired with chunk g
    block = torch.cat([torch.arange(g * c, (g + 1) * c), torch.arange(late * c, (late + 1) * c)])
    return block.chunk(ulysses_degree)[u]


def shard_sequence(
    x: torch.Tensor,
    sp_rank: int,
    ulysses_degree: int = 1,
    ring_degree: int = 1,
    zigzag: bool = False,
    dim: int = 1,
) -> torch.Tensor:
    """SP rank ``sp_rank``'s part of the full sequence ``x`` (sequence along ``dim``)."""
    positions = shard_positions(x.shape[dim], sp_rank, ulysses_degree, ring_degree, zigzag)
    return x.index_select(dim, positions.to(x.device))


def unshard_sequence(
    shards: Sequence[torch.Tensor],
    ulysses_degree: int = 1,
    ring_degree: int = 1,
    zigzag: bool = False,
    dim: int = 1,
) -> torch.Tensor:
    """Inverse of :func:`shard_sequence`: the full sequence from the shards of SP ranks
    ``0..P-1``."""
    stacked = torch.cat(list(shards), dim=dim)
    seq_len = stacked.shape[dim]
    positions = torch.cat(
        [
            shard_positions(seq_len, p, ulysses_degree, ring_degree, zigzag)
            for p in range(len(shards))
        ]
    )
    return stacked.index_select(dim, torch.argsort(positions).to(stacked.device))


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_shard_args(
    seq_len: int, sp_rank: int, ulysses_degree: int, ring_degree: int, zigzag: bool
) -> None:
    """The rank exists and the sequence splits into equal shards (two chunks per ring rank for
    zigzag)."""
    check_positive_int("ulysses_degree", ulysses_degree)
    check_positive_int("ring_degree", ring_degree)
    world = ulysses_degree * ring_degree
    if isinstance(sp_rank, bool) or not isinstance(sp_rank, int) or not 0 <= sp_rank < world:
        raise ValueError(f"sp_rank must be an int in [0, {world}), got {sp_rank!r}")
    parts = 2 * world if zigzag else world
    if seq_len % parts:
        if zigzag:
            layout = f"2 x ring_degree x ulysses_degree ({parts}) for the zigzag layout"
        else:
            layout = f"the world size ({parts})"
        raise ValueError(f"sequence length ({seq_len}) must be divisible by {layout}")
