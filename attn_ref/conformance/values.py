"""The ``values`` check: the output and the LSE of a call against the float64 oracle.

The output passes FlashAttention's rule (its error at most 2x, mean 1.5x, the error of the same
computation in the input dtype, plus 1e-5; 4x / 3x for fp8; :func:`tolerance.fa_error`); the LSE
(fp32) is within ``1e-5 + 1e-5 |lse|`` and has the oracle's infinities
(:func:`tolerance.lse_error`). Split-KV partials, when the call returns them, must combine (``lse =
logsumexp_s lse_s``, ``out = Σ_s exp(lse_s - lse) out_s``:
:func:`attn_ref.merge.merge_attention_states`) to an output and an LSE that pass the same rules.
"""

from __future__ import annotations

import inspect

import torch

from .call import Outcome, cpu_copy, raised
from .oracle import FP8, kvcache_oracle
from .tolerance import fa_error, lse_error
from .verdict import Verdict, failed, measured, worst

ORACLE_PARAMETERS = set(inspect.signature(kvcache_oracle).parameters) - {"upcast"}


def check_values(before: dict, after: dict, outcome: Outcome) -> Verdict:
    """``outcome`` of ``target(**args, return_softmax_lse=True)`` against the oracle of ``before``
    (the CPU copy of the arguments taken before the call); ``after`` is unused here."""
    problem = raised(outcome) or _not_out_and_lse(outcome)
    if problem:
        return failed(problem)
    out, lse = cpu_copy(outcome[0]), cpu_copy(outcome[1])
    return _against_oracle(before, out, lse, "")


def check_values_and_partials(before: dict, after: dict, outcome: Outcome) -> Verdict:
    """:func:`check_values`, and the returned partials (``out_accum (n, b, h, sq, dv)`` or
    ``(n, h, total_q, dv)``, ``lse_accum (n, b, h, sq)`` or ``(n, h, total_q)``), when there are
    any, combined and checked the same way."""
    verdict = check_values(before, after, outcome)
    if not verdict.passed or len(outcome) < 4 or outcome[2] is None or outcome[2].numel() == 0:
        return verdict
    acc, lacc = cpu_copy(outcome[2]).float(), cpu_copy(outcome[3]).float()
    lse = torch.logsumexp(lacc, dim=0)  # (b, h, sq) or (h, total_q)
    weights = torch.exp(lacc - lse).nan_to_num(0.0, posinf=0.0)  # rows with no key anywhere: 0
    out = (weights[..., None] * acc).sum(0)  # (b, h, sq, dv) or (h, total_q, dv)
    out = out.transpose(0, 1) if out.dim() == 3 else out.transpose(1, 2)
    return worst(
        verdict, _against_oracle(before, out.to(outcome[0].dtype), lse, "combined partials: ")
    )


def _not_out_and_lse(outcome: Outcome) -> str | None:
    if not isinstance(outcome, (tuple, list)) or len(outcome) < 2:
        return (
            "return_softmax_lse=True must return (out, softmax_lse, ...), "
            f"got {type(outcome).__name__}"
        )
    return None


def oracle_args(args: dict) -> dict:
    """The entries of ``args`` that are arguments of :func:`oracle.kvcache_oracle` (not ``out``)."""
    return {key: val for key, val in args.items() if key in ORACLE_PARAMETERS}


def _against_oracle(before: dict, out: torch.Tensor, lse: torch.Tensor, what: str) -> Verdict:
    ref = kvcache_oracle(**oracle_args(before))
    lowp = kvcache_oracle(**oracle_args(before), upcast=False)
    if out.dtype != ref.out.dtype:
        return failed(f"{what}out has dtype {out.dtype}, expected {ref.out.dtype}")
    fp8 = (before["qv"] if before.get("only_qv") else before["q"]).dtype == FP8
    out_ratio, out_detail = fa_error(out, ref.out, lowp.out, fp8=fp8)
    lse_ratio, lse_detail = lse_error(lse, ref.lse)
    return worst(
        measured(out_ratio, f"{what}out: {out_detail}"), measured(lse_ratio, f"{what}{lse_detail}")
    )
