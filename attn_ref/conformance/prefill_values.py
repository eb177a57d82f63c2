"""The prefill section's value checks: out and LSE of a prefill function against the float64
oracle (:mod:`attn_ref.conformance.prefill_oracle`).

The output passes FlashAttention's rule as its ``test_flash_attn_output`` states it: its error at
most 2x (mean 1.5x) the error of the same computation in the input dtype, plus twice the dtype's
rounding noise at the output's magnitude (:func:`tolerance.rounding_atol`, since the problems are
small enough for the low-precision baseline to be nearly exact); the LSE (fp32) is within ``1e-5 +
1e-5 |lse|`` (:func:`tolerance.lse_error`). Varlen rows past ``seqused_q`` are not compared (FA3
leaves them unwritten).
"""

from __future__ import annotations

import torch

from .call import Outcome, call_kwargs, cpu_copy, raised
from .prefill_oracle import attend, combine, used_rows
from .target import takes_keyword
from .tolerance import fa_error, lse_error, rounding_atol
from .verdict import Verdict, failed, measured, worst


def lse_call(fn, args: dict, knobs: dict) -> Outcome:
    """``fn(**args, **knobs)`` asking for the LSE the way ``fn``'s signature offers it: sglang's
    ``return_softmax_lse=True`` (``(out, lse, *rest)``) when it takes that keyword, else FA3's
    ``return_attn_probs=True`` (``(out, lse)``)."""
    word = "return_softmax_lse" if takes_keyword(fn, "return_softmax_lse") else "return_attn_probs"
    return fn(**call_kwargs(args, {**knobs, word: True}, "flash_attn_varlen_func"))


def check_prefill_values(before: dict, after: dict, outcome: Outcome, function: str) -> Verdict:
    """``outcome`` ``(out, lse, ...)`` of a call of ``function`` (that returned its LSE) against the
    oracle of ``before``; ``after`` is unused here."""
    problem = raised(outcome) or _not_out_and_lse(outcome)
    if problem:
        return failed(problem)
    out, lse = cpu_copy(outcome[0]), cpu_copy(outcome[1])
    dtype = (before.get("q") if before.get("q") is not None else before["qkv"]).dtype
    if out.dtype != dtype:
        return failed(f"out has dtype {out.dtype}, expected {dtype} (the inputs')")
    ref_out, ref_lse = attend(function, before, upcast=True)
    low_out, _ = attend(function, before, upcast=False)
    rows = used_rows(function, before)
    if rows is not None and out.shape == ref_out.shape and lse.shape == ref_lse.shape:
        out, ref_out, low_out = out[rows[0]], ref_out[rows[0]], low_out[rows[0]]
        lse, ref_lse = lse[:, rows[0]], ref_lse[:, rows[0]]
    return _against(out, lse, ref_out, ref_lse.float(), low_out, dtype)


def check_combine(before: dict, after: dict, outcome: Outcome) -> Verdict:
    """``outcome`` ``(out, lse)`` of ``flash_attn_combine``: ``out (b, s, h, d)`` in ``out_dtype``
    (default fp32) and ``lse (b, s, h)`` fp32, against the float64 combination of the partials."""
    problem = raised(outcome) or _not_out_and_lse(outcome)
    if problem:
        return failed(problem)
    out, lse = cpu_copy(outcome[0]), cpu_copy(outcome[1])
    dtype = before.get("out_dtype") or torch.float32
    if out.dtype != dtype:
        return failed(f"out has dtype {out.dtype}, expected {dtype} (out_dtype)")
    ref_out, ref_lse = combine(before, upcast=True)
    low_out, _ = combine(before, upcast=False)
    return _against(out, lse, ref_out, ref_lse.float(), low_out, dtype)


def _not_out_and_lse(outcome: Outcome) -> str | None:
    if not isinstance(outcome, (tuple, list)) or len(outcome) < 2:
        return f"expected (out, softmax_lse, ...), got {type(outcome).__name__}"
    return None


def _against(out, lse, ref_out, ref_lse, low_out, dtype) -> Verdict:
    """FA's rule for ``out`` (``atol``: the rounding noise of ``dtype`` at ``ref_out``'s
    magnitude) and the LSE rule."""
    out_ratio, out_detail = fa_error(out, ref_out, low_out, atol=rounding_atol(ref_out.to(dtype)))
    lse_ratio, lse_detail = lse_error(lse, ref_lse)
    return worst(measured(out_ratio, f"out: {out_detail}"), measured(lse_ratio, lse_detail))
