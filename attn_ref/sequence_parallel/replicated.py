"""Gradients of replicated (text) tokens: every rank holds them whole, the loss counts them once.

Replicated tokens are the same tensors on every rank of the SP group: each rank passes the same
replicated q/k/v and gets the same replicated output. The gradients are defined by:

* the loss is the single-device one, in which the replicated rows appear **once**;
* every rank passes the **same** upstream gradient for the replicated output;
* every rank receives the **full** gradient of its replicated inputs (the same on every rank).

Inside the schemes the replicated rows are computed redundantly (every ring rank repeats the
replicated queries of its heads; K/V gather repeats them on every rank), so summing what each rank
computes would count the replicated rows ``P`` times (the backward analogue of the forward
double-count sglang fixed in PR #33327). Two identity maps with chosen adjoints make the count
exact:

* :func:`replicated_output` on the replicated output: the gradient is kept on rank 0 of the group
  and is zero on the others, so the redundant copies contribute once;
* :func:`replicated_input` on a replicated input: the gradient is the **sum** over the group
  (all-reduce), so the contributions of every rank (its sharded queries attending the replicated
  keys, rank 0's replicated rows, each rank's head slice) reach every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from .comm import Group, group_rank, group_size


def replicated_input(x: torch.Tensor, group: Group) -> torch.Tensor:
    """``x`` (held whole by every rank of ``group``); its gradient is the sum over the group."""
    return x if group_size(group) == 1 else _SumGradient.apply(x, group)


def replicated_output(x: torch.Tensor, group: Group) -> torch.Tensor:
    """``x`` (the same on every rank of ``group``); the upstream gradient counts once, on rank 0."""
    return x if group_size(group) == 1 else _GradientOnFirstRank.apply(x, group)


class _SumGradient(torch.autograd.Function):
    """Identity; backward: all-reduce (sum) of the gradient over the group, contiguous first
    (gloo)."""

    @staticmethod
    def forward(ctx, x, group: Group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


class _GradientOnFirstRank(torch.autograd.Function):
    """Identity; backward: the gradient on rank 0 of the group, zeros on the other ranks."""

    @staticmethod
    def forward(ctx, x, group: Group):
        ctx.first = group_rank(group) == 0
        return x.view_as(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return (grad if ctx.first else torch.zeros_like(grad)), None
