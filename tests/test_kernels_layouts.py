"""kernels.flash_attn_with_kvcache is a drop-in for attn_ref's: split partials equal to the
reference's, the split heuristic, and (on a GPU) int64 cache addressing. The signature, return
shapes, the ``out`` buffer, performance knobs, ``num_splits`` and the degenerate calls (no keys,
empty sequences, no query rows) are tested over both implementations in :mod:`test_kvcache_layouts`,
the errors in :mod:`test_kvcache_errors`."""

import pytest
import torch

import attn_ref
import kernels
from kernels.splits import attention_tiles, choose_num_splits
from kvcache_cases import ON_GPU, clone_args, make_case, run_kernels, split_cases
from tolerance import assert_lse_close


def run_both(args, **knobs):
    """(kernels result, reference result), both 4-tuples on the CPU, each on its own copy of
    args."""
    return (
        run_kernels(**clone_args(args), return_softmax_lse=True, **knobs),
        attn_ref.flash_attn_with_kvcache(**clone_args(args), return_softmax_lse=True, **knobs),
    )


SPLIT_CASES = split_cases(keys=60)


@pytest.mark.parametrize("case", SPLIT_CASES.values(), ids=SPLIT_CASES.keys())
def test_split_partials_are_the_references(case):
    # fp32 inputs: the kernels' partial states match the reference's split by split.
    args = make_case(dtype=torch.float32, leftpad=True, seed=3, **case)
    (out, lse, acc, lacc), (out_r, lse_r, acc_r, lacc_r) = run_both(args, num_splits=3)
    assert acc.shape == acc_r.shape and lacc.shape == lacc_r.shape
    torch.testing.assert_close(acc, acc_r, rtol=1e-5, atol=1e-5)
    assert_lse_close(lacc, lacc_r)
    torch.testing.assert_close(out, out_r, rtol=1e-5, atol=1e-5)
    assert_lse_close(lse, lse_r)


def test_heuristic_splits_long_single_sequence_and_returns_partials():
    args = make_case(
        batch=1, heads=2, heads_k=1, seqlen_q=1, capacity=512, d=32, full_cache=True, seed=4
    )
    tiles = attention_tiles(2, 1, 32, 32)
    sms = (
        torch.cuda.get_device_properties(0).multi_processor_count
        if ON_GPU
        else kernels.launch.INTERPRETER_SMS
    )
    expected = choose_num_splits(1, 512, tiles.block_n, sms)
    assert expected > 1
    (out, lse, acc, lacc), (out_r, lse_r, _, _) = run_both(args, num_splits=0)
    assert acc.shape[0] == lacc.shape[0] == expected
    torch.testing.assert_close(out, out_r, rtol=1e-5, atol=1e-5)
    assert_lse_close(lse, lse_r)


def test_heuristic_examples():
    # Module docstring of kernels.splits (H200: 132 SMs, BLOCK_N 64).
    assert choose_num_splits(programs=8, max_seqlen_k=65536, block_n=64, num_sms=132) == 33
    assert choose_num_splits(programs=128, max_seqlen_k=4096, block_n=64, num_sms=132) == 3
    assert choose_num_splits(programs=256, max_seqlen_k=4096, block_n=64, num_sms=132) == 1
    # too short
    assert choose_num_splits(programs=1, max_seqlen_k=100, block_n=64, num_sms=132) == 1
    # capped
    assert choose_num_splits(programs=1, max_seqlen_k=1 << 20, block_n=64, num_sms=132) == 256


@pytest.mark.skipif(
    not ON_GPU,
    reason="needs a CUDA device: the cache spans more than 2^31 elements "
    "(4.3 GB per cache), too big for the CPU interpreter",
)
def test_int64_offsets_large_paged_cache():
    # Pages beyond element offset 2^31: int32 offset arithmetic would wrap around.
    page_size, h_k, d = 16, 8, 128
    num_pages = (1 << 31) // (page_size * h_k * d) + 64
    k_cache = torch.zeros(num_pages, page_size, h_k, d, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    small = make_case(
        dtype=torch.bfloat16,
        batch=2,
        heads=32,
        heads_k=h_k,
        d=d,
        seqlen_q=1,
        seqlen_new=1,
        capacity=64,
        page_size=page_size,
        seed=12,
    )
    table = small["page_table"].long()
    last = num_pages - 1 - table  # the same pages, mirrored to the top of the pool
    k_cache[last.flatten()] = small["k_cache"][table.flatten()].cuda()
    v_cache[last.flatten()] = small["v_cache"][table.flatten()].cuda()
    big = dict(small, k_cache=k_cache, v_cache=v_cache, page_table=last.to(torch.int32))
    moved = {key: val.cuda() if isinstance(val, torch.Tensor) else val for key, val in big.items()}
    out = kernels.flash_attn_with_kvcache(**moved, num_splits=3)
    expected = kernels.flash_attn_with_kvcache(
        **{key: val.cuda() if isinstance(val, torch.Tensor) else val for key, val in small.items()},
        num_splits=3,
    )
    assert torch.equal(out, expected)
    assert torch.equal(k_cache[last.flatten()].cpu(), run_append_reference(small)[table.flatten()])


def run_append_reference(args):
    """The reference's k_cache after the call (the appended keys included)."""
    args = clone_args(args)
    attn_ref.flash_attn_with_kvcache(**args)
    return args["k_cache"]
