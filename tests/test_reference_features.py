"""attn_ref.flash_attn_with_kvcache: the feature tests that run on the reference only.

The features both implementations share are tested once, over both, in :mod:`test_kvcache_features`;
here are sglang's own only_qv setup, the placeholder k_cache's default scale and a cache row read
twice.
"""

import torch

from attn_ref import flash_attn_with_kvcache
from dense_oracle import assert_matches_oracle
from kvcache_cases import make_case


def test_only_qv_placeholder_k_cache_default_scale():
    # q and k_cache None: scale = dv ** -0.5; the new k goes to sglang's discarded placeholder while
    # v lands in v_cache. Also pass k to check the placeholder takes k's head dim.
    case = make_case(
        only_qv=True, placeholders=True, heads=4, heads_k=2, d=32, dv=64, seqlen_new=2, seed=5
    )
    assert_matches_oracle(flash_attn_with_kvcache, case)
    scaled = assert_matches_oracle(flash_attn_with_kvcache, case, softmax_scale=64**-0.5)
    default = flash_attn_with_kvcache(**case, return_softmax_lse=True)
    assert torch.equal(default[0], scaled[0])


def test_only_qv_sglang_setup():
    """sglang's only_qv test: bf16, one query, one KV head, dv=512, page size 1, full cache,
    q=None and k_cache=None; fp32 softmax(qv V^T / sqrt(dv)) V, max error 8e-3, mean 3e-4."""
    gen = torch.Generator().manual_seed(14)
    b, sk, h, dv = 2, 129, 8, 512
    qv = torch.randn(b, 1, h, dv, generator=gen).bfloat16()
    v_cache = torch.randn(b * sk, 1, 1, dv, generator=gen).bfloat16()
    page_table = torch.arange(b * sk, dtype=torch.int32).view(b, sk)
    out = flash_attn_with_kvcache(
        None,
        None,
        v_cache,
        qv=qv,
        page_table=page_table,
        only_qv=True,
        num_splits=1,
        cache_seqlens=torch.full((b,), sk, dtype=torch.int32),
    )
    v = v_cache.float().view(b, sk, dv)
    p = (torch.einsum("bhd,bsd->bhs", qv[:, 0].float(), v) / dv**0.5).softmax(-1)
    expected = torch.einsum("bhs,bsd->bhd", p, v)[:, None].bfloat16()
    err = (out.float() - expected.float()).abs()
    assert err.max() <= 8e-3 and err.mean() <= 3e-4


def test_duplicate_cache_rows_without_append():
    case = make_case(batch=3, batch_idx=True, causal=True, seed=15)
    # reading one row twice is fine
    case["cache_batch_idx"] = torch.tensor([1, 1, 4], dtype=torch.int32)
    assert_matches_oracle(flash_attn_with_kvcache, case)
