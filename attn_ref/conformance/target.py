"""The implementation under test: ``module:function`` strings, and the ones this suite knows.

Any importable callable with sglang's ``flash_attn_with_kvcache`` signature (spec table 1.1) can be
a target; ``function`` may be a dotted path inside the module (``pkg.mod:Class.method``).

The prefill section (:mod:`attn_ref.conformance.prefill`) tests the FA3 functions that sit beside
the target (:data:`PREFILL_FUNCTIONS`): they are looked up in the target's module (the one the
string names, or for a function the one that defines it), else in the nearest package above it that
exports any of them (``attn_ref.kvcache`` -> ``attn_ref``). :func:`resolve_target` finds them.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

#: FA3's prefill and training entry points and its split-KV combine, in the order the prefill
#: section tests them; a target may export any of them.
PREFILL_FUNCTIONS = (
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_combine",
)

#: Targets worth knowing, and what to declare unsupported for each (``--unsupported``).
KNOWN_TARGETS = {
    "attn_ref:flash_attn_with_kvcache": ("this package's PyTorch reference", ""),
    "kernels:flash_attn_with_kvcache": (
        "this package's Triton kernels (on CPU under TRITON_INTERPRET=1)",
        "",
    ),
    "sgl_kernel.flash_attn:flash_attn_with_kvcache": (
        "sglang's FA3 wrapper (CUDA, sm90); its flash_attn_varlen_func is forward only",
        "backward,prefill_errors",
    ),
    "flash_attn_interface:flash_attn_with_kvcache": (
        "FlashAttention 3 (CUDA, sm90): no only_qv, sinks, out, ver, nor sglang's ValueErrors; "
        "no backward with attention_chunk; its own error messages",
        "only_qv,sinks,out,ver,sglang_errors,chunk_backward,prefill_errors",
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


@dataclass(frozen=True)
class Target:
    """A loaded target: its ``flash_attn_with_kvcache`` (``fn``, named ``name``) and the prefill
    functions found beside it: ``exports`` maps each of :data:`PREFILL_FUNCTIONS` that ``home`` (a
    module name) exports to the function."""

    fn: Callable
    name: str
    home: str
    exports: dict[str, Callable] = field(default_factory=dict)

    def function(self, export: Optional[str]) -> Optional[Callable]:
        """The function a feature calls: the target itself (``export`` None) or an export (None
        when it is not exported)."""
        return self.fn if export is None else self.exports.get(export)

    def import_name(self, export: Optional[str]) -> str:
        """``module:function`` of what :meth:`function` returns (how a repro snippet imports it)."""
        return self.name if export is None else f"{self.home}:{export}"

    def missing(self, export: Optional[str], keywords: tuple[str, ...] = ()) -> list[str]:
        """What a feature needs and the target does not export: ``[export]`` when the function is
        absent, ``["export(keyword=)", ...]`` for keywords its signature does not take, else
        ``[]``."""
        if export is None:
            return []
        fn = self.exports.get(export)
        if fn is None:
            return [export]
        return [f"{export}({word}=)" for word in keywords if not takes_keyword(fn, word)]


def resolve_target(target: Union[str, Callable]) -> Target:
    """The :class:`Target` of a ``module:function`` string (loaded by :func:`load_target`) or of a
    function, with the prefill functions beside it."""
    fn = load_target(target) if isinstance(target, str) else target
    name = target if isinstance(target, str) else target_name(fn)
    start = target.partition(":")[0] if isinstance(target, str) else getattr(fn, "__module__", "")
    home, exports = _prefill_exports(start or "")
    return Target(fn, name, home, exports)


def takes_keyword(fn: Callable, word: str) -> bool:
    """Whether ``fn`` accepts the keyword argument ``word`` (True when its signature cannot be read,
    or has ``**kwargs``)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or extension function without a signature
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    parameter = parameters.get(word)
    return parameter is not None and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY


def _prefill_exports(module_name: str) -> tuple[str, dict[str, Callable]]:
    """``(home, exports)``: the first of ``module_name`` and the packages above it (imported
    already, as their submodule is) that exports any of :data:`PREFILL_FUNCTIONS`, and those it
    exports; ``(module_name, {})`` when none does."""
    parts = module_name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        module = sys.modules.get(candidate)
        found = {
            name: getattr(module, name)
            for name in PREFILL_FUNCTIONS
            if callable(getattr(module, name, None))
        }
        if found:
            return candidate, found
    return module_name, {}
