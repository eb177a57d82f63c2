"""The three collectives of sequence parallelism, on ``torch.distributed`` process groups.

Layout ``[b, S, h, d]`` (batch, sequence, heads, head_dim). ``group=None`` is the default process
group (``torch.distributed.group.WORLD``), as in ``torch.distributed`` and ring-flash-attention; it
is this rank alone only while ``torch.distributed`` is not initialized. :data:`SELF_GROUP` (or any
group of one rank) is the identity and needs no initialized ``torch.distributed``.

* :func:`all_to_all_4d`: sequence shards <-> head shards (Ulysses). ``scatter_dim=2, gather_dim=1``
  turns "rank r holds tokens block r, all heads" into "rank r holds all tokens, heads block r";
  ``scatter_dim=1, gather_dim=2`` is the exact inverse. Pure data movement: a round trip returns the
  input bit for bit.
* :func:`all_gather`: concatenate every rank's tensor along a dim, in rank order (K/V gather, and
  the heads of replicated outputs).

Both are differentiable, with explicit adjoints: the all-to-all's is the inverse all-to-all, the
all-gather's a reduce-scatter. Gradients are made contiguous before every collective.
* :class:`RingExchange`: send a tensor to the next rank of a ring and receive the previous rank's,
  with ``batch_isend_irecv`` (grouped, so two neighbours never deadlock on each other), started
  before and waited after the compute it overlaps.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ..error_notes import catalogued
from .checks import check_heads_split, check_local_seq_len, check_seq_lens, check_seq_lens_values


class _SelfGroup:
    """The group of this rank alone (MPI's ``COMM_SELF``): every collective over it is the
    identity."""

    def __repr__(self) -> str:
        return "SELF_GROUP"


#: This rank alone: what :class:`SequenceParallelGroups` holds for a Ulysses or ring group of one
#: rank.
SELF_GROUP = _SelfGroup()

#: A process group, None (the default group) or :data:`SELF_GROUP`.
Group = Union[dist.ProcessGroup, None, _SelfGroup]


def group_size(group: Group) -> int:
    """Number of ranks in ``group``: the world for None, 1 for :data:`SELF_GROUP` or without
    torch.distributed."""
    if group is SELF_GROUP or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def group_rank(group: Group) -> int:
    """This rank's index in ``group`` (0 for :data:`SELF_GROUP` or without torch.distributed)."""
    if group is SELF_GROUP or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def heads_of_rank(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Heads ``[rank·h / P, (rank+1)·h / P)`` of ``x [b, S, h, d]``: the block an all-to-all gives
    ``rank``.

    For tokens every rank already holds (replicated), no collective is needed to get them.
    """
    per_rank = x.shape[2] // world
    return x[:, :, rank * per_rank : (rank + 1) * per_rank]


@catalogued
def all_to_all_4d(
    x: torch.Tensor,
    scatter_dim: int = 2,
    gather_dim: int = 1,
    group: Group = None,
    seq_lens: Optional[Sequence[int]] = None,
) -> torch.Tensor:
    """Exchange sequence shards for head shards (``2 -> 1``) or back (``1 -> 2``) over ``group``.

    With ``P`` ranks, rank ``r``, local length ``S / P`` (``seq_lens[i]`` on rank ``i`` when given,
    else equal on every rank) and ``S = sum of the local lengths``:

    * ``scatter_dim=2, gather_dim=1``: ``[b, S / P, h, d] -> [b, S, h / P, d]``. Rank ``r`` receives
      heads ``[r·h / P, (r+1)·h / P)`` of every rank's tokens; rank ``i``'s tokens land at rows
      ``[S_0 + ... + S_{i-1}, ... + S_i)`` (rank order).
    * ``scatter_dim=1, gather_dim=2``: ``[b, S, h / P, d] -> [b, S / P, h, d]``, the inverse.

    ``seq_lens`` (one local length per rank) allows unequal shards (varlen Ulysses).
    """
    world = group_size(group)
    if world == 1:
        return x  # upstream: identity before any check
    check_all_to_all_4d(x, scatter_dim, gather_dim, world, group_rank(group), seq_lens)
    return _AllToAll4D.apply(x, scatter_dim, gather_dim, group, seq_lens)


class _AllToAll4D(torch.autograd.Function):
    """The all-to-all as an autograd Function: its adjoint is the inverse all-to-all.

    The all-to-all only permutes data between ranks, so the gradient of its input is its output's
    gradient sent back the way the data came (scatter and gather dims swapped).
    """

    @staticmethod
    def forward(ctx, x, scatter_dim: int, gather_dim: int, group: Group, seq_lens):
        ctx.dims, ctx.group, ctx.seq_lens = (scatter_dim, gather_dim), group, seq_lens
        return _exchange_4d(x, scatter_dim, gather_dim, group, seq_lens)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return (
            _exchange_4d(grad.contiguous(), gather_dim, scatter_dim, ctx.group, ctx.seq_lens),
            None,
            None,
            None,
            None,
        )


def _exchange_4d(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Group, seq_lens
) -> torch.Tensor:
    """The data movement of :func:`all_to_all_4d` (``P > 1`` ranks, arguments already checked)."""
    world, rank = group_size(group), group_rank(group)
    b, s, h, d = x.shape
    if scatter_dim == 2:
        lens = list(seq_lens) if seq_lens is not None else [s] * world
        hp = h // world
        # [b, S / P, h, d] -> [P, S / P, b, h / P, d]: the block for rank j is contiguous.
        send = x.reshape(b, s, world, hp, d).permute(2, 1, 0, 3, 4).contiguous()
        # rank blocks in order
        recv = torch.empty(sum(lens), b, hp, d, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(
            recv,
            send.reshape(world * s, b, hp, d),
            output_split_sizes=lens,
            input_split_sizes=[s] * world,
            group=group,
        )
        return recv.permute(1, 0, 2, 3)  # [S, b, h / P, d] -> [b, S, h / P, d]
    s_local = seq_lens[rank] if seq_lens is not None else s // world
    lens = list(seq_lens) if seq_lens is not None else [s_local] * world
    # [b, S, h / P, d] -> [S, b, h / P, d]: the rows for rank j are contiguous.
    send = x.permute(1, 0, 2, 3).contiguous()
    # [P, S / P, b, h / P, d]
    recv = torch.empty(world, s_local, b, h, d, dtype=x.dtype, device=x.device)
    dist.all_to_all_single(
        recv.view(world * s_local, b, h, d),
        send,
        output_split_sizes=[s_local] * world,
        input_split_sizes=lens,
        group=group,
    )
    # [P, S / P, b, h / P, d] -> [b, S / P, P, h / P, d] -> [b, S / P, h, d]: head block i came from
    # rank i.
    return recv.permute(2, 1, 0, 3, 4).reshape(b, s_local, world * h, d)


def all_to_all_4d_packed(
    tensors: Sequence[torch.Tensor],
    scatter_dim: int = 2,
    gather_dim: int = 1,
    group: Group = None,
    seq_lens: Optional[Sequence[int]] = None,
) -> list[torch.Tensor]:
    """:func:`all_to_all_4d` of several tensors, those of equal shape and dtype in one collective.

    Tensors of the same shape and dtype (q, k, v without GQA; k and v with it) are concatenated
    along the batch dim, exchanged once and split again; the all-to-all treats batch rows
    independently.
    """
    results: list[Optional[torch.Tensor]] = [None] * len(tensors)
    packs: dict[tuple, list[int]] = {}
    for i, x in enumerate(tensors):
        packs.setdefault((tuple(x.shape), x.dtype), []).append(i)
    for indices in packs.values():
        packed = (
            torch.cat([tensors[i] for i in indices]) if len(indices) > 1 else tensors[indices[0]]
        )
        exchanged = all_to_all_4d(packed, scatter_dim, gather_dim, group, seq_lens)
        for i, part in zip(indices, exchanged.chunk(len(indices))):
            results[i] = part
    return results


@catalogued
def all_gather(x: torch.Tensor, dim: int = -1, group: Group = None) -> torch.Tensor:
    """Concatenate ``x`` of every rank of ``group`` along ``dim``, in rank order.

    Every rank must pass the same shape; ``size[dim]`` grows ``P`` times and rank ``r``'s block sits
    at ``[r·n, (r+1)·n)`` along ``dim``.
    """
    world = group_size(group)
    if world == 1:
        return x  # upstream: identity before the dim check
    check_gather_dim(x, dim)
    return _AllGather.apply(x, dim, group)


class _AllGather(torch.autograd.Function):
    """The all-gather as an autograd Function: its adjoint is a reduce-scatter.

    Every rank's output depends on every rank's input, so the gradient of rank ``r``'s input is the
    sum over ranks of their output gradients' block ``r``. The reduce-scatter is an all-to-all of
    the blocks followed by a local sum in rank order (gloo has no reduce-scatter; the sum order is
    fixed, so the result is deterministic). Gradients are made contiguous first: gloo's collectives
    return wrong data for non-contiguous buffers without an error.
    """

    @staticmethod
    def forward(ctx, x, dim: int, group: Group):
        ctx.dim, ctx.group = dim, group
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(group_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        world = group_size(ctx.group)
        # [P, ...]: block j goes to rank j
        send = torch.stack(grad.chunk(world, dim=ctx.dim)).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=ctx.group)
        return recv.sum(0), None, None


class RingExchange:
    """Pass a tensor one step around a ring: send to rank ``r + 1``, receive from rank ``r - 1``.

    ``recv = exchange.start(x)`` posts the send and the receive and returns at once; ``recv`` is
    valid after ``exchange.wait()``. Peers are addressed by their global rank, as
    ``torch.distributed`` point-to-point calls require even inside a subgroup. ``group=None`` is the
    default group; in a group of one rank, ``recv`` is a copy of ``x``.
    """

    def __init__(self, group: Group = None):
        size, rank = group_size(group), group_rank(group)
        self.group = dist.group.WORLD if group is None else group
        self.size = size
        if size > 1:
            self.next_rank = dist.get_global_rank(self.group, (rank + 1) % size)
            self.prev_rank = dist.get_global_rank(self.group, (rank - 1) % size)
        self._requests: list = []

    def start(self, x: torch.Tensor) -> torch.Tensor:
        """Post ``send(x) -> next`` and ``recv <- prev``; returns the receive buffer."""
        if self.size == 1:
            return x.clone()  # this rank is its own neighbour
        recv = torch.empty_like(x)
        ops = [
            dist.P2POp(dist.isend, x, self.next_rank, self.group),
            dist.P2POp(dist.irecv, recv, self.prev_rank, self.group),
        ]
        self._requests = dist.batch_isend_irecv(ops)
        return recv

    def wait(self) -> None:
        """Block until the posted send and receive are complete."""
        for request in self._requests:
            request.wait()
        self._requests = []


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_all_to_all_4d(
    x: torch.Tensor,
    scatter_dim: int,
    gather_dim: int,
    world_size: int,
    rank: int,
    seq_lens: Optional[Sequence[int]],
) -> None:
    """Upstream's ``AllToAll4D`` asserts (plus the varlen ones of ``usp.py``), in upstream order."""
    if x.dim() != 4:
        raise ValueError(f"input must be 4D tensor, got {x.dim()} and shape {x.shape}")
    if (scatter_dim, gather_dim) not in ((2, 1), (1, 2)):
        raise ValueError(
            f"Invalid scatter_dim={scatter_dim}, gather_dim={gather_dim}. Only (scatter_dim=2, "
            "gather_dim=1) and (scatter_dim=1, gather_dim=2) are supported."
        )
    if seq_lens is not None:
        seq_lens = check_seq_lens(seq_lens, world_size)
    if scatter_dim == 2:  # sequence shards -> head shards
        check_heads_split(x.shape[2], world_size)
        if seq_lens is not None:
            check_local_seq_len(x, seq_lens, rank)
            check_seq_lens_values(seq_lens)
    else:  # head shards -> sequence shards
        seqlen = x.shape[1]
        if seq_lens is not None:
            check_seq_lens_values(seq_lens)
        if seq_lens is None and seqlen % world_size:
            raise ValueError(
                f"sequence dimension ({seqlen}) must be divisible by sequence parallel world size "
                f"({world_size})"
            )
        if seq_lens is not None and seqlen != sum(seq_lens):
            raise ValueError(f"s_global ({seqlen}) must equal sum(seq_lens) ({sum(seq_lens)})")


def check_gather_dim(x: torch.Tensor, dim: int) -> None:
    """Upstream ``GroupCoordinator.all_gather``'s assert."""
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"Invalid dim ({dim}) for input tensor with shape {x.size()}")
