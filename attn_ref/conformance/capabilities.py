"""What a target may declare it does not support, and how it declares it.

A target declares capabilities it lacks with ``--unsupported fp8,qv`` (``unsupported=`` in Python),
or with a module attribute ``CONFORMANCE_UNSUPPORTED`` (an iterable of names) on the module that
defines it, or an attribute of the same name on the function itself; the three are united. Every
feature that needs a declared capability is reported "not supported" (never skipped silently), and
a ``NotImplementedError`` raised by a feature that needs none of them is a failure like any other.
(A prefill function the target does not export is not a capability: its features are reported
"not exported", :mod:`attn_ref.conformance.prefill`.)
"""

from __future__ import annotations

import inspect
from typing import Callable, Iterable

#: The names ``--unsupported`` and ``CONFORMANCE_UNSUPPORTED`` accept, and what each covers.
CAPABILITIES = {
    "paged": "page_table (paged KV caches)",
    "cache_batch_idx": "cache_batch_idx (cache rows picked per batch entry)",
    "leftpad": "cache_leftpad",
    "varlen_q": "cu_seqlens_q / max_seqlen_q (packed queries)",
    "varlen_new": "cu_seqlens_k_new (packed new keys and values)",
    "gqa": "fewer key/value heads than query heads (GQA, MQA)",
    "causal": "causal=True",
    "window": "window_size (sliding-window attention)",
    "chunk": "attention_chunk (chunked attention)",
    "softcap": "softcap > 0",
    "sinks": "sinks (per-head attention-sink logits)",
    "qv": "qv (the MLA extra query part)",
    "only_qv": "only_qv=True (scores from qv alone; q and k_cache may be None)",
    "rotary": "rotary_cos / rotary_sin (both layouts)",
    "rotary_seqlens": "rotary_seqlens",
    "num_splits": "num_splits > 1 and its partial outputs",
    "fp8": "float8_e4m3fn inputs with q/k/v_descale",
    "out": "out= (a preallocated output)",
    "ver": "ver (SGL-B rejects ver != 3 first)",
    "sglang_errors": "sglang's Python ValueErrors, their text and order",
    "backward": "gradients of flash_attn_func, flash_attn_varlen_func, flash_attn_qkvpacked_func",
    "chunk_backward": "gradients with attention_chunk (FA3's backward asserts it away)",
    "prefill_errors": "the reference's exception types and messages for invalid prefill calls",
}

ATTRIBUTE = "CONFORMANCE_UNSUPPORTED"


def check_names(kind: str, names: Iterable[str], known: Iterable[str]) -> None:
    """Raise ``ValueError`` naming every entry of ``names`` that is not in ``known``."""
    known = list(known)
    unknown = [name for name in names if name not in known]
    if unknown:
        listed, choices = ", ".join(map(repr, unknown)), ", ".join(known)
        raise ValueError(f"unknown {kind} {listed}; known: {choices}")


def declared_unsupported(fn: Callable, unsupported: Iterable[str] = ()) -> frozenset[str]:
    """``unsupported`` united with the ``CONFORMANCE_UNSUPPORTED`` of ``fn`` and of its module;
    every name must be one of :data:`CAPABILITIES`."""
    names = set(unsupported)
    module = inspect.getmodule(fn)
    for holder in (fn, module):
        names |= set(getattr(holder, ATTRIBUTE, ()) or ())
    check_names("capability", sorted(names), CAPABILITIES)
    return frozenset(names)
