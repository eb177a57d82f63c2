"""Tolerance rules of the tests and the conformance suite (FlashAttention's kvcache test's rule).

An implementation's output is compared with an fp32 oracle ``out_ref`` relative to how far the
*same*
oracle computed in the low dtype, ``out_lowp``, lands from ``out_ref``::

    max |out - out_ref|  <= mult      * max |out_lowp - out_ref|  + 1e-5
    mean|out - out_ref|  <= mult_mean * mean|out_lowp - out_ref|  + 1e-5

with ``mult, mult_mean = 2, 1.5`` (4, 3 for fp8 inputs; 3, 2.25 with softcap, FA's ``rtol = 3`` of
``hopper/test_flash_attn.py`` when ``softcap > 0``). The bound scales with the dtype's rounding
noise, so no fixed atol is needed. LSEs are fp32 everywhere and compared tightly
(``assert_lse_close``).

On tiny problems (a few keys, one row) the low-precision baseline can be almost exact while an
implementation that rounds its probabilities to the input dtype (as FA3 does for the ``P·V`` matmul)
is one rounding off; FA's ``test_flash_attn_output`` adds the dtype's rounding noise at the output's
magnitude for that, ``2 · max|(out_ref + 0.3 - 0.3) - out_ref|`` (:func:`rounding_atol`), which a
caller may pass as ``atol``.

Each rule is a ratio first (``*_error``: the measured error over the allowed one, with a sentence
that says what was measured; at most 1 passes), which the conformance report shows, and an
assertion on it (``assert_*``), which the tests use.
"""

from __future__ import annotations

import torch

EPS = 1e-5


def fa_error(
    out: torch.Tensor,
    out_ref: torch.Tensor,
    out_lowp: torch.Tensor,
    fp8: bool = False,
    atol: float = EPS,
    softcap: bool = False,
) -> tuple[float, str]:
    """FlashAttention's output rule (see the module docstring) as ``(ratio, what)``: the larger of
    ``max|err| / (mult * max|base| + atol)`` and ``mean|err| / (mult_mean * mean|base| + atol)``;
    ``fp8`` selects the fp8 multipliers, ``softcap`` those of a softcapped call, ``atol`` replaces
    the ``1e-5`` term. NaN gives ``inf``."""
    if out.shape != out_ref.shape:
        return float("inf"), f"shape {tuple(out.shape)}, expected {tuple(out_ref.shape)}"
    if out.isnan().any():
        return float("inf"), "output has NaN"
    if out.numel() == 0:
        return 0.0, "empty output"
    mult, mult_mean = (4.0, 3.0) if fp8 else (3.0, 2.25) if softcap else (2.0, 1.5)
    err = (out.float() - out_ref.float()).abs()
    base = (out_lowp.float() - out_ref.float()).abs()
    allowed_max, allowed_mean = (
        mult * base.max().item() + atol,
        mult_mean * base.mean().item() + atol,
    )
    ratio = max(err.max().item() / allowed_max, err.mean().item() / allowed_mean)
    return ratio, (
        f"max error {err.max():.3g} (allowed {mult} x low-precision error {base.max():.3g} + "
        f"{atol:.3g}), mean error {err.mean():.3g} (allowed {mult_mean} x {base.mean():.3g} + "
        f"{atol:.3g})"
    )


def assert_close_fa(
    out: torch.Tensor,
    out_ref: torch.Tensor,
    out_lowp: torch.Tensor,
    fp8: bool = False,
    atol: float = EPS,
    softcap: bool = False,
) -> None:
    """:func:`fa_error` is at most 1."""
    ratio, what = fa_error(out, out_ref, out_lowp, fp8, atol, softcap)
    assert ratio <= 1, what


def rounding_atol(out_ref: torch.Tensor) -> float:
    """FA's ``fwd_atol``: twice the rounding noise of ``out_ref``'s dtype at its values'
    magnitude."""
    if out_ref.numel() == 0:
        return EPS
    noisy = (out_ref + 0.3 - 0.3).float()
    return max(EPS, 2 * (noisy - out_ref.float()).abs().max().item())


def sum_rounding_atol(terms: torch.Tensor, dtype: torch.dtype) -> float:
    """For a sum whose terms each carry one rounding of ``dtype`` (a gradient summed over rows that
    may cancel, e.g. the sinks'): twice the worst error those roundings give, ``2 eps(dtype) max
    Σ|terms|`` with ``terms`` the sums of the terms' magnitudes."""
    if terms.numel() == 0:
        return EPS
    return max(EPS, 2 * torch.finfo(dtype).eps * terms.abs().max().item())


def lse_error(lse: torch.Tensor, lse_ref: torch.Tensor) -> tuple[float, str]:
    """fp32 LSEs as ``(ratio, what)``: same dtype, shape and +-inf entries (``inf`` otherwise),
    finite entries within fp32 summation noise, ``|lse - ref| <= 1e-5 + 1e-5 |ref|``."""
    if lse.dtype != torch.float32 or lse.shape != lse_ref.shape:
        return float(
            "inf"
        ), f"LSE {lse.dtype} {tuple(lse.shape)}, expected torch.float32 {tuple(lse_ref.shape)}"
    finite = lse_ref.isfinite()
    if not torch.equal(lse.isfinite(), finite) or not torch.equal(lse[~finite], lse_ref[~finite]):
        return float("inf"), "LSE has +-inf or NaN where the oracle does not (or not where it does)"
    if not finite.any():
        return 0.0, "LSE entries all +-inf, as expected"
    err = (lse - lse_ref).abs()[finite]
    ratio = (err / (EPS + EPS * lse_ref.abs()[finite])).max().item()
    return ratio, f"LSE max error {err.max():.3g} (allowed 1e-5 + 1e-5 |lse|)"


def assert_lse_close(lse: torch.Tensor, lse_ref: torch.Tensor) -> None:
    """:func:`lse_error` is at most 1."""
    ratio, what = lse_error(lse, lse_ref)
    assert ratio <= 1, what


def rounding_error(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, str]:
    """Tensors of a low dtype that may differ by one rounding of fp32 values (e.g. rotated keys
    computed with a different fp32 operation order), as ``(ratio, what)`` with the allowed
    difference ``eps(dtype) * |e| + 1e-6``."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return (
            float("inf"),
            f"{actual.dtype} {tuple(actual.shape)}, expected {expected.dtype} "
            f"{tuple(expected.shape)}",
        )
    if actual.numel() == 0:
        return 0.0, "empty"
    a, e = actual.float(), expected.float()
    diff = (a - e).abs()
    ratio = (
        (diff / (torch.finfo(actual.dtype).eps * e.abs() + 1e-6))
        .max()
        .nan_to_num(float("inf"))
        .item()
    )
    return ratio, f"max difference {diff.max():.3g} (allowed one rounding: eps x |value| + 1e-6)"


def assert_one_rounding_apart(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """:func:`rounding_error` is at most 1."""
    ratio, what = rounding_error(actual, expected)
    assert ratio <= 1, what
