"""Hugging Face transformers attention through this package: ``attn_implementation="attn_ref"``.

:func:`register` adds two attention implementations to transformers' ``AttentionInterface`` and
``AttentionMaskInterface``:

* ``"attn_ref"``: :func:`attn_ref.flash_attn_with_kvcache` (the fp32 reference);
* ``"attn_ref_kernels"``: :func:`kernels.flash_attn_with_kvcache` (the Triton kernels; on a CPU set
  ``TRITON_INTERPRET=1`` before anything imports them).

Then ``model.set_attn_implementation("attn_ref")`` or ``from_pretrained(..., attn_implementation=
"attn_ref")`` runs every attention layer of a decoder (Llama, Mistral, Qwen2, Gemma-2 and the like)
as one ``flash_attn_with_kvcache`` call over the keys and values transformers' own KV cache returns.
The conversions (transformers -> FA3 API):

* layout: ``query`` ``(b, h, sq, d)`` -> ``q = query.transpose(1, 2)`` ``(b, sq, h, d)``; ``key`` /
  ``value`` ``(b, h_k, skv, d)`` -> ``k_cache`` / ``v_cache`` ``(b, skv, h_k, d)`` (views, no copy);
  the output ``(b, sq, h, d)`` is what transformers expects back. GQA needs nothing: ``h_k`` divides
  ``h``.
* the mask: :func:`padding_mask` (the mask function) returns, per batch entry, which of the ``skv``
  keys hold tokens: ``(b, skv)`` bool. It must be one run ``[leftpad, seqlen)``: left padding gives
  ``cache_leftpad``; keys after the run (a static cache's empty slots) give ``cache_seqlens``.
  Causality is FA3's ``causal=True``, aligned to the last key, which is where transformers puts the
  queries. The mask function checks that the pattern transformers asks for is causal (optionally
  with the config's sliding window); anything else raises :class:`UnsupportedAttention`.
* ``scaling`` -> ``softmax_scale``; ``softcap=None`` (off) -> ``softcap=0.0``.
* ``sliding_window=W`` (a key is visible when ``q_pos - k_pos < W``) -> ``window_size=(W - 1, 0)``.

Not supported, raised as :class:`UnsupportedAttention` rather than computed wrongly: attention
dropout (``dropout > 0`` while training), gradients (the call is forward-only), 4-D masks (custom
masks, or masks prepared for another implementation), and mask patterns other than causal with left
padding and a sliding window (packed sequences, bidirectional or chunked attention, masks with
holes).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from ..error_notes import catalogued
from ..kvcache import flash_attn_with_kvcache as reference_flash_attn_with_kvcache
from ..packages import own_package

#: The implementation names :func:`register` adds, and the ``flash_attn_with_kvcache`` each runs.
IMPLEMENTATIONS = ("attn_ref", "attn_ref_kernels")


class UnsupportedAttention(NotImplementedError):
    """A transformers attention call that ``flash_attn_with_kvcache`` cannot express."""


def register() -> None:
    """Register ``"attn_ref"`` and ``"attn_ref_kernels"`` with transformers (attention and mask
    functions).

    Importing :mod:`kernels` is deferred to the first ``"attn_ref_kernels"`` call.
    """
    from transformers import AttentionInterface, AttentionMaskInterface

    for name in IMPLEMENTATIONS:
        AttentionInterface.register(name, _attention_function(name))
        AttentionMaskInterface.register(name, padding_mask)


def _attention_function(name: str) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):
        return attention_forward(
            _flash_attn_with_kvcache(name), module, query, key, value, attention_mask, **kwargs
        )

    attention.__name__ = attention.__qualname__ = f"{name}_attention"
    return attention


def _flash_attn_with_kvcache(name: str) -> Callable:
    if name == "attn_ref":
        return reference_flash_attn_with_kvcache
    return own_package("kernels").flash_attn_with_kvcache


@catalogued
def attention_forward(
    flash_attn_with_kvcache: Callable,
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
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """One attention layer: ``query`` ``(b, h, sq, d)``, ``key`` / ``value`` ``(b, h_k, skv, d|dv)``
    (all the keys, after transformers' cache update), ``attention_mask`` from :func:`padding_mask`.
    Returns ``(out, None)`` with ``out`` ``(b, sq, h, dv)``."""
    if dropout:
        raise UnsupportedAttention(
            f"attn_ref attention has no attention dropout, got dropout={dropout}: call "
            "model.eval(), "
            f"or set the config's attention_dropout to 0.0"
        )
    if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)):
        raise UnsupportedAttention(
            "attn_ref attention computes no gradients: run it under torch.no_grad() or "
            "torch.inference_mode() (generate does), or train with another attn_implementation"
        )
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    if not causal:
        raise UnsupportedAttention(
            "attn_ref attention supports causal (decoder) attention only, got is_causal=False"
        )
    leftpad, seqlens = key_range(attention_mask, query.shape[0], key.shape[2], key.device)
    out = flash_attn_with_kvcache(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        cache_seqlens=seqlens,
        cache_leftpad=leftpad,
        softmax_scale=scaling,
        causal=True,
        window_size=(-1, -1) if sliding_window is None else (sliding_window - 1, 0),
        softcap=0.0 if softcap is None else softcap,
    )
    return out, None


def key_range(
    attention_mask: Optional[torch.Tensor], batch: int, seqlen_k: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cache_leftpad, cache_seqlens)``, ``(b,)`` int32 each, from the ``(b, skv)`` mask of the
    keys that hold tokens (:func:`padding_mask`; None: all of them). Each row must be one run of
    True."""
    if attention_mask is None:
        return (
            torch.zeros(batch, dtype=torch.int32, device=device),
            torch.full((batch,), seqlen_k, dtype=torch.int32, device=device),
        )
    if attention_mask.dim() != 2 or attention_mask.shape[-1] != seqlen_k:
        raise UnsupportedAttention(
            "attn_ref attention takes the (batch, keys) padding mask its mask function makes, got "
            "a mask "
            f"of shape {tuple(attention_mask.shape)} for {seqlen_k} keys: a custom 4-D attention "
            "mask "
            f"cannot be expressed; pass a 2-D attention_mask (1 = token, 0 = padding) instead"
        )
    mask = attention_mask.to(torch.bool)
    positions = torch.arange(seqlen_k, device=mask.device)
    seqlens = torch.where(mask, positions + 1, 0).amax(dim=1)  # one past the last token
    # the first; 0 if none
    leftpad = torch.minimum(torch.where(mask, positions, seqlen_k).amin(dim=1), seqlens)
    if not bool((mask.sum(dim=1) == seqlens - leftpad).all()):
        raise UnsupportedAttention(
            "attn_ref attention expresses padding as cache_leftpad and cache_seqlens: each row of "
            "attention_mask must be padding, then tokens, then padding (left padding); this mask "
            "has padding between tokens"
        )
    return leftpad.to(torch.int32), seqlens.to(torch.int32)


@catalogued
def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Union[int, torch.Tensor] = 0,
    kv_offset: int = 0,
    mask_function: Optional[Callable] = None,
    attention_mask: Optional[torch.Tensor] = None,
    config: Optional[object] = None,
    **kwargs: object,
) -> torch.Tensor:
    """The mask function (``AttentionMaskInterface``): which of the ``kv_length`` keys hold tokens,
    ``(b, kv_length)`` bool, for :func:`attention_forward`.

    Key ``j`` sits at position ``kv_offset + j``; queries at ``q_offset + i``. A key holds a token
    when the 2-D ``attention_mask`` (over positions ``0..``) says so and the position is before the
    end of the queries (later slots of a static cache are empty). ``mask_function`` (the pattern
    transformers asks for, without padding) must be causal, or causal within the config's sliding
    window: FA3's ``causal=True`` and ``window_size`` give exactly those.
    """
    _require_flash_style(config)
    device = attention_mask.device if attention_mask is not None else kwargs.get("device", "cpu")
    q_positions = torch.arange(q_length, device=device) + q_offset
    kv_positions = torch.arange(kv_length, device=device) + kv_offset
    if mask_function is not None:
        _require_causal(
            mask_function,
            batch_size,
            q_positions,
            kv_positions,
            getattr(config, "sliding_window", None),
        )
    holds_token = (kv_positions < q_offset + q_length).expand(batch_size, kv_length)
    if attention_mask is not None:
        inside = kv_positions < attention_mask.shape[1]
        padded = attention_mask.to(torch.bool)[
            :, kv_positions.clamp(max=attention_mask.shape[1] - 1)
        ]
        holds_token = holds_token & inside & padded
    return holds_token


def _require_flash_style(config: Optional[object]) -> None:
    """The model of ``config`` takes flash-attention-style attention: transformers' class says so
    (``_supports_flash_attn``, or a compatible flash kernel named). A model that does not uses the
    attention mask itself as a 4-D tensor (a sparse-attention indexer, a mask with extra bias
    columns), which the ``(b, skv)`` mask of :func:`padding_mask` cannot serve."""
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
        f"attn_ref attention works like flash attention (it gets a 2-D padding mask), and "
        f"{model_class.__name__} does not support flash attention (_supports_flash_attn = False): "
        "use attn_implementation='eager' or 'sdpa' for it"
    )


def _require_causal(
    mask_function: Callable,
    batch: int,
    q_positions: torch.Tensor,
    kv_positions: torch.Tensor,
    sliding_window: Optional[int],
) -> None:
    """``mask_function`` over the ``(b, sq, skv)`` grid is causal, or causal within
    ``sliding_window``."""
    b = torch.arange(batch, device=q_positions.device)[:, None, None]
    h = torch.zeros((), dtype=torch.long, device=q_positions.device)
    q, kv = q_positions[None, :, None], kv_positions[None, None, :]
    try:
        asked = torch.as_tensor(mask_function(b, h, q, kv)).expand(batch, q.shape[1], kv.shape[2])
    # a mask function that needs vmap: not one of transformers' index patterns
    except Exception as exc:
        raise UnsupportedAttention(
            "attn_ref attention supports causal masks with left padding and a sliding window; this "
            "model asks for a mask that cannot be evaluated on index tensors (a custom mask "
            "function)"
        ) from exc
    causal = kv <= q
    patterns = [causal] + ([causal & (kv > q - sliding_window)] if sliding_window else [])
    if not any(bool((asked == p).all()) for p in patterns):
        raise UnsupportedAttention(
            "attn_ref attention supports causal masks with left padding and a sliding window; this "
            "model asks for another pattern (packed sequences, bidirectional, chunked or custom "
            "attention): use attn_implementation='eager' or 'sdpa' for it"
        )
