"""Property-based tests (hypothesis): random shapes and option mixes against the dense oracle.

Examples are derandomised (the same ones every run, so CI is stable) and few enough to stay fast.
"""

import torch
from hypothesis import given, settings, strategies as st

from attn_ref import flash_attn_with_kvcache
from dense_oracle import assert_matches_oracle, logical_cache
from kvcache_cases import clone_args, make_case

FAST = settings(max_examples=100, deadline=None, derandomize=True)
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn]


@st.composite
def cases(draw):
    """Keyword arguments of make_case: any legal mix of features."""
    dtype = draw(st.sampled_from(DTYPES))
    d = draw(st.sampled_from([16, 32]))
    seqlen_new = draw(st.one_of(st.none(), st.integers(0, 4)))
    only_qv = dtype != torch.float8_e4m3fn and draw(st.booleans())
    qv = only_qv or (dtype != torch.float8_e4m3fn and draw(st.booleans()))
    rotary_dim = draw(st.sampled_from([0, 16, d])) if seqlen_new is not None else 0
    heads_k = draw(st.integers(1, 3))
    return dict(
        dtype=dtype,
        d=d,
        dv=draw(st.sampled_from([d, 32])),
        heads_k=heads_k,
        heads=heads_k * draw(st.integers(1, 3)),
        batch=draw(st.integers(1, 3)),
        seqlen_q=draw(st.integers(0, 5)),
        seqlen_new=seqlen_new,
        capacity=draw(st.integers(max(seqlen_new or 0, 1), 24)),
        page_size=draw(st.sampled_from([None, 1, 3, 4, 16])),
        leftpad=draw(st.booleans()),
        batch_idx=draw(st.booleans()),
        varlen_q=draw(st.booleans()),
        varlen_new=seqlen_new is not None and draw(st.booleans()),
        rotary_dim=rotary_dim,
        rotary_interleaved=draw(st.booleans()),
        rotary_seqlens=rotary_dim > 0 and draw(st.booleans()),
        causal=draw(st.booleans()),
        window=(draw(st.integers(-1, 6)), draw(st.integers(-1, 6))),
        chunk=draw(st.one_of(st.none(), st.integers(0, 6))),
        softcap=draw(st.sampled_from([0.0, 1.5])),
        sinks=draw(st.booleans()),
        qv=qv,
        only_qv=only_qv,
        placeholders=only_qv and draw(st.booleans()),
        descale=draw(st.booleans()),
        softmax_scale=draw(st.one_of(st.none(), st.floats(0.05, 1.0))),
        seed=draw(st.integers(0, 2**16)),
    )


@FAST
@given(case=cases(), num_splits=st.sampled_from([0, 1, 2, 3, 5]))
def test_matches_oracle(case, num_splits):
    assert_matches_oracle(flash_attn_with_kvcache, make_case(**case), num_splits=num_splits)


@FAST
@given(case=cases(), page_size=st.sampled_from([1, 2, 3, 5]))
def test_paged_equals_dense(case, page_size):
    paged = make_case(**dict(case, page_size=page_size))
    if paged.get("rotary_cos") is not None:  # the dense twin must pass the same validation
        paged["rotary_cos"], paged["rotary_sin"] = (
            torch.cat([t] * 2) for t in (paged["rotary_cos"], paged["rotary_sin"])
        )
    dense = {key: val for key, val in paged.items() if key != "page_table"}
    if paged["k_cache"] is not None:
        dense["k_cache"] = logical_cache(paged["k_cache"], paged["page_table"])
    dense["v_cache"] = logical_cache(paged["v_cache"], paged["page_table"])
    out_p, lse_p = flash_attn_with_kvcache(**clone_args(paged), return_softmax_lse=True)[:2]
    out_d, lse_d = flash_attn_with_kvcache(**clone_args(dense), return_softmax_lse=True)[:2]
    assert torch.equal(out_p, out_d) and torch.equal(lse_p, lse_d)
