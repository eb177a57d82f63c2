"""Hugging Face transformers attention through this package: ``attn_implementation="attn_ref"``.

:func:`register` adds two attention implementations to transformers' ``AttentionInterface`` and
``AttentionMaskInterface``:

* ``"attn_ref"``: :func:`attn_ref.flash_attn_varlen_func` (the fp32 reference, with gradients);
* ``"attn_ref_kernels"``: :func:`kernels.flash_attn_varlen_func` (the Triton kernels, with
  gradients; on a CPU set ``TRITON_INTERPRET=1`` before anything imports them).

Then ``model.set_attn_implementation("attn_ref")`` or ``from_pretrained(..., attn_implementation=
"attn_ref")`` runs every attention layer of a decoder (Llama, Mistral, Qwen2, Gemma-2, GPT-OSS and
the like) as one ``flash_attn_varlen_func`` call, forward and backward, as transformers' own
flash-attention integration does for a padded batch (unpad, varlen, pad back):

* the mask: the mask function (:func:`visibility_mask`) builds the mask the model asks for with
  transformers' own ``sdpa_mask``, the mask ``eager`` and ``sdpa`` use (causal, the sliding window
  of the layer type, packed sequences from restarting ``position_ids``, chunks, padding keys):
  ``(b, sq, skv)`` bool, query row ``i`` sees key ``j``.
* the call: :func:`attn_ref.integrations.packed_layout.packed_layout` turns that mask into packed
  query rows and keys, ``cu_seqlens_q`` / ``cu_seqlens_k`` and FA3's ``window_size = (left, 0)``,
  and checks that ``causal=True`` with that window gives exactly the mask; otherwise the mask is
  refused. So the window is the mask's (what eager computes), whether or not the layer passes
  ``sliding_window``; left padding, right padding and padding between tokens (a right-padded
  batch in ``generate``) are all dropped keys.
* layout: ``query`` ``(b, h, sq, d)`` -> rows ``query.transpose(1, 2)[batch, position]``
  ``(total_q, h, d)``; ``key`` / ``value`` ``(b, h_k, skv, d)`` -> ``(total_k, h_k, d)`` likewise
  (transformers' KV cache has already appended the new keys). The packed output goes back to
  ``(b, sq, h, d_v)``; a query that sees no key (left padding) gets 0 (eager gives it the mean
  of all values; nothing reads it). GQA needs nothing: ``h_k`` divides ``h``.
* ``scaling`` -> ``softmax_scale``; ``softcap=None`` (off) -> ``softcap=0.0``; ``s_aux`` (attention
  sinks, GPT-OSS and others: ``(h,)`` logits with no value) -> ``sinks``.

Refused with :class:`UnsupportedAttention` before anything is computed: attention dropout (a model
in training mode with ``attention_dropout > 0``), ``output_attentions=True`` (no probabilities are
formed), non-causal layers, 4-D masks (custom masks, or masks made for another implementation),
masks that no varlen call reproduces (bidirectional blocks, prefix-LM overlays), ``cu_seq_lens_q``
/ ``cu_seq_lens_k`` that disagree with the mask, and (:func:`check_model`) models that do not route
their attention through ``AttentionInterface``.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from ..error_notes import catalogued
from ..flash_attn import flash_attn_varlen_func as reference_flash_attn_varlen_func
from ..packages import own_package
from .packed_layout import PackedLayout, packed_layout

#: The implementation names :func:`register` adds, and the ``flash_attn_varlen_func`` each runs.
IMPLEMENTATIONS = ("attn_ref", "attn_ref_kernels")


class UnsupportedAttention(NotImplementedError):
    """A transformers attention call that ``flash_attn_varlen_func`` cannot express."""


def register() -> None:
    """Register ``"attn_ref"`` and ``"attn_ref_kernels"`` with transformers (attention and mask
    functions).

    Importing :mod:`kernels` is deferred to the first ``"attn_ref_kernels"`` call.
    """
    from transformers import AttentionInterface, AttentionMaskInterface

    for name in IMPLEMENTATIONS:
        AttentionInterface.register(name, _attention_function(name))
        AttentionMaskInterface.register(name, visibility_mask)


def check_model(model: torch.nn.Module) -> None:
    """Raise :class:`UnsupportedAttention` when ``model`` (or a model inside it) does not call its
    attention through transformers' ``AttentionInterface`` (``is_backend_compatible()`` is False,
    Falcon for one): ``attn_implementation="attn_ref"`` cannot reach such a model."""
    for module in model.modules():
        compatible = getattr(type(module), "is_backend_compatible", None)
        if compatible is not None and not compatible():
            raise UnsupportedAttention(
                f"{type(module).__name__} does not run its attention through transformers' "
                "AttentionInterface, so attn_implementation='attn_ref' cannot reach it: building "
                "it with that name raises KeyError: 'attn_ref' inside transformers, and "
                "set_attn_implementation leaves its implementation unchanged; use 'eager' or "
                "'sdpa' for this model"
            )


def _attention_function(name: str) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):
        return attention_forward(
            _flash_attn_varlen_func(name), module, query, key, value, attention_mask, **kwargs
        )

    attention.__name__ = attention.__qualname__ = f"{name}_attention"
    return attention


def _flash_attn_varlen_func(name: str) -> Callable:
    if name == "attn_ref":
        return reference_flash_attn_varlen_func
    return own_package("kernels").flash_attn_varlen_func


@catalogued
def attention_forward(
    flash_attn_varlen_func: Callable,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """One attention layer: ``query`` ``(b, h, sq, d)``, ``key`` / ``value`` ``(b, h_k, skv,
    d|dv)`` (all the keys, after transformers' cache update), ``attention_mask`` from
    :func:`visibility_mask` ``(b, sq, skv)`` (None: causal over all keys, within
    ``sliding_window``), ``s_aux`` ``(h,)`` sink logits or None. Returns ``(out, None)`` with
    ``out`` ``(b, sq, h, dv)``; differentiable through ``flash_attn_varlen_func``."""
    if dropout:
        raise UnsupportedAttention(
            f"attn_ref attention has no attention dropout, got dropout={dropout}: call "
            "model.eval(), "
            f"or set the config's attention_dropout to 0.0"
        )
    config = getattr(module, "config", None)
    if kwargs.get("output_attentions", getattr(config, "output_attentions", False)):
        raise UnsupportedAttention(
            "attn_ref attention returns no attention probabilities (output_attentions=True): "
            "FlashAttention never forms them; run the model with attn_implementation='eager' to "
            "get them"
        )
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    if not causal:
        raise UnsupportedAttention(
            "attn_ref attention supports causal (decoder) attention only, got is_causal=False"
        )
    b, h, sq, _ = query.shape
    visible = _visible(attention_mask, b, sq, key.shape[2], sliding_window, query.device)
    layout = packed_layout(visible)
    if layout is None:
        raise UnsupportedAttention(
            "attn_ref attention computes masks that are causal within each sequence, with one "
            "sliding window and any padding; this model asks for another pattern (bidirectional "
            "blocks, a prefix or image overlay, or a custom mask): use attn_implementation="
            "'eager' or 'sdpa' for it"
        )
    _check_packed_kwargs(layout, kwargs)
    out = value.new_zeros(b, sq, h, value.shape[-1])
    if layout.query_batch.numel() == 0:  # every query is padding
        return out, None
    packed = flash_attn_varlen_func(
        query.transpose(1, 2)[layout.query_batch, layout.query_position],
        key.transpose(1, 2)[layout.key_batch, layout.key_position],
        value.transpose(1, 2)[layout.key_batch, layout.key_position],
        layout.cu_seqlens_q,
        layout.cu_seqlens_k,
        layout.max_seqlen_q,
        layout.max_seqlen_k,
        softmax_scale=scaling,
        causal=True,
        window_size=(layout.window_left, 0) if layout.window_left >= 0 else (-1, -1),
        softcap=0.0 if softcap is None else softcap,
        sinks=s_aux,
    )
    out = out.index_put((layout.query_batch, layout.query_position), packed)
    return out, None


def _visible(
    attention_mask: Optional[torch.Tensor],
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    sliding_window: Optional[int],
    device: torch.device,
) -> torch.Tensor:
    """``(b, sq, skv)`` bool: the mask function's, checked; or, for None, causal (queries on the
    last ``sq`` keys) within ``sliding_window``."""
    if attention_mask is None:
        i = torch.arange(seqlen_q, device=device)[:, None] + seqlen_k - seqlen_q
        j = torch.arange(seqlen_k, device=device)[None, :]
        visible = (j <= i) & ((j > i - sliding_window) if sliding_window else True)
        return visible.expand(batch, seqlen_q, seqlen_k)
    if attention_mask.dim() != 3 or tuple(attention_mask.shape) != (batch, seqlen_q, seqlen_k):
        raise UnsupportedAttention(
            "attn_ref attention takes the (batch, queries, keys) mask its mask function makes, "
            f"got a mask of shape {tuple(attention_mask.shape)} for {seqlen_q} queries and "
            f"{seqlen_k} keys: a custom 4-D attention mask cannot be expressed; pass a 2-D "
            "attention_mask (1 = token, 0 = padding) instead"
        )
    return attention_mask.to(torch.bool)


def _check_packed_kwargs(layout: PackedLayout, kwargs: dict) -> None:
    """``cu_seq_lens_q`` / ``cu_seq_lens_k`` (transformers' packed-sequence keywords for
    flash-attention implementations), when given, must be the sequences the mask has."""
    for name, derived in (("q", layout.cu_seqlens_q), ("k", layout.cu_seqlens_k)):
        given = kwargs.get(f"cu_seq_lens_{name}")
        if given is not None and given.tolist() != derived.tolist():
            raise UnsupportedAttention(
                f"attn_ref attention got cu_seq_lens_{name}={given.tolist()}, but the model's "
                f"mask has the sequences {derived.tolist()}: pass position_ids that restart at 0 "
                "at each packed sequence (as DataCollatorWithFlattening does) and no "
                "attention_mask"
            )


@catalogued
def visibility_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Union[int, torch.Tensor] = 0,
    kv_offset: int = 0,
    mask_function: Optional[Callable] = None,
    attention_mask: Optional[torch.Tensor] = None,
    use_vmap: bool = False,
    **kwargs: object,
) -> torch.Tensor:
    """The mask function (``AttentionMaskInterface``): which key each query row sees, ``(b,
    q_length, kv_length)`` bool, for :func:`attention_forward`.

    Key ``j`` sits at position ``kv_offset + j``; query ``i`` at ``q_offset + i``. The mask is
    transformers' ``sdpa_mask`` (the mask of ``eager`` and ``sdpa``) of ``mask_function`` (default
    causal) and the 2-D ``attention_mask`` (over positions ``0..``: it hides padding keys).
    """
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    _require_flash_style(kwargs.get("config"))
    device = attention_mask.device if attention_mask is not None else kwargs.get("device", "cpu")
    try:
        visible = sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function or causal_mask_function,
            attention_mask=None if attention_mask is None else attention_mask.to(torch.bool),
            allow_is_causal_skip=False,
            allow_is_bidirectional_skip=False,
            use_vmap=use_vmap,
            device=device,
        )[:, 0]
    # a mask function that needs vmap, called without it
    except Exception as exc:
        raise UnsupportedAttention(
            "attn_ref attention builds the model's mask on index tensors, as transformers' sdpa "
            "mask does; this model asks for a mask that cannot be evaluated on index tensors (a "
            "custom mask function)"
        ) from exc
    return visible


def _require_flash_style(config: Optional[object]) -> None:
    """The model of ``config`` takes flash-attention-style attention: transformers' class says so
    (``_supports_flash_attn``, or a compatible flash kernel named). A model that does not uses the
    attention mask itself as a 4-D tensor (a sparse-attention indexer, a mask with extra bias
    columns), which the boolean mask of :func:`visibility_mask` cannot serve."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        model_class = MODEL_MAPPING[type(config)]
    except KeyError:  # no config, or a model transformers does not list: nothing to go by
        return
    model_class = model_class[0] if isinstance(model_class, tuple) else model_class
    if model_class._supports_flash_attn or getattr(
        model_class, "_compatible_flash_implementations", None
    ):
        return
    raise UnsupportedAttention(
        "attn_ref attention works like flash attention (its mask function gives a boolean "
        f"(batch, queries, keys) mask), and "
        f"{model_class.__name__} does not support flash attention (_supports_flash_attn = False): "
        "use attn_implementation='eager' or 'sdpa' for it"
    )
