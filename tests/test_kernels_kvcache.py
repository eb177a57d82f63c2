"""kernels.flash_attn_with_kvcache: the feature tests that exist for the kernels only.

The features both implementations share are tested once, over both, in :mod:`test_kvcache_features`;
here are the cases aimed at the kernels' tiling: head layouts whose pack-GQA M tiles hold a row
count that is not a power of 2, the Taylor branch of their tanh under a huge softcap, and a chunked
prefill over many key blocks (the masked / unmasked block phases). Each checks against the dense
oracle with
:func:`dense_oracle.assert_matches_oracle`; with CUDA the shapes grow by
:data:`kvcache_cases.KERNELS`' scale.
"""

import pytest
import torch

import attn_ref
from dense_oracle import assert_matches_oracle
from kvcache_cases import KERNELS, clone_args, make_case, run_kernels

HEADS = [(4, 4), (6, 2), (5, 1)]  # MHA, GQA with G = 3, MQA with an odd head count
HEAD_IDS = ["mha", "gqa", "mqa"]
MASKS = {
    "none": dict(),
    "causal": dict(causal=True),
    "window_chunk": dict(window=(1, 2), chunk=5),
}


def check(num_splits=0, **case):
    return assert_matches_oracle(
        run_kernels, make_case(**KERNELS.sized(case)), num_splits=num_splits
    )


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("heads", HEADS, ids=HEAD_IDS)
def test_heads(heads, mask):
    # 24 rows x G heads: several pack-GQA M tiles, whose row count BLOCK_M // G is not a power of 2.
    check(
        dtype=torch.float16,
        heads=heads[0],
        heads_k=heads[1],
        seqlen_q=24,
        seqlen_new=2,
        capacity=60,
        leftpad=True,
        seed=17,
        **mask,
    )


@pytest.mark.parametrize("softcap", [1e3, 1e6, 1e10, 1e30])
def test_large_softcap_matches_the_reference(softcap):
    # A large cap makes tanh's argument tiny: 1 - 2 / (e^2x + 1) cancels there (softcap = 1e6 was
    # 0.03 off in fp32); the kernel's tanh switches to its Taylor series below |x| = 1/4.
    args = make_case(
        dtype=torch.float32, softcap=softcap, seqlen_q=3, seqlen_new=1, causal=True, seed=4
    )
    out = assert_matches_oracle(run_kernels, args, num_splits=1)[0]
    plain = attn_ref.flash_attn_with_kvcache(
        **clone_args(make_case(dtype=torch.float32, seqlen_q=3, seqlen_new=1, causal=True, seed=4))
    )
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)  # a cap this large changes nothing


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_chunked_prefill_many_key_blocks(dtype, causal):
    # Several M tiles and key blocks per program: exercises the masked / unmasked block phases.
    check(
        dtype=dtype,
        batch=2,
        heads=4,
        heads_k=2,
        d=32,
        seqlen_q=40,
        seqlen_new=40,
        capacity=160,
        causal=causal,
        window=(70, -1) if not causal else (-1, -1),
        leftpad=True,
        seed=14,
    )
