"""ring-flash-attention's transformers adapter: a Hugging Face model's attention on the llama3
schedule.

ring-flash-attention (zhuzilin/ring-flash-attention at commit
``899628238f2f5bb8c028579c89b7cd56ea451d2a``, ``ring_flash_attn/adapters/hf_adapter.py``) trains
transformers models on packed sequences split over ranks with two calls, kept here with its names
and arguments:

* :func:`substitute_hf_flash_attn` ``(process_group, heads_k_stride)``, once: transformers'
  ``"flash_attention_2"`` attention becomes :func:`~.llama3.llama3_flash_attn_varlen_func` over
  ``process_group``, gathering ``heads_k_stride`` KV heads at a time;
* :func:`update_ring_flash_attn_params` ``(cu_seqlens, process_group)``, before each batch: the
  offsets of the whole packed batch (``(n + 1,)`` int32, every rank the same), cut for this rank by
  :func:`~.llama3.llama3_flash_attn_prepare_cu_seqlens` with ``causal=True`` and kept in
  :data:`DATA_PARAMS`, where every attention layer reads them.

Each rank then runs the model on its ``S / P`` tokens, ``input_ids`` and ``position_ids`` of shape
``(1, S / P)`` (the positions restart at each document, counted over the whole batch), and gets the
logits of its tokens.

**Where it hooks in.** ring-flash-attention replaces
``transformers.modeling_flash_attention_utils._flash_attention_forward`` (choosing the variant whose
parameter count matches transformers') and sets ``ALL_ATTENTION_FUNCTIONS["flash_attention_2"]``.
In transformers 5 (5.23.0 is pinned here) the models look their attention up in
``ALL_ATTENTION_FUNCTIONS`` (``modeling_utils.AttentionInterface``), and
``integrations/flash_attention.py`` binds ``_flash_attention_forward`` at import, so the module
attribute is not where 5.23 can be changed (and its 23 parameters match none of upstream's variants:
upstream's adapter raises "The current transformer version 5.23.0 is not supported"). This adapter
sets the attention function itself, under two names:

* ``"flash_attention_2"``, as ring-flash-attention does: a model loaded with
  ``attn_implementation="flash_attention_2"`` (which transformers only accepts where the
  ``flash_attn`` package is installed) runs the ring;
* :data:`RING_ATTN_IMPLEMENTATION` (``"llama3_ring_attn"``: transformers would try to import a
  FlashAttention package for a name with "flash" in it), registered with transformers'
  ``AttentionInterface`` and, for the mask, with FlashAttention's mask function
  (``AttentionMaskInterface``): ``model.set_attn_implementation("llama3_ring_attn")`` selects it on
  any machine, a CPU without ``flash_attn`` included.

The attention function receives transformers' ``(1, h, S / P, d)`` query and ``(1, h_k, S / P, d)``
key and value (after the rotary embedding), calls the llama3 schedule on ``(S / P, h, d)`` views
with :data:`DATA_PARAMS` and returns ``(1, S / P, h, d)``. As upstream it refuses ``softcap``,
non-causal layers and a batch of more than one row (in upstream's words), ignores
``attention_mask`` (packed rows have no padding), and passes a sliding window on (``window_size =
(sliding_window - 1, 0)``, transformers 5's convention). ring-flash-attention's ``use_ring_attn``
switch (back to plain FlashAttention) is not kept: select another ``attn_implementation`` instead.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..error_notes import catalogued
from .backend import REFERENCE_BACKEND, AttentionBackend
from .comm import Group, group_rank, group_size
from .llama3 import llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func

#: The attention implementation name :func:`substitute_hf_flash_attn` registers besides
#: ``"flash_attention_2"``.
RING_ATTN_IMPLEMENTATION = "llama3_ring_attn"

#: This rank's offsets of the current packed batch, as :func:`update_ring_flash_attn_params` left
#: them: ``cu_seqlens_q``, ``cu_seqlens_k``, ``max_seqlen_q``, ``max_seqlen_k``, ``local_k_slice``.
DATA_PARAMS: dict = {}


def update_ring_flash_attn_params(cu_seqlens: torch.Tensor, process_group: Group) -> None:
    """Set this rank's offsets of the next packed batch for every substituted attention layer.

    Args:
        cu_seqlens: ``(n + 1,)`` int32 offsets of the documents of the whole packed batch of ``S``
            tokens (``S`` divisible by the group's size), the same on every rank.
        process_group: the ranks that share the batch (None: the default group).
    """
    (
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        local_k_slice,
    ) = llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens, True, group_rank(process_group), group_size(process_group)
    )
    DATA_PARAMS.update(
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        local_k_slice=local_k_slice,
    )


def substitute_hf_flash_attn(
    process_group: Group,
    heads_k_stride: int,
    *,
    backend: AttentionBackend = REFERENCE_BACKEND,
) -> None:
    """Make transformers' ``"flash_attention_2"`` and :data:`RING_ATTN_IMPLEMENTATION` attention
    the llama3 schedule over ``process_group`` (module docstring).

    Args:
        process_group: the ranks that share each packed batch (None: the default group).
        heads_k_stride: KV heads gathered per step (divides the model's ``num_key_value_heads``).
        backend (AttentionBackend): the local attention (the kernels' in
            :mod:`kernels.sequence_parallel`).
    """
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    def ring_flash_attention(module, query, key, value, attention_mask, **kwargs):
        return ring_attention_forward(
            process_group, heads_k_stride, backend, module, query, key, value, **kwargs
        )

    ALL_ATTENTION_FUNCTIONS["flash_attention_2"] = ring_flash_attention
    AttentionInterface.register(RING_ATTN_IMPLEMENTATION, ring_flash_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(
        RING_ATTN_IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"]
    )


@catalogued
def ring_attention_forward(
    process_group: Group,
    heads_k_stride: int,
    backend: AttentionBackend,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """One attention layer on the llama3 schedule: ``query`` ``(1, h, S / P, d)``, ``key`` /
    ``value`` ``(1, h_k, S / P, d)`` -> ``((1, S / P, h, d), None)``, with :data:`DATA_PARAMS`."""
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    check_no_softcap(softcap)
    check_causal(causal)
    check_one_row(query.shape[0])
    check_params_set(DATA_PARAMS)
    out = llama3_flash_attn_varlen_func(
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        DATA_PARAMS["cu_seqlens_q"],
        DATA_PARAMS["cu_seqlens_k"],
        DATA_PARAMS["max_seqlen_q"],
        DATA_PARAMS["max_seqlen_k"],
        heads_k_stride,
        DATA_PARAMS["local_k_slice"],
        dropout_p=dropout,
        softmax_scale=scaling,
        causal=True,
        window_size=(-1, -1) if sliding_window is None else (sliding_window - 1, 0),
        group=process_group,
        backend=backend,
    )
    return out[None], None


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_no_softcap(softcap: Optional[float]) -> None:
    """ring-flash-attention's adapter asserts ``softcap is None`` (its llama3 function has no
    softcap)."""
    if softcap is not None:
        raise NotImplementedError("llama3_flash_attn_varlen_func does not support softcap yet.")


def check_causal(causal: bool) -> None:
    """ring-flash-attention's adapter asserts a causal layer (its offsets are prepared causal)."""
    if not causal:
        raise NotImplementedError("only causal attention is supported yet.")


def check_one_row(batch_size: int) -> None:
    """ring-flash-attention's adapter asserts a batch of one row: the packed documents."""
    if batch_size != 1:
        raise ValueError("varlen data should be processed in advance.")


def check_params_set(params: dict) -> None:
    """The offsets of the batch are set before the model runs."""
    if not params:
        raise ValueError(
            "the ring attention has no offsets for this batch: call "
            "update_ring_flash_attn_params(cu_seqlens, process_group) with the packed batch's "
            "cu_seqlens before the model's forward"
        )
