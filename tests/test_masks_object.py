"""The mask object, :class:`attn_ref.masks.AttentionMask`: FA's options, normalised as FA3 does.

* Normalisation: ``causal`` sets the right side to 0, a negative side is unbounded (-1), a chunk
  that is None or ``<= 0`` is off (0); equal masks are equal and hash alike, whichever options
  spelled them; ``AttentionMask(**mask.options()) == mask``; the properties.
* :meth:`~attn_ref.masks.AttentionMask.bounded`: FA3's rule for the static lengths (a side that
  hides no key is unbounded, causal keeps its right side, the chunk is capped).
* Bad options raise what ``flash_attn_with_kvcache`` raises for them: the same type, the same text,
  the same catalog entry.
"""

from __future__ import annotations

import pytest
import torch

import errors
from attn_ref import AttentionMask, flash_attn_with_kvcache
from attn_ref.conformance.error_cases import base
from attn_ref.masks import CAUSAL, NO_MASK

#: (FA options, the normalised ``(window_left, window_right, chunk)``)
NORMALISED = [
    ({}, (-1, -1, 0)),
    (dict(causal=True), (-1, 0, 0)),
    (dict(causal=True, window_size=(3, 5)), (3, 0, 0)),
    (dict(causal=True, window_size=(-1, -1)), (-1, 0, 0)),
    (dict(window_size=(-1, 0)), (-1, 0, 0)),
    (dict(window_size=(-7, -2)), (-1, -1, 0)),
    (dict(window_size=(4, -3)), (4, -1, 0)),
    (dict(window_size=(0, 0)), (0, 0, 0)),
    (dict(attention_chunk=None), (-1, -1, 0)),
    (dict(attention_chunk=-8), (-1, -1, 0)),
    (dict(attention_chunk=8), (-1, -1, 8)),
    (dict(causal=True, attention_chunk=8), (-1, 0, 8)),
    (dict(causal=1, window_size=[2, 9], attention_chunk=torch.tensor(6)), (2, 0, 6)),
]


@pytest.mark.parametrize("options, expected", NORMALISED, ids=[repr(o) for o, _ in NORMALISED])
def test_options_are_normalised_as_fa3_does(options, expected):
    mask = AttentionMask(**options)
    assert mask.kernel_args() == expected
    assert mask.window_size == expected[:2]
    assert AttentionMask(**mask.options()) == mask
    assert mask.hides_keys == (expected != (-1, -1, 0))
    assert mask.causal == (expected == (-1, 0, 0))


def test_equal_masks_are_equal_and_hash_alike():
    spellings = [
        AttentionMask(causal=True),
        AttentionMask(window_size=(-1, 0)),
        AttentionMask(causal=True, window_size=(-5, 7), attention_chunk=0),
        CAUSAL,
    ]
    assert all(mask == CAUSAL and hash(mask) == hash(CAUSAL) for mask in spellings)
    assert len(set(spellings)) == 1
    assert AttentionMask(attention_chunk=None) == AttentionMask(attention_chunk=-3) == NO_MASK
    assert CAUSAL != NO_MASK and CAUSAL != AttentionMask(causal=True, attention_chunk=4)
    assert CAUSAL != (-1, 0, 0)  # a mask equals masks only


def test_masks_are_immutable():
    with pytest.raises(AttributeError):
        CAUSAL.window_right = -1
    assert CAUSAL.kernel_args() == (-1, 0, 0)


def test_the_visibility_follows_the_normalised_mask():
    """Spellings of one mask see the same keys; causal is the window ``(-1, 0)``."""
    for sq, sk in ((3, 7), (6, 6), (5, 2)):
        window = AttentionMask(window_size=(-1, 0))
        assert torch.equal(CAUSAL.visible_keys(sq, sk), window.visible_keys(sq, sk))
        assert NO_MASK.visible_keys(sq, sk).all()


#: (mask, seqlen_q, seqlen_k, the bounded ``(window_left, window_right, chunk)``)
BOUNDED = [
    (AttentionMask(window_size=(9, 9)), 10, 10, (-1, -1, 0)),  # both sides >= lengths - 1
    (AttentionMask(window_size=(8, 8)), 10, 10, (8, 8, 0)),
    (AttentionMask(window_size=(3, 4)), 5, 4, (-1, -1, 0)),  # left >= s_k - 1, right >= s_q - 1
    (AttentionMask(window_size=(3, 4)), 6, 5, (3, 4, 0)),
    (AttentionMask(causal=True, window_size=(100, 100)), 1, 4, (-1, 0, 0)),  # causal keeps 0
    (AttentionMask(causal=True), 1, 1, (-1, 0, 0)),
    (AttentionMask(attention_chunk=1000), 7, 30, (-1, -1, 30)),  # capped at the longer length
    (AttentionMask(attention_chunk=1000), 40, 30, (-1, -1, 40)),
    (AttentionMask(attention_chunk=1000), 0, 0, (-1, -1, 1)),
    (AttentionMask(attention_chunk=16), 7, 30, (-1, -1, 16)),
    (NO_MASK, 3, 3, (-1, -1, 0)),
]


@pytest.mark.parametrize("mask, seqlen_q, seqlen_k, expected", BOUNDED)
def test_bounded_is_fa3s_rule(mask, seqlen_q, seqlen_k, expected):
    bounded = mask.bounded(seqlen_q, seqlen_k)
    assert bounded.kernel_args() == expected
    if seqlen_q and seqlen_k:  # the same keys are visible
        lengths = seqlen_q, seqlen_k
        assert torch.equal(bounded.visible_keys(*lengths), mask.visible_keys(*lengths))


#: Bad values of FA's mask options (each raises the same error from both).
BAD_OPTIONS = [
    dict(window_size=(1,)),
    dict(window_size=(1.9, -1)),
    dict(window_size=(True, -1)),
    dict(window_size=(10**30, -1)),
    dict(window_size=None),
    dict(attention_chunk="x"),
    dict(attention_chunk=2**70),
    dict(causal="False"),
    dict(causal=torch.tensor([True, False])),
    dict(causal=2),
]


@pytest.mark.parametrize("options", BAD_OPTIONS, ids=[repr(o) for o in BAD_OPTIONS])
def test_bad_options_raise_flash_attn_with_kvcaches_catalogued_error(options):
    with pytest.raises((TypeError, ValueError)) as from_kvcache:
        flash_attn_with_kvcache(**base(), **options)
    with pytest.raises((TypeError, ValueError)) as from_mask:
        AttentionMask(**options)
    assert type(from_mask.value) is type(from_kvcache.value)
    assert str(from_mask.value) == str(from_kvcache.value)
    entry = errors.lookup(from_mask.value)
    assert entry is not None and entry["id"] == errors.lookup(from_kvcache.value)["id"]
