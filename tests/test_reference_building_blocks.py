"""The building blocks of attn_ref against the dense oracle's independent versions: masks, rotary,
paged addressing, split ranges and the LSE merge."""

import itertools
from functools import reduce

import pytest
import torch

from attn_ref import (
    AttentionMask,
    apply_rotary,
    dense,
    gather_cache,
    merge_attention_states,
    paged_to_dense,
    scatter_cache,
    split_bounds,
)
from attn_ref.paged import gather_range
from dense_oracle import logical_cache, rope

INF = float("inf")


def test_visible_keys_is_the_dense_mask():
    for sq, sk, causal, left, right, chunk in itertools.product(
        range(0, 6), range(0, 7), (False, True), (-1, 0, 1, 3), (-1, 0, 2), (0, 1, 2, 3)
    ):
        expected = dense.visible(sq, sk, causal, (left, right), chunk)
        mask = AttentionMask(causal=causal, window_size=(left, right), attention_chunk=chunk)
        assert torch.equal(mask.visible_keys(sq, sk), expected)
        if sq > 2:  # a slice of rows, as the row-chunked attention asks for
            assert torch.equal(mask.visible_keys(sq, sk, None, 1, 3), expected[1:3])


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rotary_dim", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_apply_rotary_matches_rotate_half_form(interleaved, rotary_dim, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 48, generator=gen).to(dtype)
    angles = torch.rand(20, rotary_dim // 2, generator=gen) * 6.3
    positions = torch.tensor([0, 7, 7, 19, 3])
    y = apply_rotary(x, angles.cos(), angles.sin(), positions, interleaved)
    assert y.dtype == torch.float32
    torch.testing.assert_close(
        y, rope(x, angles.cos(), angles.sin(), positions, interleaved), rtol=1e-6, atol=1e-6
    )
    assert torch.equal(y[..., rotary_dim:], x[..., rotary_dim:].float())  # the tail passes through
    torch.testing.assert_close(y.norm(dim=-1), x.float().norm(dim=-1))  # a rotation keeps the norm


def test_paged_addressing_round_trip():
    gen = torch.Generator().manual_seed(1)
    cache = torch.randn(9, 4, 2, 8, generator=gen)  # 9 pages of 4 tokens
    table = torch.tensor([[5, 0, 7], [2, 8, 1]], dtype=torch.int32)
    assert torch.equal(paged_to_dense(cache, table), logical_cache(cache, table))
    positions = torch.tensor([0, 3, 4, 9, 11])
    assert torch.equal(
        gather_cache(cache, 1, positions, table), logical_cache(cache, table)[1, positions]
    )
    values = torch.randn(5, 2, 8, generator=gen)
    scatter_cache(cache, 1, positions, values, table)
    assert torch.equal(gather_cache(cache, 1, positions, table), values)
    # page 1 = table[1, 2]
    assert torch.equal(cache[2, 0], values[0]) and torch.equal(cache[1, 3], values[4])
    dense = torch.randn(3, 6, 2, 8, generator=gen)
    assert torch.equal(gather_cache(dense, 2, positions[:3]), dense[2, positions[:3]])


@pytest.mark.parametrize("start, end", [(0, 12), (1, 3), (3, 5), (4, 8), (5, 11), (6, 6), (12, 12)])
def test_gather_range_reads_what_gather_cache_reads(start, end):
    """Whole pages (a copy) or a view of a contiguous cache: the positions [start, end), across page
    edges."""
    gen = torch.Generator().manual_seed(2)
    cache = torch.randn(9, 4, 2, 8, generator=gen)  # 9 pages of 4 tokens, 3 per sequence
    table = torch.tensor([[5, 0, 7], [2, 8, 1]], dtype=torch.int32)
    positions = torch.arange(start, end)
    assert torch.equal(
        gather_range(cache, 1, start, end, table), gather_cache(cache, 1, positions, table)
    )
    dense = torch.randn(3, 12, 2, 8, generator=gen)
    assert torch.equal(gather_range(dense, 2, start, end), gather_cache(dense, 2, positions))


@pytest.mark.parametrize("seqlen_k, n", [(10, 3), (9, 3), (2, 5), (0, 3), (7, 1)])
def test_split_bounds_cover_the_keys_in_order(seqlen_k, n):
    bounds = split_bounds(seqlen_k, n)
    assert len(bounds) == n and bounds[0][0] == 0 and bounds[-1][1] == seqlen_k
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # consecutive, no gap, no overlap
    length = -(-seqlen_k // n)
    assert all(0 <= end - start <= length for start, end in bounds)


def test_merge_of_disjoint_key_sets_is_attention_over_their_union():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(4, 6, 16, generator=gen),
        torch.randn(11, 2, 16, generator=gen),
        torch.randn(11, 2, 8, generator=gen),
    )

    def attend(keys):  # the state over these keys: out (s_q, h, d_v), lse (s_q, h)
        out, lse = dense.attention(q[None], k[None, keys], v[None, keys], 0.3)
        return out[0], lse[0].T

    whole_out, whole_lse = attend(slice(None))
    states = [attend(slice(a, b)) for a, b in [(0, 4), (4, 5), (5, 11)]]
    out, lse = reduce(lambda x, y: merge_attention_states(*x, *y), states)
    torch.testing.assert_close(out, whole_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, whole_lse, rtol=1e-5, atol=1e-6)
    # Any order: (c ⊕ a) ⊕ b
    out2, lse2 = merge_attention_states(*merge_attention_states(*states[2], *states[0]), *states[1])
    torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse2, lse, rtol=1e-5, atol=1e-6)


def test_merge_empty_and_infinite_states():
    o_a, o_b = (
        torch.full((3, 4), 2.0, dtype=torch.float16),
        torch.full((3, 4), 5.0, dtype=torch.float16),
    )
    lse_a = torch.tensor([-INF, -INF, INF], dtype=torch.float16)
    lse_b = torch.tensor([-INF, 0.5, 0.5], dtype=torch.float16)
    out, lse = merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert out.dtype == lse.dtype == torch.float32 and not out.isnan().any()
    assert torch.equal(out[0], torch.zeros(4)) and lse[0] == -INF  # nothing on either side
    assert torch.equal(out[1:], torch.full((2, 4), 5.0)) and torch.equal(
        lse[1:], torch.full((2,), 0.5)
    )  # +inf = empty
    # Equal LSEs: the average, and lse + log 2.
    out, lse = merge_attention_states(
        o_a[:1].float(), torch.tensor([1.0]), o_b[:1].float(), torch.tensor([1.0])
    )
    torch.testing.assert_close(out, torch.full((1, 4), 3.5))
    torch.testing.assert_close(lse, torch.tensor([1.0 + torch.log(torch.tensor(2.0)).item()]))
