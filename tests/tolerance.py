"""Tolerance rules of the test suite (FlashAttention's, spec section 4.5).

An implementation's output is compared with an fp32 oracle ``out_ref`` relative to how far the *same*
oracle computed in the low dtype, ``out_lowp``, lands from ``out_ref``::

    max |out - out_ref|  <= mult      * max |out_lowp - out_ref|  + 1e-5
    mean|out - out_ref|  <= mult_mean * mean|out_lowp - out_ref|  + 1e-5

with ``mult, mult_mean = 2, 1.5`` (4, 3 for fp8 inputs). The bound scales with the dtype's rounding
noise, so no fixed atol is needed. LSEs are fp32 everywhere and compared tightly (``assert_lse_close``).

On tiny problems (a few keys, one row) the low-precision baseline can be almost exact while an
implementation that rounds its probabilities to the input dtype (as FA3 does for the ``P·V`` matmul)
is one rounding off; FA's ``test_flash_attn_output`` adds the dtype's rounding noise at the output's
magnitude for that, ``2 · max|(out_ref + 0.3 - 0.3) - out_ref|`` (:func:`rounding_atol`), which a
caller may pass as ``atol``.
"""

from __future__ import annotations

import torch

EPS = 1e-5


def assert_close_fa(
    out: torch.Tensor, out_ref: torch.Tensor, out_lowp: torch.Tensor, fp8: bool = False, atol: float = EPS
) -> None:
    """FlashAttention's output rule (see the module docstring); ``fp8`` selects the fp8 multipliers,
    ``atol`` replaces the ``1e-5`` term."""
    assert out.shape == out_ref.shape == out_lowp.shape, (out.shape, out_ref.shape, out_lowp.shape)
    assert not out.isnan().any(), "output has NaN"
    if out.numel() == 0:
        return
    mult, mult_mean = (4.0, 3.0) if fp8 else (2.0, 1.5)
    err = (out.float() - out_ref.float()).abs()
    base = (out_lowp.float() - out_ref.float()).abs()
    assert err.max() <= mult * base.max() + atol, (
        f"max error {err.max():.3g} > {mult} x low-precision error {base.max():.3g} + {atol:.3g}"
    )
    assert err.mean() <= mult_mean * base.mean() + atol, (
        f"mean error {err.mean():.3g} > {mult_mean} x low-precision error {base.mean():.3g} + {atol:.3g}"
    )


def rounding_atol(out_ref: torch.Tensor) -> float:
    """FA's ``fwd_atol``: twice the rounding noise of ``out_ref``'s dtype at its values' magnitude."""
    if out_ref.numel() == 0:
        return EPS
    noisy = (out_ref + 0.3 - 0.3).float()
    return max(EPS, 2 * (noisy - out_ref.float()).abs().max().item())


def assert_lse_close(lse: torch.Tensor, lse_ref: torch.Tensor) -> None:
    """fp32 LSEs: same shape, same +-inf entries, finite entries within fp32 summation noise."""
    assert lse.dtype == torch.float32, lse.dtype
    torch.testing.assert_close(lse, lse_ref, rtol=1e-5, atol=1e-5)


def assert_one_rounding_apart(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Tensors of a low dtype that may differ by one rounding of fp32 values (e.g. rotated keys
    computed with a different fp32 operation order): ``|a - e| <= eps(dtype) * |e| + 1e-6``."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = actual.float(), expected.float()
    bound = torch.finfo(actual.dtype).eps * e.abs() + 1e-6
    assert ((a - e).abs() <= bound).all(), f"max difference {(a - e).abs().max():.3g}"
