"""kernels.flash_attn_with_kvcache against the dense oracle, feature by feature.

Each test builds a random valid call (:func:`kvcache_cases.make_case`), runs the Triton kernels and
checks the output with FlashAttention's rule, the LSE fp32-tight and the in-place cache update
(exact without rotary) with :func:`dense_oracle.assert_matches_oracle`.

Without CUDA the kernels run in Triton's interpreter on small shapes (seconds in all). With CUDA the
same tests run compiled on the GPU, with larger shapes (:data:`SCALE`); the oracle stays on the CPU.
"""

import pytest
import torch

import attn_ref
import kernels
from dense_oracle import assert_matches_oracle
from kvcache_cases import clone_args, make_case

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
#: Shape multiplier: cache capacity and query lengths grow on a GPU (bigger grids, more key blocks).
SCALE = 8 if ON_GPU else 1
HAS_FP8 = not ON_GPU or torch.cuda.get_device_capability() >= (8, 9)
FP8_SKIP = "fp8 e4m3 needs sm_89+ (this GPU has no fp8 conversion instructions)"

DTYPES = [torch.float16, torch.bfloat16, torch.float32,
          pytest.param(torch.float8_e4m3fn, marks=pytest.mark.skipif(not HAS_FP8, reason=FP8_SKIP))]
DTYPE_IDS = ["fp16", "bf16", "fp32", "fp8"]
HEADS = [(4, 4), (6, 2), (5, 1)]  # MHA, GQA with G = 3, MQA with an odd head count
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


def run_kernels(**args):
    """``kernels.flash_attn_with_kvcache`` on :data:`DEVICE`; caches written back into ``args``'
    tensors, results returned on the CPU (so the CPU oracle can check both)."""
    moved = {key: val.to(DEVICE) if isinstance(val, torch.Tensor) else val for key, val in args.items()}
    result = kernels.flash_attn_with_kvcache(**moved)
    for name in ("k_cache", "v_cache"):
        if isinstance(args.get(name), torch.Tensor) and moved[name] is not args[name]:
            args[name].copy_(moved[name].cpu())
    if isinstance(result, tuple):
        return tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in result)
    return result.cpu()


def check(num_splits=0, **case):
    for key in ("capacity", "seqlen_q"):
        if key in case:
            case[key] *= SCALE
    return assert_matches_oracle(run_kernels, make_case(**case), num_splits=num_splits)


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dtypes_masks(dtype, mask):
    check(dtype=dtype, heads=6, heads_k=2, seqlen_q=4, seqlen_new=2, capacity=14, leftpad=True,
          descale=True, seed=7, **mask)


@pytest.mark.parametrize("mask", ["none", "causal", "window_chunk"])
@pytest.mark.parametrize("heads", HEADS, ids=HEAD_IDS)
def test_heads(heads, mask):
    # 24 rows x G heads: several pack-GQA M tiles, whose row count BLOCK_M // G is not a power of 2.
    check(dtype=torch.float16, heads=heads[0], heads_k=heads[1], seqlen_q=24, seqlen_new=2, capacity=60,
          leftpad=True, seed=17, **MASKS[mask])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(dtype, causal):
    check(dtype=dtype, causal=causal, softcap=1.5, seqlen_new=1, descale=True, seed=1)


@pytest.mark.parametrize("softcap", [1e3, 1e6, 1e10, 1e30])
def test_large_softcap_matches_the_reference(softcap):
    # A large cap makes tanh's argument tiny: 1 - 2 / (e^2x + 1) cancels there (softcap = 1e6 was
    # 0.03 off in fp32); the kernel's tanh switches to its Taylor series below |x| = 1/4.
    args = make_case(dtype=torch.float32, softcap=softcap, seqlen_q=3, seqlen_new=1, causal=True, seed=4)
    out = assert_matches_oracle(run_kernels, args, num_splits=1)[0]
    plain = attn_ref.flash_attn_with_kvcache(**clone_args(make_case(dtype=torch.float32, seqlen_q=3, seqlen_new=1,
                                                                     causal=True, seed=4)))
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)  # a cap this large changes nothing


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mask", ["none", "causal", "chunk"])
def test_sinks(dtype, mask):
    check(dtype=dtype, sinks=True, heads=6, heads_k=2, seqlen_q=4, seqlen_new=2, capacity=40,
          softcap=3.0 if mask == "chunk" else 0.0, num_splits=3, seed=2, **MASKS[mask])


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DTYPE_IDS[:3])
@pytest.mark.parametrize("causal", [False, True])
def test_qv(dtype, causal):
    check(dtype=dtype, causal=causal, heads=6, heads_k=2, qv=True, d=16, dv=48, seqlen_new=2, seed=3)


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=DTYPE_IDS[:3])
@pytest.mark.parametrize("placeholders", [False, True], ids=["q_given", "q_and_k_cache_none"])
@pytest.mark.parametrize("page_size", [None, 1])
def test_only_qv(dtype, placeholders, page_size):
    check(dtype=dtype, only_qv=True, placeholders=placeholders, heads=8, heads_k=1, d=16, dv=64,
          seqlen_q=1, seqlen_new=1, page_size=page_size, seed=4)


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
    check(d=32, rotary_dim=16, rotary_seqlens=True, causal=causal, seqlen_new=2,
          page_size=4 if paged else None, seed=8)


@pytest.mark.parametrize("page_size", [1, 3, 16, 64])
@pytest.mark.parametrize("batch_idx", [False, True])
@pytest.mark.parametrize("append", [False, True])
def test_paged(page_size, batch_idx, append):
    check(dtype=torch.bfloat16, page_size=page_size, batch_idx=batch_idx, seqlen_new=3 if append else None,
          capacity=70, batch=3, causal=True, leftpad=True, seed=9)


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


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_chunked_prefill_many_key_blocks(dtype, causal):
    # Several M tiles and key blocks per program: exercises the masked / unmasked block phases.
    check(dtype=dtype, batch=2, heads=4, heads_k=2, d=32, seqlen_q=40, seqlen_new=40, capacity=160,
          causal=causal, window=(70, -1) if not causal else (-1, -1), leftpad=True, seed=14)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_everything_at_once(dtype):
    check(dtype=dtype, batch=3, seqlen_q=4, seqlen_new=3, varlen_q=True, varlen_new=True, page_size=3,
          batch_idx=True, leftpad=True, rotary_dim=16, d=32, rotary_interleaved=False, window=(5, 0),
          chunk=6, softcap=2.5, sinks=True, descale=True, capacity=24, heads=6, heads_k=3, num_splits=3,
          seed=13)
