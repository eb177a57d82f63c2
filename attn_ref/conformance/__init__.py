"""A conformance suite for any ``flash_attn_with_kvcache`` with sglang's signature, and for FA3's
prefill functions beside it.

``python -m attn_ref.conformance TARGET`` (``module:function``) or :func:`run_conformance` checks,
feature by feature, the values (out and LSE against the float64 oracle, FlashAttention's tolerance
rule), the in-place cache update, the error contract and odd shapes, and reports pass / fail / not
supported per feature with a repro snippet per failure. Its prefill section
(:mod:`attn_ref.conformance.prefill`) checks the values, gradients and errors of the
``flash_attn_func``, ``flash_attn_varlen_func``, ``flash_attn_qkvpacked_func`` and
``flash_attn_combine`` that the target's module exports (the others: "not exported").
:mod:`attn_ref.conformance.pytest` runs it inside a pytest session. See ``docs/conformance.md``.

The package also holds what the project's tests share with it: the case factory (:mod:`.calls`),
the dense float64 oracle (:mod:`.oracle`), the tolerance rules (:mod:`.tolerance`) and the tables of
the error contract (:mod:`.error_cases`).
"""

from .capabilities import CAPABILITIES
from .features import FEATURES
from .grid import SIZES
from .report import Report
from .runner import run_conformance
from .target import KNOWN_TARGETS, load_target

__all__ = [
    "CAPABILITIES",
    "FEATURES",
    "KNOWN_TARGETS",
    "Report",
    "SIZES",
    "load_target",
    "run_conformance",
]
