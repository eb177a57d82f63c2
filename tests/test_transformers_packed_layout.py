""":func:`attn_ref.integrations.packed_layout.packed_layout` is exact or refuses: the mask that the
varlen call it describes computes (FA3's bottom-right causal rule per sequence, its window) is the
mask it was given, on every query that sees a key; otherwise it returns None.

Masks: the patterns transformers builds (causal with left, right and inner padding, packed
sequences, sliding windows, a static cache's empty slots, decode rows) and random boolean masks
(mostly refused; the few accepted must be exact too)."""

from __future__ import annotations

import pytest
import torch

from attn_ref.integrations.packed_layout import packed_layout


def computed_mask(layout, shape) -> torch.Tensor:
    """``(b, sq, skv)`` bool: the keys the varlen call of ``layout`` shows each query row."""
    mask = torch.zeros(shape, dtype=torch.bool)
    cu_q, cu_k = layout.cu_seqlens_q.tolist(), layout.cu_seqlens_k.tolist()
    for s in range(len(cu_q) - 1):
        nq, nk = cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]
        for i in range(nq):
            last = i + nk - nq  # bottom-right causal
            first = 0 if layout.window_left < 0 else max(0, last - layout.window_left)
            row = cu_q[s] + i
            for c in range(first, last + 1):
                key = cu_k[s] + c
                assert layout.key_batch[key] == layout.query_batch[row]
                mask[
                    layout.query_batch[row], layout.query_position[row], layout.key_position[key]
                ] = 1
    return mask


def transformers_mask(tokens: torch.Tensor, sq: int, window=None, segments=None, empty=0):
    """Causal (queries on the last ``sq`` positions before ``empty`` unused slots), keys hidden
    where ``tokens`` (b, skv) is 0, within ``window``, within ``segments`` (b, skv) ids."""
    b, skv = tokens.shape
    q = torch.arange(sq)[:, None] + skv - empty - sq
    k = torch.arange(skv)[None, :]
    visible = (k <= q) & (k > q - window if window else True)
    visible = visible[None] & tokens[:, None, :].bool()
    if segments is not None:
        visible = visible & (segments[:, q[:, 0], None] == segments[:, None, :])
    return visible


PATTERNS = {
    "left": transformers_mask(torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]), 6),
    "right": transformers_mask(torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]), 6),
    "inner": transformers_mask(torch.tensor([[1, 1, 1, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1, 1]]), 2),
    "window": transformers_mask(torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]] * 2), 8, window=3),
    "window_decode": transformers_mask(torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]] * 2), 1, window=3),
    "packed": transformers_mask(
        torch.ones(1, 7), 7, segments=torch.tensor([[0, 0, 0, 1, 1, 2, 2]])
    ),
    "packed_window": transformers_mask(
        torch.ones(1, 8), 8, window=2, segments=torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    ),
    "static_cache": transformers_mask(torch.tensor([[0, 1, 1, 1, 0, 0, 0, 0]] * 2), 2, empty=4),
    "bidirectional": torch.ones(2, 3, 5, dtype=torch.bool),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_transformers_patterns_are_computed_exactly(name):
    mask = PATTERNS[name]
    layout = packed_layout(mask)
    assert layout is not None
    seen = mask.any(dim=2, keepdim=True)  # queries that see no key are not computed (out = 0)
    assert torch.equal(computed_mask(layout, mask.shape), mask & seen)


def test_a_row_with_a_hole_is_refused():
    mask = PATTERNS["left"].clone()
    mask[1, 5, 2] = False  # row 5 skips key 2, which rows 2..4 see
    assert packed_layout(mask) is None


def test_random_masks_are_exact_or_refused():
    generator = torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(400):
        mask = torch.rand(2, 3, 4, generator=generator) < 0.6
        layout = packed_layout(mask)
        if layout is not None:
            accepted += 1
            assert torch.equal(computed_mask(layout, mask.shape), mask)
    assert 0 < accepted < 400
