"""attn_ref.flash_attn_with_kvcache against the independent dense oracle, feature by feature.

Every test builds a random valid call (:func:`kvcache_cases.make_case`) and checks output (FA rule),
LSE and the in-place cache update (:func:`dense_oracle.assert_matches_oracle`).
"""

import pytest
import torch

from attn_ref import flash_attn_with_kvcache
from dense_oracle import assert_matches_oracle
from kvcache_cases import make_case

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn]
DTYPE_IDS = ["fp16", "bf16", "fp32", "fp8"]
HEADS = [(4, 4), (6, 2), (4, 1)]  # MHA, GQA, MQA
HEAD_IDS = ["mha", "gqa", "mqa"]
MASKS = {
    "none": dict(),
    "causal": dict(causal=True),
    "window": dict(window=(2, 1)),
    "window_left_only": dict(window=(3, -1)),
    "causal_forces_right_0": dict(causal=True, window=(3, 5)),
    "chunk": dict(chunk=3),
    "causal_chunk": dict(causal=True, chunk=4),
    "window_chunk": dict(window=(1, 2), chunk=5),
}


def check(**case):
    return assert_matches_oracle(flash_attn_with_kvcache, make_case(**case))


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("heads", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dtypes_heads_masks(dtype, heads, mask):
    check(dtype=dtype, heads=heads[0], heads_k=heads[1], seqlen_q=4, seqlen_new=2, capacity=14,
          leftpad=True, descale=True, seed=7, **mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(dtype, causal):
    check(dtype=dtype, causal=causal, softcap=1.5, seqlen_new=1, descale=True, seed=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mask", ["none", "causal", "window", "chunk"])
def test_sinks(dtype, mask):
    check(dtype=dtype, sinks=True, heads=6, heads_k=2, seqlen_q=4, seqlen_new=2, softcap=3.0 if mask == "chunk" else 0.0,
          seed=2, **MASKS[mask])


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DTYPE_IDS[:3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", HEADS, ids=HEAD_IDS)
def test_qv(dtype, causal, heads):
    check(dtype=dtype, causal=causal, heads=heads[0], heads_k=heads[1], qv=True, d=16, dv=48, seqlen_new=2, seed=3)


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DTYPE_IDS[:3])
@pytest.mark.parametrize("placeholders", [False, True], ids=["q_given", "q_and_k_cache_none"])
@pytest.mark.parametrize("page_size", [None, 1])
def test_only_qv(dtype, placeholders, page_size):
    check(dtype=dtype, only_qv=True, placeholders=placeholders, heads=8, heads_k=1, d=16, dv=64,
          seqlen_q=1, seqlen_new=1, page_size=page_size, seed=4)


def test_only_qv_placeholder_k_cache_default_scale():
    # q and k_cache None: scale = dv ** -0.5; the new k goes to sglang's discarded placeholder while
    # v lands in v_cache. Also pass k to check the placeholder takes k's head dim.
    case = make_case(only_qv=True, placeholders=True, heads=4, heads_k=2, d=32, dv=64, seqlen_new=2, seed=5)
    assert_matches_oracle(flash_attn_with_kvcache, case)
    scaled = assert_matches_oracle(flash_attn_with_kvcache, case, softmax_scale=64 ** -0.5)
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
    out = flash_attn_with_kvcache(None, None, v_cache, qv=qv, page_table=page_table, only_qv=True, num_splits=1,
                                  cache_seqlens=torch.full((b,), sk, dtype=torch.int32))
    v = v_cache.float().view(b, sk, dv)
    p = (torch.einsum("bhd,bsd->bhs", qv[:, 0].float(), v) / dv ** 0.5).softmax(-1)
    expected = torch.einsum("bhs,bsd->bhd", p, v)[:, None].bfloat16()
    err = (out.float() - expected.float()).abs()
    assert err.max() <= 8e-3 and err.mean() <= 3e-4


def test_duplicate_cache_rows_without_append():
    case = make_case(batch=3, batch_idx=True, causal=True, seed=15)
    case["cache_batch_idx"] = torch.tensor([1, 1, 4], dtype=torch.int32)  # reading one row twice is fine
    assert_matches_oracle(flash_attn_with_kvcache, case)


@pytest.mark.parametrize("interleaved", [True, False], ids=["gptj", "neox"])
@pytest.mark.parametrize("rotary_dim", [16, 32], ids=["partial", "full"])
@pytest.mark.parametrize("mode", ["none", "causal", "window", "chunk"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_rotary(interleaved, rotary_dim, mode, dtype):
    check(dtype=dtype, d=32, rotary_dim=rotary_dim, rotary_interleaved=interleaved, seqlen_q=3,
          seqlen_new=3, capacity=16, leftpad=True, seed=6, **MASKS[mode])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_rotary_seqlens(causal, paged):
    check(d=32, rotary_dim=16, rotary_seqlens=True, causal=causal, seqlen_new=2, page_size=4 if paged else None, seed=8)


@pytest.mark.parametrize("page_size", [1, 3, 4, 16])
@pytest.mark.parametrize("batch_idx", [False, True])
@pytest.mark.parametrize("append", [False, True])
def test_paged(page_size, batch_idx, append):
    check(dtype=torch.bfloat16, page_size=page_size, batch_idx=batch_idx, seqlen_new=3 if append else None,
          capacity=20, batch=3, causal=True, leftpad=True, seed=9)


@pytest.mark.parametrize("varlen_q", [False, True])
@pytest.mark.parametrize("varlen_new", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(varlen_q, varlen_new, causal):
    check(dtype=torch.float16, batch=4, seqlen_q=5, seqlen_new=4, varlen_q=varlen_q, varlen_new=varlen_new,
          causal=causal, capacity=16, sinks=True, seed=10)


@pytest.mark.parametrize("page_size", [None, 2])
def test_cache_batch_idx_and_leftpad(page_size):
    check(batch=3, batch_idx=True, leftpad=True, seqlen_new=2, causal=True, page_size=page_size, seed=11)


def test_full_cache_without_cache_seqlens():
    check(full_cache=True, causal=True, seqlen_q=2, capacity=6, seed=12)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_everything_at_once(dtype):
    check(dtype=dtype, batch=3, seqlen_q=4, seqlen_new=3, varlen_q=True, varlen_new=True, page_size=3,
          batch_idx=True, leftpad=True, rotary_dim=16, d=32, rotary_interleaved=False, window=(5, 0),
          chunk=6, softcap=2.5, sinks=True, descale=True, capacity=24, heads=6, heads_k=3, seed=13)
