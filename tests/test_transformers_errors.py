"""What the transformers integration refuses (catalogued, never computed wrongly), and the errors
that teach around it: the heads-first layout hint, the kernels without a backend (``softcap=None``:
in ``tests/test_kvcache_errors.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attn_ref
import errors
from attn_ref.integrations.transformers import UnsupportedAttention, key_range
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


def test_gradients_are_refused():
    model = tiny_model("llama")
    model.set_attn_implementation("attn_ref")
    with pytest.raises(UnsupportedAttention) as info:
        model(**padded_batch())
    assert slug(info.value) == "transformers/no-gradients"


def test_custom_4d_mask_is_refused():
    model = tiny_model("llama")
    model.set_attn_implementation("attn_ref")
    inputs = padded_batch()
    mask4d = torch.ones(3, 1, 6, 6, dtype=torch.bool).tril()
    with torch.no_grad(), pytest.raises(UnsupportedAttention) as info:
        model(input_ids=inputs["input_ids"], attention_mask=mask4d)
    assert slug(info.value) == "transformers/four-d-mask"


def test_right_padding_is_refused_in_generate():
    model = tiny_model("llama")
    model.set_attn_implementation("attn_ref")
    inputs = padded_batch()
    inputs["attention_mask"] = inputs["attention_mask"].flip(1)  # right padding
    with pytest.raises(UnsupportedAttention) as info:
        model.generate(**inputs, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert slug(info.value) == "transformers/mask-with-holes"


def test_packed_sequences_are_refused():
    model = tiny_model("llama")
    model.set_attn_implementation("attn_ref")
    input_ids = padded_batch()["input_ids"][:1]
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2]])  # two sequences packed in one row
    with torch.no_grad(), pytest.raises(UnsupportedAttention) as info:
        model(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    assert slug(info.value) == "transformers/mask-pattern"


def test_key_range_is_leftpad_and_seqlens():
    mask = torch.tensor([[0, 0, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    leftpad, seqlens = key_range(mask, 3, 5, mask.device)
    assert leftpad.tolist() == [2, 0, 0] and seqlens.tolist() == [4, 5, 0]
    assert leftpad.dtype == seqlens.dtype == torch.int32


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
