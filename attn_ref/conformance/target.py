"""The implementation under test: ``module:function`` strings, and the ones this suite knows.

Any importable callable with sglang's ``flash_attn_with_kvcache`` signature (spec table 1.1) can be
a target; ``function`` may be a dotted path inside the module (``pkg.mod:Class.method``).
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

#: Targets worth knowing, and what to declare unsupported for each (``--unsupported``).
KNOWN_TARGETS = {
    "attn_ref:flash_attn_with_kvcache": ("this package's PyTorch reference", ""),
    "kernels:flash_attn_with_kvcache": (
        "this package's Triton kernels (on CPU under TRITON_INTERPRET=1)",
        "",
    ),
    "sgl_kernel.flash_attn:flash_attn_with_kvcache": ("sglang's FA3 wrapper (CUDA, sm90)", ""),
    "flash_attn_interface:flash_attn_with_kvcache": (
        "FlashAttention 3 (CUDA, sm90): no only_qv, sinks, out, ver, nor sglang's ValueErrors",
        "only_qv,sinks,out,ver,sglang_errors",
    ),
}


def load_target(target: str) -> Callable:
    """The callable ``target`` names (``"module:function"``)."""
    fn, reason = _resolve(target)
    if fn is None:
        raise ValueError(f"cannot load the conformance target {target!r}: {reason}")
    return fn


def target_name(fn: Callable) -> str:
    """``module:qualified.name`` of a callable (how a repro snippet imports it)."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _resolve(target: str) -> tuple[Optional[Callable], str]:
    module_name, colon, path = str(target).partition(":")
    if not colon or not module_name or not path:
        return None, "expected 'module:function', e.g. 'kernels:flash_attn_with_kvcache'"
    try:
        found = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while importing
        return None, f"importing {module_name!r} failed with {type(exc).__name__}: {exc}"
    for part in path.split("."):
        if not hasattr(found, part):
            return None, f"{module_name!r} has no attribute {path!r}"
        found = getattr(found, part)
    if not callable(found):
        return None, f"{path!r} is a {type(found).__name__}, not a function"
    return found, ""
