"""kernels.merge_attention_states / combine_attention_states against the reference's, and both
combines against the direct float64 formula (the errors both share: tests/test_merge_states.py)."""

import pytest
import torch

import attn_ref
import kernels
from kvcache_cases import DEVICE
from tolerance import assert_lse_close

INF = float("inf")


def states(n, shape, dim, dtype, seed=0):
    """``n`` random attention states ``(out (*shape, dim), lse (*shape))`` with some empty (-inf)
    and zero-length-KV (+inf) rows, including rows where every state is empty."""
    gen = torch.Generator().manual_seed(seed)
    outs = torch.randn(n, *shape, dim, generator=gen).to(dtype)
    lses = 4 * torch.randn(n, *shape, generator=gen)
    flat = lses.view(n, -1)
    flat[0, 0] = -INF  # one empty state in row 0
    flat[:, 1] = -INF  # row 1: all empty -> (0, -inf)
    flat[-1, 2] = INF  # +inf counts as -inf
    flat[:, 3] = INF  # all "zero-length KV" -> (0, -inf)
    return outs, lses


def combined_float64(outs, lses):
    """The fold of ``n`` states as one formula in float64, with ``+inf`` read as ``-inf``:
    ``lse = log Σ_s e^{lse_s}``, ``out = Σ_s e^{lse_s - lse} out_s`` (``(0, -inf)`` where every
    state is empty)."""
    lses = lses.double().where(lses != INF, -INF)
    lse = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - lse).nan_to_num(0.0)  # -inf - -inf: a row of empty states weighs 0
    return (weights[..., None] * outs.double()).sum(0), lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 3), (2, 4, 5)], ids=["tokens_heads", "batch_heads_rows"])
def test_merge_two_states(dtype, shape):
    outs, lses = states(2, shape, 40, dtype)
    out, lse = kernels.merge_attention_states(
        *(x.to(DEVICE) for x in (outs[0], lses[0], outs[1], lses[1]))
    )
    out_r, lse_r = attn_ref.merge_attention_states(outs[0], lses[0], outs[1], lses[1])
    assert (
        out.dtype == lse.dtype == torch.float32
        and out.shape == out_r.shape
        and lse.shape == lse_r.shape
    )
    torch.testing.assert_close(out.cpu(), out_r, rtol=1e-6, atol=1e-6)
    assert_lse_close(lse.cpu(), lse_r)
    assert torch.equal(out.cpu().flatten(0, -2)[1], torch.zeros(40))  # both empty: 0, not NaN


def test_merge_reads_strided_inputs():
    outs, lses = states(2, (6, 4), 32, torch.float32, seed=1)
    a = outs[0].transpose(0, 1)  # (4, 6, 32), non-contiguous rows
    b = outs[1].transpose(0, 1)
    out, lse = kernels.merge_attention_states(
        a.to(DEVICE), lses[0].T.to(DEVICE), b.to(DEVICE), lses[1].T.to(DEVICE)
    )
    out_r, lse_r = attn_ref.merge_attention_states(a, lses[0].T, b, lses[1].T)
    torch.testing.assert_close(out.cpu(), out_r, rtol=1e-6, atol=1e-6)
    assert_lse_close(lse.cpu(), lse_r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_combine_n_states_both_implementations_and_the_float64_formula(n, dtype):
    outs, lses = states(n, (5, 3), 24, dtype, seed=n)
    outs = outs.masked_fill(lses.isinf()[..., None], 0)  # a state over no key has out 0
    out_k, lse_k = kernels.combine_attention_states(outs.to(DEVICE), lses.to(DEVICE))
    out_r, lse_r = attn_ref.combine_attention_states(outs, lses)
    expected_out, expected_lse = combined_float64(outs, lses)
    for out, lse in ((out_k.cpu(), lse_k.cpu()), (out_r, lse_r)):
        assert out.dtype == lse.dtype == torch.float32
        assert out.shape == (5, 3, 24) and lse.shape == (5, 3)
        torch.testing.assert_close(out.double(), expected_out, rtol=1e-5, atol=1e-5)
        assert_lse_close(lse, expected_lse.float())
    torch.testing.assert_close(out_k.cpu(), out_r, rtol=1e-6, atol=1e-6)
    assert_lse_close(lse_k.cpu(), lse_r)


def test_reference_combine_returns_new_tensors():
    outs, lses = states(1, (5, 3), 24, torch.float32)
    out, lse = attn_ref.combine_attention_states(outs, lses)
    out.zero_(), lse.zero_()
    assert outs.abs().sum() > 0 and lses.isinf().any()  # one state: copies, not views of the input
