"""Process groups of Ulysses x ring sequence parallelism, laid out as sglang and yunchang do.

``P = U x R`` consecutive ranks form one sequence-parallel (SP) group; a world of ``N`` ranks holds
``N / P`` of them (data-parallel replicas, outermost). Inside an SP group, with SP ranks ``0..P-1``
(sglang's default ``use_ulysses_low=True``):

* **Ulysses groups** are contiguous: ``{g·U, ..., g·U + U - 1}`` for ``g = 0..R-1``. The all-to-all
  needs full bisection bandwidth, so it stays inside a node.
* **Ring groups** are strided: ``{u, u + U, ..., u + (R-1)·U}`` for ``u = 0..U-1``. Ring peers hold
  the same heads (Ulysses slot ``u``) of different sequence blocks, which is what the ring merge
  needs.

Example, U=2, R=2, SP ranks [0, 1, 2, 3]: Ulysses {0,1}, {2,3}; ring {0,2}, {1,3}.
SP rank ``p`` has Ulysses rank ``p % U`` and ring rank ``p // U``.

A group of one rank is :data:`SELF_GROUP`: nothing to communicate, and no process group is needed,
so world size 1 works without ``torch.distributed`` being initialised. (``None`` is not used for it:
``group=None`` means the default group, as everywhere in ``torch.distributed``.)

Groups with the same ranks are created once and shared (by every later
:func:`init_sequence_parallel_groups` call, e.g. a ``2 x 2`` and a ``4 x 1`` layout share their SP
group of all four ranks), so ranks that hold different layouts of the same ranks still meet in one
process group, where :mod:`.agreement` can tell them apart instead of hanging.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

from ..error_notes import catalogued
from .checks import check_positive_int
from .comm import SELF_GROUP, Group, group_size

#: Process groups created so far, by their ranks, with the default group they were created under.
_CREATED: dict[tuple[int, ...], tuple[object, dist.ProcessGroup]] = {}


@dataclass(frozen=True)
class SequenceParallelGroups:
    """This rank's SP layout.

    Attributes:
        sp_group: all ``U x R`` ranks (K/V gather, UlyssesAttention), or :data:`SELF_GROUP` for one
            rank.
        ulysses_group: this rank's Ulysses group (USP all-to-alls), or :data:`SELF_GROUP` when ``U
            == 1``.
        ring_group: this rank's ring group (ring exchange), or :data:`SELF_GROUP` when ``R == 1``.
        ulysses_degree: ``U``, the ranks of a Ulysses group.
        ring_degree: ``R``, the ranks of a ring group.
        sp_rank: this rank's index in its SP group, ``ring_rank x U + ulysses_rank``.
    """

    sp_group: Group
    ulysses_group: Group
    ring_group: Group
    ulysses_degree: int
    ring_degree: int
    sp_rank: int

    @property
    def sp_size(self) -> int:
        return self.ulysses_degree * self.ring_degree

    @property
    def ulysses_rank(self) -> int:
        return self.sp_rank % self.ulysses_degree

    @property
    def ring_rank(self) -> int:
        return self.sp_rank // self.ulysses_degree

    @classmethod
    def single(cls) -> "SequenceParallelGroups":
        """One rank, no communication."""
        return cls(SELF_GROUP, SELF_GROUP, SELF_GROUP, 1, 1, 0)

    @classmethod
    def from_world(cls) -> "SequenceParallelGroups":
        """Ulysses over the whole default group (``U = world size``, ``R = 1``), creating no group.

        A single rank when ``torch.distributed`` is not initialised.
        """
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return cls.single()
        world = dist.group.WORLD
        return cls(world, world, SELF_GROUP, dist.get_world_size(), 1, dist.get_rank())


@catalogued
def init_sequence_parallel_groups(
    ulysses_degree: Optional[int] = None, ring_degree: int = 1
) -> SequenceParallelGroups:
    """Create the SP, Ulysses and ring groups of the whole world; returns this rank's.

    Collective: every rank of the default group must call it, with the same arguments (each
    ``torch.distributed.new_group`` is entered by all ranks, in the same order).

    Args:
        ulysses_degree: ``U``; default ``world_size // ring_degree``.
        ring_degree: ``R``. ``world_size`` must be a multiple of ``U x R``.
    """
    initialized = dist.is_initialized()
    world_size = dist.get_world_size() if initialized else 1
    if ulysses_degree is None:
        check_positive_int("ring_degree", ring_degree)
        ulysses_degree = max(1, world_size // ring_degree)
    check_sp_degrees(ulysses_degree, ring_degree, world_size, initialized)
    if not initialized:
        return SequenceParallelGroups.single()
    sp_size, rank = ulysses_degree * ring_degree, dist.get_rank()
    mine: dict[str, Group] = {"sp": SELF_GROUP, "ulysses": SELF_GROUP, "ring": SELF_GROUP}
    for first in range(0, world_size, sp_size):
        sp_ranks = list(range(first, first + sp_size))
        layouts = {
            "sp": [sp_ranks],
            "ulysses": [
                sp_ranks[g * ulysses_degree : (g + 1) * ulysses_degree] for g in range(ring_degree)
            ],
            "ring": [sp_ranks[u::ulysses_degree] for u in range(ulysses_degree)],
        }
        for kind, rank_lists in layouts.items():
            for ranks in rank_lists:
                if len(ranks) == 1:
                    continue  # one rank: no process group needed
                group = _group_of(ranks)
                if rank in ranks:
                    mine[kind] = group
    return SequenceParallelGroups(
        mine["sp"], mine["ulysses"], mine["ring"], ulysses_degree, ring_degree, rank % sp_size
    )


def layout_of(groups: SequenceParallelGroups) -> tuple:
    """What the ranks of one SP group must agree on about their layout: ``(U, R, SP group
    ranks)``."""
    group = groups.sp_group
    ranks = (
        tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
        if group_size(group) > 1
        else ()
    )
    return (groups.ulysses_degree, groups.ring_degree, ranks)


def _group_of(ranks: list[int]) -> dist.ProcessGroup:
    """The process group of ``ranks``, created on first use (collective: every rank calls it in
    turn).

    All the ranks are the default group itself, as :meth:`SequenceParallelGroups.from_world` uses.
    """
    world = dist.group.WORLD
    if len(ranks) == dist.get_world_size():
        return world
    created = _CREATED.get(tuple(ranks))
    # none yet, or made under an earlier init_process_group
    if created is None or created[0] is not world:
        created = (world, dist.new_group(ranks))
        _CREATED[tuple(ranks)] = created
    return created[1]


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_sp_degrees(
    ulysses_degree: int, ring_degree: int, world_size: int, initialized: bool
) -> None:
    """``ulysses_degree x ring_degree`` ranks form one SP group; the world is a whole number of
    them."""
    check_positive_int("ulysses_degree", ulysses_degree)
    check_positive_int("ring_degree", ring_degree)
    sp_size = ulysses_degree * ring_degree
    if sp_size > 1 and not initialized:
        raise ValueError(
            f"ulysses_degree x ring_degree = {ulysses_degree} x {ring_degree} needs "
            "torch.distributed to be initialized (torch.distributed.init_process_group, or "
            "attn_ref.sequence_parallel.launch), but it is not"
        )
    if world_size % sp_size:
        raise ValueError(
            f"world_size ({world_size}) must be a multiple of ulysses_degree x ring_degree "
            f"({ulysses_degree} x {ring_degree} = {sp_size})"
        )
