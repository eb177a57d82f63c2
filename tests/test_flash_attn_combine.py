"""``flash_attn_combine`` (FA3's combine of split-KV partial states) of both implementations:
the result against a float64 log-sum-exp written here, FA3's return layout and dtypes, and the
same errors from both (shared checks, :func:`attn_ref.flash_attn.check_combine_args`)."""

import pytest
import torch

import attn_ref
import kernels

IMPLEMENTATIONS = {"attn_ref": attn_ref.flash_attn_combine, "kernels": kernels.flash_attn_combine}


def partials(n, b=2, s=3, h=4, d=8, seed=0):
    """``out_partial (n, b, s, h, d)`` and ``lse_partial (n, b, s, h)``, fp32; in split 0 the row
    (0, 0, 0) is empty (``-inf``), and the row (1, 2, 3) is empty in every split."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(n, b, s, h, d, generator=g)
    lse = 3 * torch.randn(n, b, s, h, generator=g)
    lse[0, 0, 0, 0] = float("-inf")
    out[0, 0, 0, 0] = 0
    lse[:, 1, 2, 3] = float("-inf")
    out[:, 1, 2, 3] = 0
    return out, lse


def expected(out_partial, lse_partial):
    """float64: ``lse = log Σ_s e^{lse_s}``, ``out = Σ_s e^{lse_s - lse} o_s`` (0 for a row with
    no state)."""
    lses = lse_partial.double()
    lse = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - lse.masked_fill(torch.isinf(lse), 0))
    return (weights[..., None] * out_partial.double()).sum(0), lse


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("n", [1, 2, 5])
def test_the_combine_is_the_log_sum_exp(impl, n):
    out_partial, lse_partial = partials(n)
    out, lse = IMPLEMENTATIONS[impl](out_partial, lse_partial)
    want_out, want_lse = expected(out_partial, lse_partial)
    assert out.dtype == lse.dtype == torch.float32
    assert out.shape == (2, 3, 4, 8) and lse.shape == (2, 3, 4)
    assert lse.transpose(1, 2).is_contiguous()  # a (b, s, h) view of (b, h, s) memory, as FA3
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    assert lse[1, 2, 3] == float("-inf") and not out[1, 2, 3].any()
    assert torch.isfinite(lse[0, 0, 0]) or n == 1


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_out_dtype_and_out(impl, out_dtype):
    out_partial, lse_partial = partials(2)
    want_out, _ = expected(out_partial, lse_partial)
    out, _ = IMPLEMENTATIONS[impl](out_partial, lse_partial, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    torch.testing.assert_close(out, want_out.to(out_dtype))
    buffer = torch.empty(2, 3, 4, 8, dtype=out_dtype)
    written, _ = IMPLEMENTATIONS[impl](out_partial, lse_partial, out=buffer, out_dtype=out_dtype)
    assert written is buffer
    torch.testing.assert_close(buffer, out)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_the_implementations_agree(impl):
    out_partial, lse_partial = partials(5, seed=1)
    want = attn_ref.flash_attn_combine(out_partial, lse_partial)
    torch.testing.assert_close(IMPLEMENTATIONS[impl](out_partial, lse_partial), want)


BAD = {
    "not_tensor": (
        lambda o, l: (o.tolist(), l),
        TypeError,
        "out_partial must be a torch.Tensor, got list",
    ),
    "not_5d": (
        lambda o, l: (o[0], l[0]),
        ValueError,
        "out_partial must have shape (num_splits, batch_size, seqlen, num_heads, head_size_og)",
    ),
    "lse_layout": (
        lambda o, l: (o, l.transpose(2, 3)),
        ValueError,
        "lse_partial must have shape (num_splits, batch_size, seqlen, num_heads)",
    ),
    "no_splits": (
        lambda o, l: (o[:0], l[:0]),
        ValueError,
        "out_partials must be (n, ..., dim) with n >= 1 states, got shape (0, 2, 3, 4, 8)",
    ),
    "out_dtype": (
        lambda o, l: (o, l, None, torch.int32),
        ValueError,
        "Output type must be FP32, FP16 or BF16",
    ),
    "out_wrong_dtype": (
        lambda o, l: (o, l, torch.empty(2, 3, 4, 8, dtype=torch.float16)),
        ValueError,
        "out must have dtype torch.float32, got torch.float16",
    ),
    "out_strided": (
        lambda o, l: (o, l, torch.empty(2, 3, 8, 4).transpose(2, 3)),
        ValueError,
        "Output tensor must have contiguous last dimension",
    ),
    "out_shape": (
        lambda o, l: (o, l, torch.empty(2, 3, 4, 7)),
        ValueError,
        "out must have shape (batch_size, seqlen, num_heads, head_size_og)",
    ),
}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", BAD)
def test_errors(impl, case):
    make, error, message = BAD[case]
    args = make(*partials(2))
    with pytest.raises(error) as raised:
        IMPLEMENTATIONS[impl](*args)
    assert str(raised.value) == message
