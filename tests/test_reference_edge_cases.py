"""Hand-computed tiny cases of the reference, SDPA cross-checks, row chunking, memory bound.

Zero-length KV, empty sequences and calls without query rows are tested over both implementations
in :mod:`test_kvcache_layouts`.

Visibility tests use ``q = 0`` (every visible key gets logit 0) and one-hot values ``v[p] = e_p``
for cache position ``p``: row ``i`` of the output is then the average of the one-hots it sees, so
the output spells out the mask, and the LSE is ``log(count)``.
"""

import math

import pytest
import torch

import attn_ref.attention
from attn_ref import dense, flash_attn_with_kvcache
from dense_oracle import sdpa_attention
from kvcache_cases import clone_args, make_case

INF = float("inf")


def one_hot_call(sq, capacity, cache_seqlens, leftpad=0, sinks=None, **options):
    """b=1, h=h_k=1, d=dv=capacity: q = 0, v[p] = e_p. Returns (out (sq, capacity), lse (sq,))."""
    q = torch.zeros(1, sq, 1, capacity)
    k_cache = torch.randn(1, capacity, 1, capacity)
    v_cache = torch.eye(capacity)[None, :, None, :]
    out, lse, *_ = flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        cache_seqlens=torch.tensor([cache_seqlens], dtype=torch.int32),
        cache_leftpad=torch.tensor([leftpad], dtype=torch.int32),
        sinks=sinks,
        return_softmax_lse=True,
        **options,
    )
    return out[0, :, 0], lse[0, 0]


VISIBILITY = {
    # name: (sq, sk, options, visible cache positions per row)
    "causal_sq2_sk5": (2, 5, dict(causal=True), [{0, 1, 2, 3}, {0, 1, 2, 3, 4}]),
    "causal_sq5_sk2": (5, 2, dict(causal=True), [set(), set(), set(), {0}, {0, 1}]),
    "window_1_0_sq2_sk5": (2, 5, dict(window_size=(1, 0)), [{2, 3}, {3, 4}]),
    "window_1_1_sq5_sk2": (5, 2, dict(window_size=(1, 1)), [set(), set(), {0}, {0, 1}, {0, 1}]),
    "causal_forces_right_0": (2, 5, dict(causal=True, window_size=(1, 3)), [{2, 3}, {3, 4}]),
    "chunk_4": (6, 6, dict(attention_chunk=4), [{0, 1, 2, 3}] * 4 + [{4, 5}] * 2),
    "chunk_4_sq2": (2, 6, dict(attention_chunk=4), [{4, 5}] * 2),
    "chunk_negative_diag": (5, 2, dict(attention_chunk=2), [set(), set(), set(), {0, 1}, {0, 1}]),
    "causal_chunk": (3, 5, dict(causal=True, attention_chunk=2), [{2}, {2, 3}, {4}]),
}


@pytest.mark.parametrize("sq, sk, options, visible", VISIBILITY.values(), ids=VISIBILITY.keys())
def test_visibility(sq, sk, options, visible):
    out, lse = one_hot_call(sq, capacity=8, cache_seqlens=sk, **options)
    for i, keys in enumerate(visible):
        expected = torch.zeros(8)
        expected[sorted(keys)] = 1 / max(len(keys), 1)
        torch.testing.assert_close(out[i], expected)
        assert lse[i] == (math.log(len(keys)) if keys else -INF)


def test_leftpad_shifts_key_indices():
    # Valid positions [3, 7): key j is position 3 + j; causal sq=2 sees keys 0..2 then 0..3.
    out, lse = one_hot_call(2, capacity=8, cache_seqlens=7, leftpad=3, causal=True)
    torch.testing.assert_close(out[0], torch.tensor([0, 0, 0, 1, 1, 1, 0, 0]) / 3)
    torch.testing.assert_close(out[1], torch.tensor([0, 0, 0, 1, 1, 1, 1, 0]) / 4)
    # Left window of 1 counted in key indices: row 1 (key 3 = position 6) sees positions 5, 6.
    out, _ = one_hot_call(2, capacity=8, cache_seqlens=7, leftpad=3, window_size=(1, 0))
    torch.testing.assert_close(out[1], torch.tensor([0, 0, 0, 0, 0, 1, 1, 0]) / 2)


def test_empty_rows_with_sink_give_zero_and_sink_lse():
    sink = torch.tensor([0.75], dtype=torch.bfloat16)
    out, lse = one_hot_call(5, capacity=8, cache_seqlens=2, causal=True, sinks=sink)
    s = 0.75
    assert torch.equal(out[:3], torch.zeros(3, 8)) and torch.equal(lse[:3], torch.full((3,), s))
    # Row 3 sees one key with logit 0: weights 1 / (1 + e^s); row 4 sees two.
    torch.testing.assert_close(out[3, 0], torch.tensor(1 / (1 + math.exp(s))))
    torch.testing.assert_close(
        lse[3:], torch.tensor([math.log(1 + math.exp(s)), math.log(2 + math.exp(s))])
    )


def test_softcap_hand_computed_and_applied_before_masking():
    # sq=2, keys k0, k1 with scores (q.k) 3 and -1; scale 1, softcap 2; v = one-hots.
    q = torch.zeros(1, 2, 1, 16)
    q[..., 0] = 1.0
    k_cache = torch.zeros(1, 2, 1, 16)
    k_cache[0, 0, 0, 0], k_cache[0, 1, 0, 0] = 3.0, -1.0
    v_cache = torch.eye(16)[:2][None, :, None, :]
    out, lse, *_ = flash_attn_with_kvcache(
        q, k_cache, v_cache, softmax_scale=1.0, softcap=2.0, causal=True, return_softmax_lse=True
    )
    l0, l1 = 2 * math.tanh(3 / 2), 2 * math.tanh(-1 / 2)
    # Row 0 sees k0 only: a mask applied before the softcap would leak weight e^{-2} to k1.
    assert torch.equal(out[0, 0, 0, :2], torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(lse[0, 0, 0], torch.tensor(l0))
    p0 = math.exp(l0) / (math.exp(l0) + math.exp(l1))
    torch.testing.assert_close(out[0, 1, 0, :2], torch.tensor([p0, 1 - p0]))
    torch.testing.assert_close(lse[0, 0, 1], torch.tensor(math.log(math.exp(l0) + math.exp(l1))))


def test_sink_hand_computed():
    # One key with logit 1 (scale 1), sink logit -0.5 (not scaled): weight e / (e + e^-0.5).
    q, k_cache, v_cache = (
        torch.ones(1, 1, 2, 16) / 4,
        torch.ones(1, 1, 1, 16) / 4,
        torch.full((1, 1, 1, 16), 2.0),
    )
    sinks = torch.tensor([-0.5, -0.5], dtype=torch.bfloat16)
    out, lse, *_ = flash_attn_with_kvcache(
        q, k_cache, v_cache, softmax_scale=1.0, sinks=sinks, return_softmax_lse=True
    )
    w = math.e / (math.e + math.exp(-0.5))
    torch.testing.assert_close(out, torch.full((1, 1, 2, 16), 2 * w))
    torch.testing.assert_close(lse, torch.full((1, 2, 1), math.log(math.e + math.exp(-0.5))))


@pytest.mark.parametrize("only_qv", [False, True])
def test_qv_hand_computed(only_qv):
    # Two keys; q.k = (1, 0), qv.v = (0, 2): scores (1, 2) with qv, (0, 2) with only_qv.
    q = torch.zeros(1, 1, 1, 16)
    q[..., 0] = 1.0
    k_cache = torch.zeros(1, 2, 1, 16)
    k_cache[0, 0, 0, 0] = 1.0
    v_cache = torch.zeros(1, 2, 1, 32)
    v_cache[0, 0, 0, 1], v_cache[0, 1, 0, 0] = 1.0, 2.0
    qv = torch.zeros(1, 1, 1, 32)
    qv[..., 0] = 1.0
    out, lse, *_ = flash_attn_with_kvcache(
        q, k_cache, v_cache, qv=qv, only_qv=only_qv, return_softmax_lse=True
    )
    scale = 32**-0.5 if only_qv else (16 + 32) ** -0.5  # sglang's default scales
    s0, s1 = (0.0 if only_qv else scale), 2 * scale
    p0 = math.exp(s0) / (math.exp(s0) + math.exp(s1))
    torch.testing.assert_close(out[0, 0, 0, :2], torch.tensor([2 * (1 - p0), p0]))
    torch.testing.assert_close(lse[0, 0, 0], torch.tensor(math.log(math.exp(s0) + math.exp(s1))))


def test_rotary_query_position_rule():
    """Non-causal, non-local: every query row is rotated at cache_seqlens (FixedPosition). The mode
    follows FA3's window normalisation against the static lengths (capacity, max_seqlen_q)."""
    case = make_case(
        batch=1, seqlen_q=2, seqlen_new=2, capacity=12, d=32, rotary_dim=32, varlen_q=True, seed=4
    )
    case["q"] = case["q"][:1].repeat(3, 1, 1)  # three identical query rows, one sequence
    case["cu_seqlens_q"] = torch.tensor([0, 3], dtype=torch.int32)
    # keys [0, 8): query diagonals 5..7
    case["cache_seqlens"] = torch.tensor([6], dtype=torch.int32)
    for name in ("max_seqlen_q", "window_size", "attention_chunk"):
        del case[name]

    def rows_identical(**options):
        out = flash_attn_with_kvcache(**clone_args(case), **options)
        return torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])

    # Masks below are all no-ops for these 3 rows; only the rotary position of q can differ.
    assert rows_identical(max_seqlen_q=3)
    assert rows_identical(max_seqlen_q=3, window_size=(11, -1))  # wl >= capacity - 1: unbounded
    assert rows_identical(max_seqlen_q=3, window_size=(-1, 2))  # wr >= max_seqlen_q - 1: unbounded
    assert not rows_identical(max_seqlen_q=5, window_size=(-1, 2))  # wr < max_seqlen_q - 1: local
    assert not rows_identical(max_seqlen_q=3, window_size=(10, -1))  # local window
    assert not rows_identical(max_seqlen_q=3, attention_chunk=64)  # chunk counts as local


SDPA_CASES = {
    "causal_gqa": dict(causal=True, heads=6, heads_k=2),
    "window": dict(window=(3, 1), heads=4, heads_k=4),
    "causal_window_leftpad": dict(causal=True, window=(2, -1), leftpad=True),
    "mqa_paged": dict(causal=True, heads=4, heads_k=1, page_size=4),
}


@pytest.mark.parametrize("options", SDPA_CASES.values(), ids=SDPA_CASES.keys())
def test_against_sdpa(options):
    """Torch SDPA with an explicit bottom-right mask, where it applies (no empty rows)."""
    args = make_case(batch=2, seqlen_q=3, capacity=12, full_cache=True, seed=5, **options)
    out = flash_attn_with_kvcache(**clone_args(args))
    table = args.get("page_table")
    for i in range(2):
        k = (
            args["k_cache"][table[i].long()].flatten(0, 1)
            if table is not None
            else args["k_cache"][i]
        )
        v = (
            args["v_cache"][table[i].long()].flatten(0, 1)
            if table is not None
            else args["v_cache"][i]
        )
        start = int(args["cache_leftpad"][i]) if "cache_leftpad" in args else 0
        k, v = k[start:], v[start:]
        visible = dense.visible(3, k.shape[0], args["causal"], args["window_size"])
        if not visible.any(dim=1).all():
            continue
        scale = args["q"].shape[-1] ** -0.5
        expected = sdpa_attention(args["q"][i], k, v, scale, visible)
        torch.testing.assert_close(out[i], expected, rtol=1e-5, atol=1e-5)
        oracle, _ = dense.attention(
            args["q"][i, None], k[None], v[None], scale, args["causal"], args["window_size"]
        )
        torch.testing.assert_close(oracle[0], expected, rtol=1e-5, atol=1e-5)


def test_row_chunking_gives_identical_results(monkeypatch):
    args = make_case(
        seqlen_q=9,
        seqlen_new=4,
        capacity=20,
        causal=True,
        sinks=True,
        softcap=2.0,
        qv=True,
        dv=32,
        heads=6,
        heads_k=3,
        leftpad=True,
        seed=6,
    )
    full = flash_attn_with_kvcache(**clone_args(args), return_softmax_lse=True, num_splits=2)
    monkeypatch.setattr(attn_ref.attention, "MAX_SCORE_ELEMENTS", 50)  # a few rows per chunk
    chunked = flash_attn_with_kvcache(**clone_args(args), return_softmax_lse=True, num_splits=2)
    # Same math per row; only the BLAS blocking of the row-chunked einsums differs (fp32 rounding).
    for x, y in zip(full, chunked):
        torch.testing.assert_close(x, y, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("window, chunk", [((-1, -1), None), ((3, 1), None), ((-1, -1), 4)])
def test_row_tiles_and_key_blocks_give_the_same_results(monkeypatch, window, chunk):
    """Tiles of 2 rows and blocks of 3 keys (tiles that skip keys, blocks folded with ⊕, empty
    blocks of a tile) against one tile and one block: the same numbers up to fp32 rounding."""
    args = make_case(
        seqlen_q=9,
        seqlen_new=4,
        capacity=20,
        causal=True,
        window=window,
        chunk=chunk,
        sinks=True,
        softcap=2.0,
        heads=6,
        heads_k=3,
        leftpad=True,
        page_size=4,
        seed=8,
    )
    whole = flash_attn_with_kvcache(**clone_args(args), return_softmax_lse=True, num_splits=2)
    monkeypatch.setattr(attn_ref.attention, "ROWS_PER_TILE", 2)
    monkeypatch.setattr(attn_ref.attention, "KEYS_PER_BLOCK", 3)
    tiled = flash_attn_with_kvcache(**clone_args(args), return_softmax_lse=True, num_splits=2)
    for x, y in zip(whole, tiled):
        torch.testing.assert_close(x, y, rtol=2e-6, atol=2e-6)


def test_32k_context_decode_memory_bound():
    """b=1, one query, 32 query heads over 8 KV heads, d=128, 32k cached tokens, bf16."""
    gen = torch.Generator().manual_seed(7)
    n, h, h_k, d = 32768, 32, 8, 128
    q = torch.randn(1, 1, h, d, generator=gen).bfloat16()
    k_cache = torch.randn(1, n, h_k, d, generator=gen).bfloat16()
    v_cache = torch.randn(1, n, h_k, d, generator=gen).bfloat16()
    out, lse, *_ = flash_attn_with_kvcache(
        q, k_cache, v_cache, causal=True, return_softmax_lse=True
    )
    # Grouped fp32 check without expanding K/V to 32 heads: head j uses kv head j // 4.
    qg = q[0, 0].float().view(h_k, h // h_k, d)
    scores = torch.einsum("kgd,nkd->kgn", qg, k_cache[0].float()) * d**-0.5
    expected = torch.einsum("kgn,nkd->kgd", scores.softmax(-1), v_cache[0].float()).reshape(h, d)
    torch.testing.assert_close(
        out[0, 0].float(), expected, rtol=0, atol=torch.finfo(torch.bfloat16).eps
    )
    torch.testing.assert_close(lse[0, :, 0], scores.logsumexp(-1).reshape(h), rtol=1e-5, atol=1e-5)
