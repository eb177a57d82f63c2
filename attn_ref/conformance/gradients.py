"""The prefill section's gradient checks: the backward of a prefill function against float64
autograd of the dense formula (:func:`prefill_oracle.gradients`).

:func:`gradient_call` makes the call with fresh leaves of the differentiable inputs (``q``, ``k``,
``v``; ``qkv``; ``sinks``), then asks autograd for the gradients of ``Σ out · dout`` (the LSE is
not used: FA3's backward drops its gradient). A target whose output does not require grad, or
whose backward raises, is reported so, not crashed on. :func:`check_gradients` holds each gradient
to FlashAttention's rule for gradients (``test_flash_attn_output``): its error at most 2x (mean
1.5x) that of the low-precision baseline's gradient, plus twice the rounding noise of the inputs'
dtype (q's) at the gradient's magnitude; it must have its input's dtype and shape. For the fp32
``dsinks``, a sum over rows that may cancel, whose terms a backward computes from the output
rounded to that dtype (as FA's does), the allowance is twice the worst error of those roundings
(:func:`tolerance.sum_rounding_atol` of :func:`prefill_oracle.sink_terms`).
Varlen rows past ``seqused_q`` and keys past ``seqused_k`` are not compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .call import Outcome, cpu_copy, raised
from .prefill_oracle import LEAVES, gradients, sink_terms, used_rows
from .tolerance import fa_error, rounding_atol, sum_rounding_atol
from .verdict import Verdict, failed, measured, worst


@dataclass
class Gradients:
    """What :func:`gradient_call` got: the gradients by input name, or the ``problem`` (a sentence)
    that kept it from getting them."""

    grads: dict[str, Optional[torch.Tensor]] = field(default_factory=dict)
    problem: Optional[str] = None


def gradient_call(fn, args: dict, knobs: dict) -> Gradients:
    """``out = fn(**args, **knobs)`` with ``dout`` left out and the inputs of
    :data:`prefill_oracle.LEAVES` replaced by fresh leaves, then ``torch.autograd.grad(out, leaves,
    dout)``. An exception of the forward propagates (the suite records it)."""
    leaves = {
        name: args[name].detach().clone().requires_grad_()
        for name in ("q", "k", "v", "qkv", "sinks")
        if isinstance(args.get(name), torch.Tensor)
    }
    call = {key: val for key, val in args.items() if key != "dout"}
    result = fn(**{**call, **leaves, **knobs})
    out = result[0] if isinstance(result, (tuple, list)) else result
    if not isinstance(out, torch.Tensor):
        return Gradients(problem=f"the call returned {type(result).__name__}, not an output tensor")
    if not out.requires_grad:
        return Gradients(
            problem="the output does not require grad: the target computes no gradient (declare "
            "the capability backward unsupported if it is forward only)"
        )
    try:
        grads = torch.autograd.grad(out, list(leaves.values()), args["dout"], allow_unused=True)
    except Exception as exc:  # the check reports it
        return Gradients(problem=f"the backward raised {type(exc).__name__}: {exc}")
    return Gradients(dict(zip(leaves, grads)))


def check_gradients(before: dict, after: dict, outcome: Outcome, function: str) -> Verdict:
    """The gradients in ``outcome`` (a :class:`Gradients`) against float64 autograd of the dense
    formula on ``before``; ``after`` is unused here."""
    problem = raised(outcome)
    if problem:
        return failed(f"the forward {problem}")
    if outcome.problem:
        return failed(outcome.problem)
    reference = gradients(function, before, upcast=True)
    baseline = gradients(function, before, upcast=False)
    rows = used_rows(function, before)
    dtype = before["qkv" if "qkv" in before else "q"].dtype  # the computation's
    verdicts = []
    for name in LEAVES[function]:
        if name not in reference:
            continue
        grad = outcome.grads.get(name)
        if grad is None:
            return failed(f"no gradient reached {name}")
        grad = cpu_copy(grad)
        if grad.dtype != before[name].dtype or grad.shape != before[name].shape:
            return failed(
                f"d{name} is {grad.dtype} {tuple(grad.shape)}, expected {before[name].dtype} "
                f"{tuple(before[name].shape)} (its input's)"
            )
        ref, low = reference[name], baseline[name]
        if rows is not None and name != "sinks":  # only the rows and keys that take part
            used = rows[0] if name == "q" else rows[1]
            grad, ref, low = grad[used], ref[used], low[used]
        if name == "sinks":
            atol = sum_rounding_atol(sink_terms(before), dtype)
        else:
            atol = rounding_atol(ref.to(dtype))
        ratio, detail = fa_error(grad, ref, low, atol=atol)
        verdicts.append(measured(ratio, f"d{name}: {detail}"))
    return worst(*verdicts)
