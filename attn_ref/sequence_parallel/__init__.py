"""Sequence-parallel attention on ``torch.distributed``: Ulysses, K/V gather, ring, USP.

Layout ``[batch, seq, heads, head_dim]`` everywhere. Each rank holds a shard of the sequence
(:func:`shard_sequence`); the schemes exchange tensors so that every rank's output equals
single-device attention over the whole sequence for its tokens. Replicated (text) tokens that every
rank holds whole are counted once.

* :class:`UlyssesAttention`: sglang's all-to-all (sequence <-> heads) and K/V-gather modes.
* :class:`USPAttention`: Ulysses inside groups x ring across them, zigzag load balancing for causal.
* :func:`ring_attention`: the ring on its own, with the stable fp32 LSE merge.
* ring-flash-attention's entry points on that ring: :func:`ring_flash_attn_func`,
  :func:`zigzag_ring_flash_attn_func` and their ``_kvpacked_func`` / ``_qkvpacked_func`` variants;
  the packed-batch ones :func:`ring_flash_attn_varlen_func`,
  :func:`zigzag_ring_flash_attn_varlen_func` (:mod:`.ring_varlen`) and the striped layout's
  :func:`stripe_flash_attn_func` (:mod:`.stripe`), with the same variants.
* ring-flash-attention's llama3 schedule for packed documents (K/V all-gathered by head strides):
  :func:`llama3_flash_attn_varlen_func` (+ ``_kvpacked_func`` / ``_qkvpacked_func``),
  :func:`llama3_flash_attn_prepare_cu_seqlens`; its transformers adapter
  :func:`substitute_hf_flash_attn` / :func:`update_ring_flash_attn_params` (:mod:`.hf_adapter`).
* Collectives: :func:`all_to_all_4d`, :func:`all_gather`, :class:`RingExchange`. ``group=None`` is
  the default group (the world), as in ``torch.distributed``; :data:`SELF_GROUP` is this rank alone.
* :func:`init_sequence_parallel_groups` / :class:`SequenceParallelGroups`: the group layout.
* :func:`launch`: run a function on N local ranks (gloo on CPU, NCCL on GPUs).

The local attention and the merge are a parameter (:class:`AttentionBackend`): these classes use the
PyTorch reference; :mod:`kernels.sequence_parallel` has the same classes on the Triton kernels.

Deliberate differences from sglang's ``layer.py`` / ``usp.py``:

* Groups and the SP mode are arguments (``groups=``, ``sp_attention_mode=``), not global state or
  server arguments; ``"auto"`` plays the role of ``sp_split_auto``. The constructors take sglang's
  arguments in sglang's order (``supported_attention_backends``, ``prefix`` and
  ``**extra_impl_args`` are kept, not used; USP's ``dropout_rate`` must be 0) and these keyword-only
  ones after them.
* Every rank of a group checks that all ranks made the same call (one small all-gather per call,
  :mod:`.agreement`; ``ATTN_REF_SP_CHECK_RANKS=0`` turns it off), so ranks that disagree all raise
  the same error instead of one aborting inside a collective.
* Upstream ``assert`` s and the ``AllToAll4D`` ``RuntimeError`` are ``ValueError`` s with the same
  text; every check runs before the first collective (:mod:`.checks`).
* "Replicated Q, K, and V must be provided together." is raised on the Ulysses path too (sglang
  only checks k/v there when ``replicated_q`` is given and ignores a lone ``replicated_k``).
* UlyssesAttention packs q/k/v per shape instead of ``cat([q, k, v])``, so GQA works
  (``h_k % P == 0``); it can also return the LSEs (``return_softmax_lse=True``).
* USPAttention is correct with ``causal=True`` and replicated tokens, under ring too (each chunk
  pair is masked by its place in the global sequence); sglang's ring relies on the backend's
  pre-configured mask. As in sglang, on one rank (or with ``skip_sequence_parallel``) it is local
  attention of q over k/v and the replicated counts are not read.
* Every entry point is differentiable (``loss.backward()`` works; gradients in the inputs' dtype,
  accumulated in fp32): the collectives have explicit adjoints, the ring its ring backward, and
  replicated tokens count once (every rank passes the same gradient for the replicated output and
  receives the full gradient of its replicated inputs; :mod:`.replicated`). ring-flash-attention
  returns bf16 ``dq`` whatever the input dtype and ignores the LSE's gradient; here the LSE outputs
  carry gradients too.
* Not implemented: attention masks / padding metadata, varlen USP, the segmented ``q_prefix``
  inputs, K/V gather inside USPAttention, UlyssesAttention_VSA, dropout.
"""

from .agreement import CHECK_RANKS_ENV
from .backend import REFERENCE_BACKEND, AttentionBackend
from .comm import (
    SELF_GROUP,
    RingExchange,
    all_gather,
    all_to_all_4d,
    all_to_all_4d_packed,
    heads_of_rank,
)
from .groups import SequenceParallelGroups, init_sequence_parallel_groups
from .hf_adapter import substitute_hf_flash_attn, update_ring_flash_attn_params
from .launch import launch
from .layout import shard_positions, shard_sequence, unshard_sequence
from .llama3 import (
    llama3_flash_attn_prepare_cu_seqlens,
    llama3_flash_attn_varlen_func,
    llama3_flash_attn_varlen_kvpacked_func,
    llama3_flash_attn_varlen_qkvpacked_func,
)
from .ring import ring_attention
from .ring_flash_attn import (
    ring_flash_attn_func,
    ring_flash_attn_kvpacked_func,
    ring_flash_attn_qkvpacked_func,
    zigzag_ring_flash_attn_func,
    zigzag_ring_flash_attn_kvpacked_func,
    zigzag_ring_flash_attn_qkvpacked_func,
)
from .ring_varlen import (
    ring_flash_attn_varlen_func,
    ring_flash_attn_varlen_kvpacked_func,
    ring_flash_attn_varlen_qkvpacked_func,
    zigzag_ring_flash_attn_varlen_func,
    zigzag_ring_flash_attn_varlen_kvpacked_func,
    zigzag_ring_flash_attn_varlen_qkvpacked_func,
)
from .stripe import (
    stripe_flash_attn_func,
    stripe_flash_attn_kvpacked_func,
    stripe_flash_attn_qkvpacked_func,
)
from .ulysses import UlyssesAttention
from .usp import USPAttention

__all__ = [
    "CHECK_RANKS_ENV",
    "REFERENCE_BACKEND",
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
    "llama3_flash_attn_prepare_cu_seqlens",
    "llama3_flash_attn_varlen_func",
    "llama3_flash_attn_varlen_kvpacked_func",
    "llama3_flash_attn_varlen_qkvpacked_func",
    "ring_attention",
    "ring_flash_attn_func",
    "ring_flash_attn_kvpacked_func",
    "ring_flash_attn_qkvpacked_func",
    "ring_flash_attn_varlen_func",
    "ring_flash_attn_varlen_kvpacked_func",
    "ring_flash_attn_varlen_qkvpacked_func",
    "shard_positions",
    "shard_sequence",
    "stripe_flash_attn_func",
    "stripe_flash_attn_kvpacked_func",
    "stripe_flash_attn_qkvpacked_func",
    "substitute_hf_flash_attn",
    "unshard_sequence",
    "update_ring_flash_attn_params",
    "zigzag_ring_flash_attn_func",
    "zigzag_ring_flash_attn_kvpacked_func",
    "zigzag_ring_flash_attn_qkvpacked_func",
    "zigzag_ring_flash_attn_varlen_func",
    "zigzag_ring_flash_attn_varlen_kvpacked_func",
    "zigzag_ring_flash_attn_varlen_qkvpacked_func",
]
