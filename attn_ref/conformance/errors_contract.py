"""The ``errors`` checks: upstream's ValueErrors for upstream's conditions in upstream's order, and
bad calls refused without a trace in the caches.

The cases are the tables of :mod:`attn_ref.conformance.error_cases`. :func:`check_error` wants the
table's exception type (a subclass counts; sglang's two stride checks are ``assert``\\ s, so an
``AssertionError`` with their text counts too) and its exact message; :func:`check_rejected` wants
any exception, for calls upstream's C++ checks refuse with messages of their own. Both want the
caches exactly as they were.
"""

from __future__ import annotations

import torch

from .call import Outcome, cpu_copy
from .error_cases import PACKAGE_CHECKS, UPSTREAM_ORDER, base, message_matches
from .verdict import Verdict, failed, passed

TABLES = {"UPSTREAM_ORDER": UPSTREAM_ORDER, "PACKAGE_CHECKS": PACKAGE_CHECKS}
#: sglang asserts these (AssertionError); this package raises them as ValueError with the same text.
ASSERTED = (
    "v_cache must have contiguous last dimension",
    "k_cache must have contiguous last dimension",
)


def error_case(table: str, case: str, device: str = "cpu") -> dict:
    """The arguments of case ``case`` of ``table`` (``"UPSTREAM_ORDER"`` or ``"PACKAGE_CHECKS"``),
    with its tensors on ``device``."""
    change = TABLES[table][case][0]
    with torch.device(device):
        return change(base())


def check_error(before: dict, after: dict, outcome: Outcome, table: str, case: str) -> Verdict:
    """``outcome`` is the table's exception with the table's message, and the caches are
    untouched."""
    _, error, message = TABLES[table][case]
    wanted = f"{error.__name__}: {message if isinstance(message, str) else message.pattern}"
    if not isinstance(outcome, BaseException):
        return failed(f"returned normally; expected {wanted}")
    types = (error, AssertionError) if message in ASSERTED else (error,)
    if not isinstance(outcome, types) or not message_matches(str(outcome), message):
        return failed(f"raised {type(outcome).__name__}: {outcome}; expected {wanted}")
    return _caches_untouched(before, after) or passed(f"raised {wanted}")


def check_rejected(before: dict, after: dict, outcome: Outcome, case: str) -> Verdict:
    """``outcome`` is an exception (any), and the caches are untouched."""
    if not isinstance(outcome, BaseException):
        return failed(f"accepted a call upstream refuses ({case})")
    return _caches_untouched(before, after) or passed(f"raised {type(outcome).__name__}")


def _caches_untouched(before: dict, after: dict) -> Verdict | None:
    for name in ("k_cache", "v_cache"):
        old, new = before.get(name), after.get(name)
        if isinstance(old, torch.Tensor) and not torch.equal(cpu_copy(new), old):
            return failed(f"raised as expected, but {name} was modified by the failed call")
    return None
