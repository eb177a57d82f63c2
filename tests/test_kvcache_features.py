"""flash_attn_with_kvcache against the independent dense oracle, feature by feature, for every
implementation (``ref``: attn_ref, ``kernels``: the Triton kernels).

Every test builds a random valid call (:func:`kvcache_cases.make_case`, sized per implementation by
:meth:`kvcache_cases.Implementation.sized`) and checks output (FA rule), LSE (fp32-tight) and the
in-place cache update (exact without rotary) with :func:`dense_oracle.assert_matches_oracle`.
Without CUDA the kernels run in Triton's interpreter on the reference's shapes; with CUDA they run
compiled on larger ones (the oracle stays on the CPU). Where a feature's table differs per
implementation (the kernels' split count, a bigger cache for their key blocks) the test says so.
"""

import pytest
import torch

from dense_oracle import assert_matches_oracle
from kvcache_cases import KERNELS, REF, make_case, over

BOTH = [REF, KERNELS]
DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp8": torch.float8_e4m3fn,
}
NOT_FP8 = {name: DTYPES[name] for name in ("fp16", "bf16", "fp32")}
HEADS = {"mha": (4, 4), "gqa": (6, 2), "mqa": (4, 1)}
GQA = {"gqa": HEADS["gqa"]}  # the kernels' head layouts have their own test (test_kernels_kvcache)
BOOLS = {"False": False, "True": True}
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


def names(*keys: str) -> dict:
    """An axis whose ids are its values (for tests that look a mask up by name)."""
    return {key: key for key in keys}


def check(impl, num_splits=0, **case):
    return assert_matches_oracle(impl.fn, make_case(**impl.sized(case)), num_splits=num_splits)


@pytest.mark.parametrize(
    "impl, dtype, heads, mask",
    over([REF], DTYPES, HEADS, MASKS) + over([KERNELS], DTYPES, GQA, MASKS),
)
def test_dtypes_heads_masks(impl, dtype, heads, mask):
    check(
        impl,
        dtype=dtype,
        heads=heads[0],
        heads_k=heads[1],
        seqlen_q=4,
        seqlen_new=2,
        capacity=14,
        leftpad=True,
        descale=True,
        seed=7,
        **mask,
    )


@pytest.mark.parametrize("impl, causal, dtype", over(BOTH, BOOLS, DTYPES))
def test_softcap(impl, dtype, causal):
    check(impl, dtype=dtype, causal=causal, softcap=1.5, seqlen_new=1, descale=True, seed=1)


@pytest.mark.parametrize(
    "impl, mask, dtype",
    over([REF], names("none", "causal", "window", "chunk"), DTYPES)
    + over([KERNELS], names("none", "causal", "chunk"), DTYPES),
)
def test_sinks(impl, mask, dtype):
    # The kernels: three splits of a longer cache.
    splits = dict(capacity=40, num_splits=3) if impl is KERNELS else {}
    check(
        impl,
        dtype=dtype,
        sinks=True,
        heads=6,
        heads_k=2,
        seqlen_q=4,
        seqlen_new=2,
        softcap=3.0 if mask == "chunk" else 0.0,
        seed=2,
        **splits,
        **MASKS[mask],
    )


@pytest.mark.parametrize(
    "impl, heads, causal, dtype",
    over([REF], HEADS, BOOLS, NOT_FP8) + over([KERNELS], GQA, BOOLS, NOT_FP8),
)
def test_qv(impl, dtype, causal, heads):
    check(
        impl,
        dtype=dtype,
        causal=causal,
        heads=heads[0],
        heads_k=heads[1],
        qv=True,
        d=16,
        dv=48,
        seqlen_new=2,
        seed=3,
    )


@pytest.mark.parametrize(
    "impl, page_size, placeholders, dtype",
    over(BOTH, {"None": None, "1": 1}, {"q_given": False, "q_and_k_cache_none": True}, NOT_FP8),
)
def test_only_qv(impl, dtype, placeholders, page_size):
    check(
        impl,
        dtype=dtype,
        only_qv=True,
        placeholders=placeholders,
        heads=8,
        heads_k=1,
        d=16,
        dv=64,
        seqlen_q=1,
        seqlen_new=1,
        page_size=page_size,
        seed=4,
    )


@pytest.mark.parametrize(
    "impl, dtype, mode, rotary_dim, interleaved",
    over(
        BOTH,
        {"bf16": torch.bfloat16, "fp32": torch.float32},
        names("none", "causal", "window", "chunk"),
        {"partial": 16, "full": 32},
        {"gptj": True, "neox": False},
    ),
)
def test_rotary(impl, interleaved, rotary_dim, mode, dtype):
    check(
        impl,
        dtype=dtype,
        d=32,
        rotary_dim=rotary_dim,
        rotary_interleaved=interleaved,
        seqlen_q=3,
        seqlen_new=3,
        capacity=16,
        leftpad=True,
        seed=6,
        **MASKS[mode],
    )


@pytest.mark.parametrize("impl, paged, causal", over(BOTH, BOOLS, BOOLS))
def test_rotary_seqlens(impl, causal, paged):
    check(
        impl,
        d=32,
        rotary_dim=16,
        rotary_seqlens=True,
        causal=causal,
        seqlen_new=2,
        page_size=4 if paged else None,
        seed=8,
    )


@pytest.mark.parametrize(
    "impl, append, batch_idx, page_size",
    over([REF], BOOLS, BOOLS, {str(p): p for p in (1, 3, 4, 16)})
    + over([KERNELS], BOOLS, BOOLS, {str(p): p for p in (1, 3, 16, 64)}),
)
def test_paged(impl, page_size, batch_idx, append):
    # The kernels: a cache of 70 rows, so that pages of 64 span several key blocks.
    check(
        impl,
        dtype=torch.bfloat16,
        page_size=page_size,
        batch_idx=batch_idx,
        seqlen_new=3 if append else None,
        capacity=70 if impl is KERNELS else 20,
        batch=3,
        causal=True,
        leftpad=True,
        seed=9,
    )


@pytest.mark.parametrize("impl, causal, varlen_new, varlen_q", over(BOTH, BOOLS, BOOLS, BOOLS))
def test_varlen(impl, varlen_q, varlen_new, causal):
    check(
        impl,
        dtype=torch.float16,
        batch=4,
        seqlen_q=5,
        seqlen_new=4,
        varlen_q=varlen_q,
        varlen_new=varlen_new,
        causal=causal,
        capacity=16,
        sinks=True,
        seed=10,
    )


@pytest.mark.parametrize("impl, page_size", over(BOTH, {"None": None, "2": 2}))
def test_cache_batch_idx_and_leftpad(impl, page_size):
    check(
        impl,
        batch=3,
        batch_idx=True,
        leftpad=True,
        seqlen_new=2,
        causal=True,
        page_size=page_size,
        seed=11,
    )


@pytest.mark.parametrize("impl", BOTH, ids=lambda impl: impl.name)
def test_full_cache_without_cache_seqlens(impl):
    check(impl, full_cache=True, causal=True, seqlen_q=2, capacity=6, seed=12)


@pytest.mark.parametrize("impl, dtype", over(BOTH, DTYPES))
def test_everything_at_once(impl, dtype):
    check(
        impl,
        dtype=dtype,
        batch=3,
        seqlen_q=4,
        seqlen_new=3,
        varlen_q=True,
        varlen_new=True,
        page_size=3,
        batch_idx=True,
        leftpad=True,
        rotary_dim=16,
        d=32,
        rotary_interleaved=False,
        window=(5, 0),
        chunk=6,
        softcap=2.5,
        sinks=True,
        descale=True,
        capacity=24,
        heads=6,
        heads_k=3,
        num_splits=3 if impl is KERNELS else 0,
        seed=13,
    )
