"""Sequence-parallel attention on the Triton kernels: same classes, same errors, same results.

The SP logic (collectives, ring schedule, replicated tokens, checks) lives once, in
:mod:`attn_ref.sequence_parallel`; it is parameterised by an :class:`AttentionBackend`. Here that
backend is bound to the kernels:

* local attention: :func:`kernels.flash_attn_with_kvcache` with ``return_softmax_lse=True`` (K/V as
  a dense cache, bottom-right causal);
* merge of partial states (ring steps, replicated K/V): :func:`kernels.merge_attention_states`;
* the backward of local attention (ring steps, Ulysses, USP):
  :func:`kernels.backward.attention_backward`,
* the local attention of the llama3 schedule (forward and backward):
  :func:`kernels.flash_attn_varlen_func`,
  so ``loss.backward()`` through these classes runs the same ring backward and collectives' adjoints
  as the reference, with the Triton backward kernels for the arithmetic.

The classes are the reference's with this backend as their ``backend`` attribute; ``ring_attention``
and the ring-flash-attention entry points (``ring_flash_attn_func``, the varlen, stripe and
llama3 ones, ``substitute_hf_flash_attn`` too) are the
reference's, bound to this backend
(:func:`~attn_ref.sequence_parallel.ring_flash_attn.with_backend`). Everything else (groups,
collectives, layouts, the launcher) is re-exported unchanged.
"""

from __future__ import annotations

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
    llama3_flash_attn_prepare_cu_seqlens,
    shard_positions,
    shard_sequence,
    unshard_sequence,
    update_ring_flash_attn_params,
)
from attn_ref.sequence_parallel.ring_flash_attn import with_backend

from .backward import attention_backward
from .flash_attn import flash_attn_varlen_func
from .kvcache import flash_attn_with_kvcache
from .merge import merge_attention_states

#: The Triton kernels as the SP schemes' local attention, merge and attention backward.
KERNEL_BACKEND = AttentionBackend("kernels", flash_attn_with_kvcache, merge_attention_states,
                                  attention_backward, flash_attn_varlen_func)


class UlyssesAttention(_sp.UlyssesAttention):
    """:class:`attn_ref.sequence_parallel.UlyssesAttention` computing with the Triton kernels."""

    backend = KERNEL_BACKEND


class USPAttention(_sp.USPAttention):
    """:class:`attn_ref.sequence_parallel.USPAttention` computing with the Triton kernels."""

    backend = KERNEL_BACKEND


ring_attention = with_backend(_sp.ring_attention, KERNEL_BACKEND)
""":func:`attn_ref.sequence_parallel.ring_attention` computing with the Triton kernels (same
arguments but
``backend``, same errors, same results)."""
ring_flash_attn_func = with_backend(_sp.ring_flash_attn_func, KERNEL_BACKEND)
ring_flash_attn_kvpacked_func = with_backend(_sp.ring_flash_attn_kvpacked_func, KERNEL_BACKEND)
ring_flash_attn_qkvpacked_func = with_backend(_sp.ring_flash_attn_qkvpacked_func, KERNEL_BACKEND)
zigzag_ring_flash_attn_func = with_backend(_sp.zigzag_ring_flash_attn_func, KERNEL_BACKEND)
zigzag_ring_flash_attn_kvpacked_func = with_backend(_sp.zigzag_ring_flash_attn_kvpacked_func,
                                                    KERNEL_BACKEND)
zigzag_ring_flash_attn_qkvpacked_func = with_backend(_sp.zigzag_ring_flash_attn_qkvpacked_func,
                                                     KERNEL_BACKEND)
ring_flash_attn_varlen_func = with_backend(_sp.ring_flash_attn_varlen_func, KERNEL_BACKEND)
ring_flash_attn_varlen_kvpacked_func = with_backend(_sp.ring_flash_attn_varlen_kvpacked_func,
                                                    KERNEL_BACKEND)
ring_flash_attn_varlen_qkvpacked_func = with_backend(_sp.ring_flash_attn_varlen_qkvpacked_func,
                                                     KERNEL_BACKEND)
zigzag_ring_flash_attn_varlen_func = with_backend(_sp.zigzag_ring_flash_attn_varlen_func,
                                                  KERNEL_BACKEND)
zigzag_ring_flash_attn_varlen_kvpacked_func = with_backend(
    _sp.zigzag_ring_flash_attn_varlen_kvpacked_func, KERNEL_BACKEND)
zigzag_ring_flash_attn_varlen_qkvpacked_func = with_backend(
    _sp.zigzag_ring_flash_attn_varlen_qkvpacked_func, KERNEL_BACKEND)
stripe_flash_attn_func = with_backend(_sp.stripe_flash_attn_func, KERNEL_BACKEND)
stripe_flash_attn_kvpacked_func = with_backend(_sp.stripe_flash_attn_kvpacked_func, KERNEL_BACKEND)
stripe_flash_attn_qkvpacked_func = with_backend(_sp.stripe_flash_attn_qkvpacked_func,
                                                KERNEL_BACKEND)
llama3_flash_attn_varlen_func = with_backend(_sp.llama3_flash_attn_varlen_func, KERNEL_BACKEND)
llama3_flash_attn_varlen_kvpacked_func = with_backend(_sp.llama3_flash_attn_varlen_kvpacked_func,
                                                      KERNEL_BACKEND)
llama3_flash_attn_varlen_qkvpacked_func = with_backend(_sp.llama3_flash_attn_varlen_qkvpacked_func,
                                                       KERNEL_BACKEND)
substitute_hf_flash_attn = with_backend(_sp.substitute_hf_flash_attn, KERNEL_BACKEND)
""":func:`attn_ref.sequence_parallel.substitute_hf_flash_attn` with the kernels as every
substituted layer's local attention."""

#: The reference's public names, with :data:`KERNEL_BACKEND` in place of ``REFERENCE_BACKEND``.
__all__ = [name if name != "REFERENCE_BACKEND" else "KERNEL_BACKEND" for name in _sp.__all__]
