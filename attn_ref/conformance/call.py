"""How the suite calls a target: the keyword arguments it passes, and what it keeps of the outcome.

Arguments equal to the API's defaults are left out of the call (an implementation of an older or
narrower signature, such as FlashAttention 3's without ``only_qv``, ``sinks`` or ``out``, is
called only with what the probe uses), and the repro snippet writes out exactly the same call. The
API is ``flash_attn_with_kvcache``'s, or for a probe of the prefill section the function's it
calls (``function``).
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional, Union

import torch

from .. import flash_attn
from ..kvcache import flash_attn_with_kvcache
from .target import PREFILL_FUNCTIONS


def _defaults(fn: Callable) -> dict:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()}


#: sglang's parameters and defaults (spec table 1.1), read off the reference's signature.
DEFAULTS = _defaults(flash_attn_with_kvcache)
#: The parameters and defaults of each prefill function (FA3's, and sglang's keywords), likewise.
PREFILL_DEFAULTS = {name: _defaults(getattr(flash_attn, name)) for name in PREFILL_FUNCTIONS}

Outcome = Union[BaseException, torch.Tensor, tuple]


def call_kwargs(args: dict, knobs: dict, function: Optional[str] = None) -> dict:
    """``args`` and ``knobs`` without the entries that equal the API's defaults (tensors are
    kept): ``flash_attn_with_kvcache``'s, or the prefill function ``function``'s."""
    defaults = DEFAULTS if function is None else PREFILL_DEFAULTS[function]

    def is_default(name, value):
        default = defaults.get(name, inspect.Parameter.empty)
        return (
            default is not inspect.Parameter.empty
            and not isinstance(value, torch.Tensor)
            and type(value) is type(default)
            and value == default
        )

    merged = {**args, **knobs}
    return {name: value for name, value in merged.items() if not is_default(name, value)}


def call_target(
    fn: Callable,
    args: dict,
    knobs: dict,
    call: Optional[Callable] = None,
    function: Optional[str] = None,
) -> Outcome:
    """``fn(**call_kwargs(args, knobs, function))`` (or ``call(fn, args, knobs)``, for a probe
    that calls the target its own way), or the exception it raised (any ``Exception``)."""
    try:
        if call is not None:
            return call(fn, args, knobs)
        return fn(**call_kwargs(args, knobs, function))
    except Exception as exc:  # the checks judge it
        return exc


def cpu_copy(value):
    """A detached CPU copy of a tensor, or of the tensors in a dict, list or tuple (others as they
    are)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: cpu_copy(val) for key, val in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(val) for val in value)
    return value


def raised(outcome: Outcome) -> str | None:
    """``"Type: message"`` when ``outcome`` is an exception, else None (a NotImplementedError says
    that the feature may be declared unsupported)."""
    if not isinstance(outcome, BaseException):
        return None
    text = f"raised {type(outcome).__name__}: {outcome}"
    if isinstance(outcome, NotImplementedError):
        text += " (declare the capability unsupported if the target does not implement it)"
    return text
