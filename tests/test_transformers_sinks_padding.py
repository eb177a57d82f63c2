"""Sinks, right padding and sliding windows the model does not pass on, through
``attn_implementation="attn_ref"`` / ``"attn_ref_kernels"``, against eager (fp32).

* **Sinks.** GPT-OSS passes its per-head sink logits as ``s_aux``; the integration hands them to
  ``flash_attn_varlen_func(sinks=...)``. Dropped, 12.5% of greedy tokens matched eager.
* **Right padding** in a plain forward (scoring): the padding keys are dropped from the packed
  keys, so every real token sees what eager's mask gives it; a right-padding query sees the tokens
  before it, as in eager, so every logit matches, padding positions included. In ``generate`` the
  new tokens follow the padding (padding between tokens): the same, and the tokens match eager's
  (transformers warns that right padding gives poor generations; it gives eager's).
* **Sliding window from the mask.** Qwen2-MoE builds sliding-window masks for its sliding layers
  but does not pass ``sliding_window`` to the attention function: the window is read off the mask
  (41.7% of tokens matched eager when it was taken from the keyword). Its default config (no
  sliding layer, a window of 0 in the unused sliding mask) runs too.

Tokens equal, logits within ``1e-5`` of eager (measured: at most 4e-6 for the reference, 4.3e-6 for
the kernels). The kernels (interpreted on a CPU) run the small cases: GPT-OSS's generate and
Gemma-2's right-padded forward.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.transformers_models import COMMON, FAMILIES, WINDOW, greedy, padded_batch, tiny_model

TOLERANCE = 1e-5
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def gpt_oss():
    torch.manual_seed(1)
    config = transformers.GptOssConfig(
        **COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW
    )
    return transformers.GptOssForCausalLM(config).eval()


def qwen2_moe(**window):
    torch.manual_seed(1)
    config = transformers.Qwen2MoeConfig(
        **COMMON, **MOE, shared_expert_intermediate_size=32, max_window_layers=2, **window
    )
    return transformers.Qwen2MoeForCausalLM(config).eval()


def assert_generate_is_eager(model, implementation: str, inputs: dict, new_tokens: int):
    model.set_attn_implementation("eager")
    eager_tokens, eager_logits = greedy(model, inputs, new_tokens)
    model.set_attn_implementation(implementation)
    tokens, logits = greedy(model, inputs, new_tokens)
    assert torch.equal(tokens, eager_tokens)
    assert (logits - eager_logits).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("implementation", ["attn_ref", "attn_ref_kernels"])
def test_sinks_generate_is_eager(implementation):
    model = gpt_oss()
    assert model.model.layers[0].self_attn.sinks.abs().min() > 0  # sinks that move the softmax
    assert_generate_is_eager(model, implementation, padded_batch(), 3)


def right_padded() -> dict:
    inputs = padded_batch()
    inputs["attention_mask"] = inputs["attention_mask"].flip(1)  # rows padded by 3, 1, 0 tokens
    return inputs


@pytest.mark.parametrize(
    "family,implementation",
    [(family, "attn_ref") for family in FAMILIES] + [("gemma2", "attn_ref_kernels")],
)
def test_right_padding_forward_is_eager(family, implementation):
    model, inputs = tiny_model(family), right_padded()
    logits = {}
    for name in ("eager", implementation):
        model.set_attn_implementation(name)
        with torch.no_grad():
            logits[name] = model(**inputs).logits
    assert (logits[implementation] - logits["eager"]).abs().max().item() <= TOLERANCE


def test_right_padding_generate_is_eager():
    assert_generate_is_eager(tiny_model("mistral"), "attn_ref", right_padded(), 4)


def test_sliding_window_is_read_off_the_mask():
    model = qwen2_moe(use_sliding_window=True, sliding_window=WINDOW)
    attention = model.model.layers[0].self_attn
    assert attention.sliding_window == WINDOW  # the layer has one, and does not pass it on
    assert_generate_is_eager(model, "attn_ref", padded_batch(), 5)


def test_qwen2_moe_default_config_runs():
    model = qwen2_moe()
    assert model.config.sliding_window == 0 and "sliding_attention" not in model.config.layer_types
    assert_generate_is_eager(model, "attn_ref", padded_batch(), 3)
