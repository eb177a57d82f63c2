"""Errors around the transformers integration that explain themselves: ``python -m errors explain``
reads the package's own exception classes (dotted or not) and transformers' "not registered"
messages for ``"attn_ref"`` (answer: call ``register()``), and the integration's refusals carry
their catalog note."""

from __future__ import annotations

import traceback

import pytest
import torch
from transformers import AttentionInterface, DogeConfig

import errors
from attn_ref.integrations.transformers import (
    IMPLEMENTATIONS,
    UnsupportedAttention,
    register,
    visibility_mask,
)
from attn_ref.packages import KernelsNameTaken, check_hub_kernels
from errors.__main__ import main
from errors.pasted import read
from tests.transformers_models import padded_batch, tiny_model

NOT_REGISTERED = "transformers/not-registered"


def note_slug(exc: BaseException) -> str:
    """The slug the exception's attn-ref note names (``attn-ref error <id>: <slug>; ...``)."""
    (note,) = [n for n in getattr(exc, "__notes__", []) if n.startswith("attn-ref error ")]
    return note.split(": ", 1)[1].split(";", 1)[0]


@pytest.mark.parametrize(
    "line, exception_type",
    [
        ("attn_ref.integrations.transformers.UnsupportedAttention: no", "UnsupportedAttention"),
        ("UnsupportedAttention: no", "UnsupportedAttention"),
        ("attn_ref.packages.KernelsNameTaken: `kernels` is either", "KernelsNameTaken"),
        ("KernelsNameTaken: `kernels` is either", "KernelsNameTaken"),
        ("E   attn_ref.integrations.transformers.UnsupportedAttention: no", "UnsupportedAttention"),
        ("Note: a remark, not an exception", None),
        ("HINT: a remark, not an exception", None),
    ],
)
def test_any_exception_class_is_read(line, exception_type):
    assert read(line).exception_type == exception_type


def unregistered(name: str):
    """A context in which transformers does not know ``name`` (registered again afterwards)."""

    class Unregistered:
        def __enter__(self):
            self.saved = AttentionInterface._global_mapping.pop(name)

        def __exit__(self, *exc):
            AttentionInterface._global_mapping[name] = self.saved

    return Unregistered()


def traceback_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_forgetting_register_is_explained(name):
    register()
    model = tiny_model("llama")
    with unregistered(name), pytest.raises(ValueError) as info:
        model.set_attn_implementation(name)
    assert f'`attn_implementation="{name}"` is not supported' in str(info.value)
    assert errors.lookup(traceback_text(info.value))["slug"] == NOT_REGISTERED


def test_an_unregistered_name_at_the_forward_is_explained():
    """A config whose implementation was set by hand: transformers' KeyError (its text quoted)."""
    register()
    model = tiny_model("llama")
    model.config._attn_implementation = "attn_ref"
    with unregistered("attn_ref"), torch.no_grad(), pytest.raises(KeyError) as info:
        model(**padded_batch())
    assert errors.lookup(traceback_text(info.value))["slug"] == NOT_REGISTERED


def test_search_register_finds_it(capsys):
    assert main(["search", "register"]) == 0
    assert NOT_REGISTERED in capsys.readouterr().out


def test_integration_refusals_carry_their_note():
    model = tiny_model("llama")
    model.set_attn_implementation("attn_ref")
    with torch.no_grad(), pytest.raises(UnsupportedAttention) as info:  # refused by the attention
        model(**padded_batch(), output_attentions=True)
    assert note_slug(info.value) == "transformers/output-attentions"
    assert errors.lookup(traceback_text(info.value))["slug"] == "transformers/output-attentions"
    with pytest.raises(UnsupportedAttention) as info:  # refused by the mask function
        visibility_mask(2, 3, 3, attention_mask=torch.ones(2, 3), config=DogeConfig())
    assert note_slug(info.value) == "transformers/no-flash-attention-support"


def test_kernels_name_clash_carries_its_note():
    with pytest.raises(KernelsNameTaken) as info:
        check_hub_kernels()  # in this checkout `kernels` is attn-ref's
    assert note_slug(info.value) == "environment/kernels-name-clash"
    assert errors.lookup(traceback_text(info.value))["slug"] == "environment/kernels-name-clash"
