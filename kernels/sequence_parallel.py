"""Sequence-parallel attention on the Triton kernels: same classes, same errors, same results.

The SP logic (collectives, ring schedule, replicated tokens, checks) lives once, in
:mod:`attn_ref.sequence_parallel`; it is parameterised by an :class:`AttentionBackend`. Here that
backend is bound to the kernels:

* local attention: :func:`kernels.flash_attn_with_kvcache` with ``return_softmax_lse=True`` (K/V as
  a dense cache, bottom-right causal);
* merge of partial states (ring steps, replicated K/V): :func:`kernels.merge_attention_states`;
* the backward of local attention (ring steps, Ulysses, USP): :func:`kernels.backward.attention_backward`,
  so ``loss.backward()`` through these classes runs the same ring backward and collectives' adjoints
  as the reference, with the Triton backward kernels for the arithmetic.

The ring-flash-attention entry points (``ring_flash_attn_func`` and the rest) are the reference's,
bound to this backend. Everything else (groups, collectives, layouts, the launcher) is re-exported
unchanged.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_ref import sequence_parallel as _sp
from attn_ref.sequence_parallel import (  # noqa: F401 - re-exported: same API as attn_ref's
    CHECK_RANKS_ENV,
    SELF_GROUP,
    AttentionBackend,
    RingExchange,
    SequenceParallelGroups,
    all_gather,
    all_to_all_4d,
    all_to_all_4d_packed,
    heads_of_rank,
    init_sequence_parallel_groups,
    launch,
    shard_positions,
    shard_sequence,
    unshard_sequence,
)

from attn_ref.sequence_parallel.comm import Group
from attn_ref.sequence_parallel.ring_flash_attn import with_backend

from .backward import attention_backward
from .kvcache import flash_attn_with_kvcache
from .merge import merge_attention_states

#: The Triton kernels as the SP schemes' local attention, merge and attention backward.
KERNEL_BACKEND = AttentionBackend("kernels", flash_attn_with_kvcache, merge_attention_states, attention_backward)


class UlyssesAttention(_sp.UlyssesAttention):
    """:class:`attn_ref.sequence_parallel.UlyssesAttention` computing with the Triton kernels."""

    backend = KERNEL_BACKEND


class USPAttention(_sp.USPAttention):
    """:class:`attn_ref.sequence_parallel.USPAttention` computing with the Triton kernels."""

    backend = KERNEL_BACKEND


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Group = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    zigzag: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attn_ref.sequence_parallel.ring_attention` computing with the Triton kernels."""
    return _sp.ring_attention(q, k, v, group, softmax_scale, causal, zigzag, backend=KERNEL_BACKEND)


ring_flash_attn_func = with_backend(_sp.ring_flash_attn_func, KERNEL_BACKEND)
ring_flash_attn_kvpacked_func = with_backend(_sp.ring_flash_attn_kvpacked_func, KERNEL_BACKEND)
ring_flash_attn_qkvpacked_func = with_backend(_sp.ring_flash_attn_qkvpacked_func, KERNEL_BACKEND)
zigzag_ring_flash_attn_func = with_backend(_sp.zigzag_ring_flash_attn_func, KERNEL_BACKEND)
zigzag_ring_flash_attn_kvpacked_func = with_backend(_sp.zigzag_ring_flash_attn_kvpacked_func, KERNEL_BACKEND)
zigzag_ring_flash_attn_qkvpacked_func = with_backend(_sp.zigzag_ring_flash_attn_qkvpacked_func, KERNEL_BACKEND)


__all__ = [
    "CHECK_RANKS_ENV",
    "KERNEL_BACKEND",
    "SELF_GROUP",
    "AttentionBackend",
    "RingExchange",
    "SequenceParallelGroups",
    "USPAttention",
    "UlyssesAttention",
    "all_gather",
    "all_to_all_4d",
    "all_to_all_4d_packed",
    "heads_of_rank",
    "init_sequence_parallel_groups",
    "launch",
    "ring_attention",
    "ring_flash_attn_func",
    "ring_flash_attn_kvpacked_func",
    "ring_flash_attn_qkvpacked_func",
    "shard_positions",
    "shard_sequence",
    "unshard_sequence",
    "zigzag_ring_flash_attn_func",
    "zigzag_ring_flash_attn_kvpacked_func",
    "zigzag_ring_flash_attn_qkvpacked_func",
]
