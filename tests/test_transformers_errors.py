"""What the transformers integration refuses (catalogued, raised before any attention is computed,
never computed wrongly), and the errors that teach around it: the heads-first layout hint, the
kernels without a backend (``softcap=None``: in ``tests/test_kvcache_errors.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from transformers.masking_utils import create_causal_mask

import attn_ref
import errors
from attn_ref.integrations.transformers import UnsupportedAttention, attention_forward, check_model
from tests.transformers_models import padded_batch, tiny_model

ROOT = Path(__file__).resolve().parent.parent


def slug(exc: BaseException) -> str:
    return errors.lookup(exc)["slug"]


def test_dropout_in_training_is_refused():
    model = tiny_model("llama")
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1  # as a config with attention_dropout=0.1 builds it
    model.set_attn_implementation("attn_ref")
    model.train()
    with torch.no_grad(), pytest.raises(UnsupportedAttention) as info:
        model(**padded_batch())
    assert slug(info.value) == "transformers/attention-dropout"


def test_custom_4d_mask_is_refused():
    model = tiny_model("llama")
    model.set_attn_implementation("attn_ref")
    inputs = padded_batch()
    mask4d = torch.ones(3, 1, 6, 6, dtype=torch.bool).tril()
    with torch.no_grad(), pytest.raises(UnsupportedAttention) as info:
        model(input_ids=inputs["input_ids"], attention_mask=mask4d)
    assert slug(info.value) == "transformers/four-d-mask"


def test_output_attentions_is_refused():
    model = tiny_model("llama")
    model.set_attn_implementation("attn_ref")
    with torch.no_grad(), pytest.raises(UnsupportedAttention) as info:
        model(**padded_batch(), output_attentions=True)
    assert slug(info.value) == "transformers/output-attentions"


def test_a_model_without_the_attention_interface_is_named():
    """Falcon keeps its own attention classes: transformers raises KeyError: 'attn_ref' building it
    with that name; check_model says why before anything runs."""

    def config():
        return transformers.FalconConfig(
            vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4
        )

    with pytest.raises(KeyError, match="attn_ref"):
        transformers.FalconForCausalLM._from_config(config(), attn_implementation="attn_ref")
    with pytest.raises(UnsupportedAttention) as info:
        check_model(transformers.FalconForCausalLM(config()))
    assert slug(info.value) == "transformers/no-attention-interface"
    assert str(info.value).startswith("FalconForCausalLM does not run its attention")
    check_model(tiny_model("llama"))  # routed: no error


def test_a_mask_that_is_no_varlen_call_is_refused():
    """A row that skips a key other rows see (an and_mask_function with a hole in a row)."""
    model = tiny_model("llama")
    model.set_attn_implementation("attn_ref")
    inputs = padded_batch()
    hole = create_causal_mask(
        config=model.config,
        inputs_embeds=torch.zeros(3, 6, 64),
        attention_mask=inputs["attention_mask"],
        past_key_values=None,
        and_mask_function=lambda b, h, q, kv: (q != 5) | (kv != 2),  # row 5 skips key 2
    )
    query = torch.randn(3, 4, 6, 16)
    key = torch.randn(3, 2, 6, 16)
    with pytest.raises(UnsupportedAttention) as info:
        attention_forward(attn_ref.flash_attn_varlen_func, model, query, key, key, hole)
    assert slug(info.value) == "transformers/mask-pattern"


def test_heads_first_layout_gets_the_hint():
    q, k_cache = torch.randn(2, 1, 4, 16), torch.randn(2, 5, 2, 16)
    with pytest.raises(ValueError) as info:
        attn_ref.flash_attn_with_kvcache(
            q.transpose(1, 2), k_cache.transpose(1, 2), k_cache.transpose(1, 2)
        )
    assert str(info.value).startswith(
        "the number of key/value heads (5) must divide the number of query heads (1); q (2, 4, 1, "
        "16) and k_cache (2, 2, 5, 16) look like (batch, heads, seqlen, dim)"
    )
    odd = torch.randn(2, 1, 3, 16)  # not heads-first: the plain message
    with pytest.raises(ValueError) as info:
        attn_ref.flash_attn_with_kvcache(odd, k_cache, k_cache)
    assert (
        str(info.value)
        == "the number of key/value heads (2) must divide the number of query heads (3)"
    )


KERNELS_ON_CPU = """
import os, torch
{before}
import kernels
{after}
q, cache = torch.randn(1, 1, 2, 16), torch.randn(1, 4, 2, 16)
k_new = torch.randn(1, 1, 2, 16)
before = cache.clone()
try:
    kernels.flash_attn_with_kvcache(q, cache, cache.clone(), k=k_new, v=k_new, cache_seqlens=torch.tensor([2], dtype=torch.int32))
except NotImplementedError as exc:
    print(type(exc).__name__, str(exc))
    print(exc.__notes__[0])
    print('untouched', torch.equal(cache, before))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
@pytest.mark.parametrize("late", [False, True], ids=["no_interpreter", "interpreter_set_late"])
def test_kernels_without_a_backend_name_the_fix(late):
    script = KERNELS_ON_CPU.format(
        before="", after="os.environ['TRITON_INTERPRET'] = '1'" if late else ""
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.splitlines()
    expected = "kernels/interpreter-set-late" if late else "kernels/no-device"
    assert out[0].startswith("NotImplementedError "), out
    assert errors.get(expected)["id"] in out[1] and out[2] == "untouched True", out
