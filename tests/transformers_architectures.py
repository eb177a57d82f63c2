"""Every decoder-only architecture of the pinned transformers that routes attention through its
attention interface, built tiny, run through ``attn_implementation="attn_ref"``.

Which architectures: the model types of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` whose
class sets ``_supports_attention_backend`` (transformers' flag for "attention goes through
``ALL_ATTENTION_FUNCTIONS``": such a model calls whatever implementation
``config._attn_implementation`` names), minus the encoders that the mapping also lists as decoders
(their type is in ``MODEL_FOR_MASKED_LM_MAPPING_NAMES``: BERT-style models with
``is_decoder=True``).

How each is built: the default config of its type with :data:`TINY` applied to the fields that
config has (2 layers, hidden size 64, 4 query heads over 2 key/value heads, vocabulary 128, a
window of 4 keys where the config has one, one layer of each of its layer types), random weights
(seed 1, ``initializer_range=0.2`` so that attention is peaked enough for a wrong mask to move the
logits), fp32, eval mode. :data:`OVERRIDES` holds the few per-architecture fields the generic rule
cannot derive; :data:`NOT_TINY` the architectures that cannot be built that way, with the reason.

What is checked (:func:`check`): greedy ``generate`` of a left-padded batch with the implementation
gives eager's tokens, and its logits are within :func:`tolerance` of eager's; or the implementation
raises a catalogued error of this package (a raise statement of ``errors/catalog.json``) and returns
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)

from attn_ref.integrations.transformers import register
from errors import catalog

register()

#: fp32 logits of the implementation against eager's (summation order only).
LOGITS_ATOL = 1e-5
NEW_TOKENS = 3
WINDOW = 4
#: Config fields set where the type's default config has them.
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    attention_dropout=0.0,
    is_decoder=True,  # decoder classes of encoder-decoder families
    # multi-head latent attention (DeepSeek-V2/V3 and kin)
    kv_lora_rank=32,
    q_lora_rank=32,
    qk_rope_head_dim=16,  # = head_dim, which these configs derive from it
    qk_nope_head_dim=16,
    v_head_dim=16,
    # mixtures of experts
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    shared_experts_intermediate_size=32,
    zero_expert_num=2,
    index_topk=4,  # sparse attention's indexer: keys kept per query, its heads
    index_n_heads=2,
    index_head_dim=16,
    # Gemma-3n / Gemma-4: per-layer input embeddings; no layers that reuse another's keys
    vocab_size_per_layer_input=128,
    hidden_size_per_layer_input=16,
    num_kv_shared_layers=0,
)
#: Fields set even where the default config has them as None (derived later, or required).
SHAPES = {"head_dim", "num_experts_per_tok"}
#: Per model type: fields the generic rule cannot derive.
OVERRIDES: dict[str, dict] = {
    "ctrl": dict(dff=128),  # its intermediate size
    "longcat_flash": dict(num_layers=2),  # its num_hidden_layers
    "hrm_text": dict(H_cycles=1, L_cycles=1),  # its recurrent steps: 2 x 3 by default, slow
    "granitemoehybrid": dict(num_hidden_layers=2, layer_types=["mamba", "attention"]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),  # layer_types is required
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    "nemotron": dict(num_key_value_heads=2),  # None by default, which the model cannot take
    "zaya": dict(num_experts_per_tok=1),  # the only value it supports
}
#: Model types that cannot be built tiny from their config alone, and why.
_MULTIMODAL = "multimodal: its vision (or audio) tower's config keeps its full size"
NOT_TINY: dict[str, str] = {
    "cohere_compass_text": "building it fails inside transformers: its rotary embedding reads "
    "rope_parameters['full_attention'], which the default config leaves empty",
    "dbrx": "building it fails inside transformers: 'DbrxAttentionConfig' object has no attribute "
    "'rope_theta'",
    "dots3_note": _MULTIMODAL,
    "dots3_note_text": "its full-attention layers take their sizes (a 1024-wide latent over 20480 "
    "outputs) from fields of their own",
    "emu3": _MULTIMODAL + " (a VQ image tokenizer)",
    "fuyu": _MULTIMODAL,
    "gemma3": _MULTIMODAL + "; swept as gemma3_text",
    "gemma3n": _MULTIMODAL + "; needs timm; swept as gemma3n_text",
    "gemma4": _MULTIMODAL + "; swept as gemma4_text",
    "gemma4_assistant": "a draft model for Gemma-4: its config validator refuses the tiny sizes",
    "gemma4_unified": _MULTIMODAL + "; swept as gemma4_unified_text",
    "gemma4_unified_assistant": "a draft model: its layers reuse the target model's cache",
    "got_ocr2": _MULTIMODAL,
    "llama4": _MULTIMODAL + "; swept as llama4_text",
    "mllama": _MULTIMODAL + " (cross-attention layers to image features)",
    "moshi": _MULTIMODAL + " (a speech codec and a depth decoder)",
    "moss_transcribe_diarize": _MULTIMODAL,
    "phi4_multimodal": _MULTIMODAL,
}


#: Types also run through ``"attn_ref_kernels"``: multi-head latent attention (query/key head dim
#: 32, value head dim 16), sliding and full layers with a scale that is not d**-0.5, multi-query.
KERNELS_SAMPLE = ("deepseek_v3", "gemma3_text", "gpt_bigcode")


def decoder_types() -> list[str]:
    """The model types swept, sorted (see the module docstring)."""
    types = []
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
            continue
        if getattr(transformers, class_name)._supports_attention_backend:
            types.append(model_type)
    return sorted(types)


def swept_types() -> list[str]:
    """:func:`decoder_types` that can be built tiny (not in :data:`NOT_TINY`)."""
    return [t for t in decoder_types() if t not in NOT_TINY]


def tiny_config(model_type: str):
    """The type's default config with :data:`TINY` and :data:`OVERRIDES` applied."""
    config_class = CONFIG_MAPPING[model_type]
    default = config_class().to_dict()
    names = getattr(config_class, "attribute_map", {})  # GPT-2 style: hidden_size is n_embd
    fields = {names.get(k, k): v for k, v in TINY.items()}
    # fields the default leaves to the model (None) stay so, but for the shapes the model needs
    fields = {k: v for k, v in fields.items() if default.get(k) is not None or k in SHAPES}
    heads, kv_heads = (names.get(k, k) for k in ("num_attention_heads", "num_key_value_heads"))
    if default.get(heads) is not None and default.get(heads) == default.get(kv_heads):
        fields[kv_heads] = TINY["num_attention_heads"]  # multi-head (and latent) attention stays so
    layer_types = default.get("layer_types")
    if layer_types:
        fields["layer_types"] = list(dict.fromkeys(layer_types))  # one layer of each type
        fields["num_hidden_layers"] = len(fields["layer_types"])
    if default.get("sliding_window"):
        fields["sliding_window"] = WINDOW
    fields.update(OVERRIDES.get(model_type, {}))
    return config_class(**fields)


class NotTiny(ValueError):
    """The config, tiny as :func:`tiny_config` makes it, still builds a large model."""


#: At most this many parameters (embeddings 128 x 64, two layers of a few experts: about 0.2M).
MAX_PARAMETERS = 2_000_000


def tiny_model(model_type: str, dtype: torch.dtype = torch.float32):
    """The tiny model of ``model_type``, same weights every call, in eval mode."""
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    config = tiny_config(model_type)
    with torch.device("meta"):
        size = sum(p.numel() for p in model_class(config).parameters())
    if size > MAX_PARAMETERS:
        raise NotTiny(f"{model_type}: {size} parameters from {config}")
    torch.manual_seed(1)
    return model_class(config).to(dtype).eval()


def padded_batch() -> dict:
    """``input_ids`` (3, 6) and a left-padding ``attention_mask`` (rows padded by 3, 1, 0)."""
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(3, 128, (3, 6), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, pad in enumerate((3, 1, 0)):
        attention_mask[row, :pad] = 0
    return dict(input_ids=input_ids, attention_mask=attention_mask)


def greedy(model, implementation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy ``generate`` of :func:`padded_batch`: ``(tokens (3, n), logits (3, n, vocab))``."""
    model.set_attn_implementation(implementation)
    inputs = padded_batch()
    out = model.generate(
        **inputs,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[:, inputs["input_ids"].shape[1] :], torch.stack(out.logits, 1).float()


@dataclass
class Result:
    """One architecture through one implementation.

    ``outcome``: ``"identical"`` (eager's tokens, logits within :func:`tolerance`), ``"refused"``
    (raised by a catalogued raise of this package; ``detail`` is the entry's slug), ``"different"``
    (ran, other tokens or logits: ``detail`` says how far), ``"crash"`` (any other error:
    ``detail`` is its type).
    """

    model_type: str
    implementation: str
    outcome: str
    detail: str
    error: float = 0.0  # max |logit error| against eager, when it ran

    def label(self) -> str:
        """The outcome as the table prints it (no machine-dependent digits)."""
        if self.outcome == "refused":
            return f"refused: `{self.detail}`"
        if self.outcome == "different":
            return f"**different** ({self.detail})"
        if self.outcome == "crash":
            return f"**crash** ({self.detail})"
        return self.outcome


def catalogued_slug(exc: BaseException) -> Optional[str]:
    """The slug of the catalog entry whose raise statement raised ``exc`` (this package's own
    refusal), or None."""
    location = catalog.raise_location(exc)
    entry = catalog.at_location(*location) if location else None
    if entry is None or entry["exception"]["type"] != type(exc).__name__:
        return None
    return entry["slug"]


@lru_cache(maxsize=None)
def eager(model_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager's greedy tokens and logits for the tiny model (computed once per type)."""
    return greedy(tiny_model(model_type), "eager")


def tolerance(model_type: str) -> float:
    """FlashAttention's rule with transformers' ``sdpa`` as the baseline: twice ``sdpa``'s error
    against eager plus :data:`LOGITS_ATOL` (:data:`LOGITS_ATOL` alone for a model without
    ``sdpa``). Models whose layers amplify fp32 rounding (HRM's recurrent steps, Nemotron's logits
    of size 10) get the room their own ``sdpa`` needs."""
    model = tiny_model(model_type)
    if not model._supports_sdpa:
        return LOGITS_ATOL
    tokens, logits = greedy(model, "sdpa")
    return LOGITS_ATOL + 2 * (logits - eager(model_type)[1]).abs().max().item()


def check(model_type: str, implementation: str) -> Result:
    """Run the tiny model with ``implementation`` and compare with eager (see :class:`Result`)."""
    expected_tokens, expected_logits = eager(model_type)
    try:
        tokens, logits = greedy(tiny_model(model_type), implementation)
    except Exception as exc:  # what the sweep reports: catalogued or not
        slug = catalogued_slug(exc)
        if slug:
            return Result(model_type, implementation, "refused", slug)
        return Result(model_type, implementation, "crash", type(exc).__name__)
    same = (tokens == expected_tokens).float().mean().item()
    error = (logits - expected_logits).abs().max().item()
    if same == 1.0 and (error <= LOGITS_ATOL or error <= tolerance(model_type)):  # cheap first
        return Result(model_type, implementation, "identical", "", error)
    return Result(model_type, implementation, "different", f"{same:.0%} of tokens", error)


def bf16_errors(model_type: str, implementation: str) -> tuple[float, float]:
    """Mean |logit error| against fp32 eager of a left-padded bf16 prefill (at the real tokens):
    ``(implementation's, baseline's)``; the baseline is ``sdpa`` (``eager`` in bf16 where the
    model has no ``sdpa``)."""
    inputs = padded_batch()
    real = inputs["attention_mask"].bool()

    def logits(model, name):
        model.set_attn_implementation(name)
        with torch.no_grad():
            return model(**inputs).logits.float()[real]

    exact = logits(tiny_model(model_type), "eager")
    model = tiny_model(model_type, torch.bfloat16)
    baseline = "sdpa" if model._supports_sdpa else "eager"
    return tuple(
        (logits(model, name) - exact).abs().mean().item() for name in (implementation, baseline)
    )
