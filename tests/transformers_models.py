"""Tiny random-weight decoders of four transformers families, and a left-padded batch for them.

No downloads: each model is built from a config (hidden 64, 2 layers, 4 query heads over 2
key/value heads, head dim 16, vocabulary 128). The families cover what the attention integration
converts: Llama (GQA), Mistral (sliding window on every layer), Qwen2 (a full and a sliding layer),
Gemma-2 (softcap, sliding and full layers, ``query_pre_attn_scalar`` so the scale is not d**-0.5).
``initializer_range=0.2`` makes attention peaked enough that a wrong mask moves the logits.
"""

from __future__ import annotations

import torch
import transformers

from attn_ref.integrations.transformers import register

register()

WINDOW = 4  # sliding window, shorter than prompt + new tokens
COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    initializer_range=0.2,
)
FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)),
    "mistral": lambda: transformers.MistralForCausalLM(
        transformers.MistralConfig(**COMMON, sliding_window=WINDOW)
    ),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(
            **COMMON,
            use_sliding_window=True,
            sliding_window=WINDOW,
            layer_types=["full_attention", "sliding_attention"],
        )
    ),
    "gemma2": lambda: transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(
            **COMMON,
            sliding_window=WINDOW,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=None,
        )
    ),
}


def tiny_model(
    family: str, dtype: torch.dtype = torch.float32, device="cpu"
) -> transformers.PreTrainedModel:
    """The family's tiny model, same weights every call, in eval mode."""
    torch.manual_seed(1)
    return FAMILIES[family]().to(device=device, dtype=dtype).eval()


def padded_batch(device="cpu", batch: int = 3, length: int = 6) -> dict:
    """``input_ids`` and a left-padding ``attention_mask`` (rows padded by 3, 1 and 0 tokens)."""
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(3, 128, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, pad in enumerate((3, 1, 0)[:batch]):
        attention_mask[row, :pad] = 0
    return dict(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device))


def greedy(model, inputs: dict, new_tokens: int):
    """Greedy ``generate``: ``(new tokens (b, n), logits (b, n, vocab) in float32)``."""
    out = model.generate(
        **inputs,
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[:, inputs["input_ids"].shape[1] :], torch.stack(out.logits, 1).float()
