"""The key range of a tile of query rows (block skipping) against the visibility matrix.

:meth:`attn_ref.masks.AttentionMask.tile_key_range` must give exactly the keys some row of the tile
sees and exactly those every row sees, by :meth:`attn_ref.masks.AttentionMask.visible_keys`; the
kernel's jit helpers of :mod:`kernels.masks`, given the mask's argument group
(:meth:`~attn_ref.masks.AttentionMask.kernel_args`), must give the same four numbers and the same
matrix (run here in small kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hypothesis import given, settings, strategies as st

from attn_ref.masks import AttentionMask
from kernels import masks as kernel_masks


@st.composite
def tiles(draw):
    """A mask, lengths, a non-empty row tile and a key range ``[key_start, key_end)`` (a split)."""
    seqlen_q = draw(st.integers(1, 24))
    seqlen_k = draw(st.integers(1, 40))
    causal = draw(st.booleans())
    window = (draw(st.integers(-1, 12)), draw(st.integers(-1, 12)))
    chunk = draw(st.sampled_from([0, 0, 1, 3, 4, 7, 16]))
    row_start = draw(st.integers(0, seqlen_q - 1))
    row_end = draw(st.integers(row_start + 1, seqlen_q))
    key_start = draw(st.integers(0, seqlen_k))
    key_end = draw(st.integers(key_start, seqlen_k))
    mask = AttentionMask(causal=causal, window_size=window, attention_chunk=chunk)
    return dict(
        mask=mask,
        row_start=row_start,
        row_end=row_end,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        key_start=key_start,
        key_end=key_end,
    )


def reference_range(case) -> tuple[int, int, int, int]:
    """The case's ``(lo, hi, full_lo, full_hi)`` by the reference."""
    return case["mask"].tile_key_range(
        case["row_start"],
        case["row_end"],
        case["seqlen_q"],
        case["seqlen_k"],
        case["key_start"],
        case["key_end"],
    )


def as_range(lo: int, hi: int, seqlen_k: int) -> torch.Tensor:
    """(seqlen_k,) bool: ``lo <= j < hi`` (empty when ``hi <= lo``)."""
    j = torch.arange(seqlen_k)
    return (j >= lo) & (j < hi)


@settings(max_examples=400, deadline=None)
@given(tiles())
def test_tile_key_range_is_the_union_and_the_intersection_of_the_rows_keys(case):
    lo, hi, full_lo, full_hi = reference_range(case)
    visible = case["mask"].visible_keys(
        case["seqlen_q"], case["seqlen_k"], row_start=case["row_start"], row_end=case["row_end"]
    )
    in_split = as_range(case["key_start"], case["key_end"], case["seqlen_k"])
    assert lo <= hi  # an empty range may start past key_end: nothing is visited
    assert torch.equal(as_range(lo, hi, case["seqlen_k"]), visible.any(0) & in_split)
    assert torch.equal(as_range(full_lo, full_hi, case["seqlen_k"]), visible.all(0) & in_split)


@triton.jit
def _tile_key_range_of_cases(cases_ptr, out_ptr):
    """One program per case: ``cases[c]`` holds the mask group (3 values) and the 6 other arguments
    of the jit helper, ``out[c]`` its 4 results."""
    c = tl.program_id(0)
    args = cases_ptr + c * 9
    mask = (tl.load(args), tl.load(args + 1), tl.load(args + 2))
    lo, hi, full_lo, full_hi = kernel_masks.tile_key_range(
        mask,
        tl.load(args + 3),
        tl.load(args + 4),
        tl.load(args + 5),
        tl.load(args + 6),
        tl.load(args + 7),
        tl.load(args + 8),
    )
    tl.store(out_ptr + c * 4, lo)
    tl.store(out_ptr + c * 4 + 1, hi)
    tl.store(out_ptr + c * 4 + 2, full_lo)
    tl.store(out_ptr + c * 4 + 3, full_hi)


@settings(max_examples=10, deadline=None)
@given(st.lists(tiles(), min_size=1, max_size=40))
def test_kernel_tile_key_range_agrees_with_the_reference(cases):
    # the kernel's runtime mask values: causal is window_right = 0, -1 an unbounded side, 0 no chunk
    rows = [
        [
            *c["mask"].kernel_args(),
            c["row_start"],
            c["row_end"],
            c["seqlen_q"],
            c["seqlen_k"],
            c["key_start"],
            c["key_end"],
        ]
        for c in cases
    ]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = torch.tensor(rows, dtype=torch.int32, device=device)
    out = torch.empty(len(cases), 4, dtype=torch.int32, device=device)
    _tile_key_range_of_cases[(len(cases),)](args, out)
    expected = [list(reference_range(c)) for c in cases]
    assert out.tolist() == expected


@triton.jit
def _visible_keys_of_tile(
    out_ptr, seqlen_q, seqlen_k, mask, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """``out`` (BLOCK_M, BLOCK_N) int8: the kernel's mask test for rows ``0..BLOCK_M-1``, keys
    ``0..BLOCK_N-1``; ``mask`` is the group ``(window_left, window_right, chunk)``."""
    rows, keys = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N)
    visible = kernel_masks.visible_keys(mask, keys, rows + seqlen_k - seqlen_q)
    tl.store(out_ptr + rows[:, None] * BLOCK_N + keys[None, :], visible.to(tl.int8))


@settings(max_examples=60, deadline=None)
@given(tiles())
def test_kernel_visible_keys_is_the_reference_matrix(case):
    sq, sk = case["seqlen_q"], case["seqlen_k"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # covers seqlen_q <= 24, seqlen_k <= 40
    out = torch.empty(32, 64, dtype=torch.int8, device=device)
    _visible_keys_of_tile[(1,)](out, sq, sk, case["mask"].kernel_args(), BLOCK_M=32, BLOCK_N=64)
    expected = case["mask"].visible_keys(sq, sk)
    assert torch.equal(out[:sq, :sk].bool().cpu(), expected)
