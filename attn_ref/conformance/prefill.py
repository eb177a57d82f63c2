"""The prefill section: FA3's ``flash_attn_func``, ``flash_attn_varlen_func`` (with sglang's
keyword-only ``sinks`` and ``return_softmax_lse``), ``flash_attn_qkvpacked_func`` and
``flash_attn_combine``, for targets that export them beside their ``flash_attn_with_kvcache``.

Every feature calls one of the functions (:attr:`grid.Feature.function`); a target that does not
export it (:func:`target.resolve_target`), or whose function does not take a keyword the feature
passes (``sinks``), gets the feature reported "not exported", so a target with only
``flash_attn_with_kvcache`` still runs, and its report says that the section is not applicable.

Three kinds of features, all in the family ``prefill``:

* values (``prefill/func``, ``prefill/varlen_seqused``...): out and LSE against the float64 oracle
  (:mod:`prefill_values`), on small random calls (:mod:`prefill_cases`): masks, softcap, GQA,
  packed sequences with a zero-length one, ``seqused``, sinks, both ``qkv`` layouts, the combine;
* gradients (``prefill/*_grads*``, capability ``backward``): dq, dk, dv, dqkv and dsinks against
  float64 autograd of the dense formula (:mod:`gradients`);
* errors (``prefill/*_errors``, ``prefill/*_messages``): invalid calls refused before computing,
  and with the reference's messages (:mod:`prefill_errors`).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .gradients import check_gradients, gradient_call
from .grid import Feature, Probe, Size
from .prefill_cases import combine_case, func_case, qkvpacked_case, varlen_case
from .prefill_errors import cases_of, check_message, check_refused, invalid_call
from .prefill_values import check_combine, check_prefill_values, lse_call

FUNC, VARLEN, PACKED, COMBINE = (
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_combine",
)
LSE = {"return_attn_probs": True}
#: The shapes the sizes scale (:func:`_scaled`), per function (the builders' other defaults stay).
SHAPES = {
    FUNC: dict(seqlen_q=4, seqlen_k=6),
    VARLEN: dict(seqlen_q=4, seqlen_k=6),
    PACKED: dict(seqlen=5),
    COMBINE: dict(seqlen=3),
}


def _scaled(case: dict, scale: int) -> dict:
    """A size's shapes: ``seqlen_k`` times ``scale``, ``seqlen_q`` and ``seqlen`` (above 1) times
    its square root."""
    grown = dict(case)
    if "seqlen_k" in case:
        grown["seqlen_k"] = case["seqlen_k"] * scale
    for key in ("seqlen_q", "seqlen"):
        if case.get(key, 1) > 1:
            grown[key] = case[key] * math.isqrt(scale)
    return grown


def _label(variant: dict) -> str:
    return ", ".join(f"{key}={val}" for key, val in variant.items() if key != "grad") or "base"


def prefill_feature(
    name: str,
    summary: str,
    needs: tuple[str, ...],
    function: str,
    builder: Callable[..., dict],
    variants: list[dict],
    check: Callable,
    knobs: Optional[dict] = None,
    call: Optional[Callable] = None,
    keywords: tuple[str, ...] = (),
) -> Feature:
    """A feature whose probes call ``function`` with ``builder(**SHAPES[function], dtype=...,
    **variant, seed=..., device=...)`` (shapes scaled by the size), ``knobs`` and ``call``, judged
    by ``check`` (told the function's name, except the combine's)."""
    check_args = {} if function == COMBINE else dict(function=function)

    def probes(size: Size, dtype: torch.dtype, seed: int, device: str) -> list[Probe]:
        chosen = variants if size.variants is None else variants[: size.variants]
        found = []
        for variant in chosen:
            case = _scaled({**SHAPES[function], "dtype": dtype, **variant}, size.scale)
            for offset in range(size.seeds):
                build = dict(case, seed=seed + offset, device=device)
                found.append(
                    Probe(
                        name,
                        _label(variant),
                        builder,
                        build,
                        check,
                        dict(knobs or {}),
                        dict(check_args),
                        call,
                        function,
                    )
                )
        return found

    return Feature(name, summary, needs, probes, function, keywords)


def values(
    name: str,
    summary: str,
    needs: tuple[str, ...],
    function: str,
    builder: Callable[..., dict],
    variants: list[dict],
    **how,
) -> Feature:
    """A values feature: the call returns its LSE (FA3's ``return_attn_probs``, or for varlen
    whichever of FA3's and sglang's keywords the function takes)."""
    if function == VARLEN:
        how = dict(how, call=lse_call)
    elif function != COMBINE:
        how = dict(how, knobs=LSE)
    check = check_combine if function == COMBINE else check_prefill_values
    return prefill_feature(name, summary, needs, function, builder, variants, check, **how)


def grads(
    name: str,
    summary: str,
    needs: tuple[str, ...],
    function: str,
    builder: Callable[..., dict],
    variants: list[dict],
    **how,
) -> Feature:
    """A gradients feature (needs ``backward``): forward, then autograd with a random ``dout``."""
    variants = [dict(variant, grad=True) for variant in variants]
    return prefill_feature(
        name,
        summary,
        ("backward", *needs),
        function,
        builder,
        variants,
        check_gradients,
        call=gradient_call,
        **how,
    )


def errors(
    name: str, summary: str, needs: tuple[str, ...], function: str, check: Callable
) -> Feature:
    """An errors feature: every invalid call of ``function``, at every size."""

    def probes(size: Size, dtype: torch.dtype, seed: int, device: str) -> list[Probe]:
        found = []
        for case in cases_of(function):
            check_args = dict(case=case)
            if check is check_message:
                check_args["dtype"] = dtype
            build = dict(case=case, dtype=dtype, device=device)
            found.append(
                Probe(
                    name,
                    case,
                    invalid_call,
                    build,
                    check,
                    check_args=check_args,
                    function=function,
                )
            )
        return found

    return Feature(name, summary, needs, probes, function)


PREFILL_VALUES = [
    values(
        "prefill/func",
        "flash_attn_func: out and LSE, default and explicit softmax_scale",
        (),
        FUNC,
        func_case,
        [{}, dict(softmax_scale=0.7), dict(seqlen_q=6, d=32)],
    ),
    values(
        "prefill/func_causal",
        "causal, aligned to the bottom-right corner",
        ("causal",),
        FUNC,
        func_case,
        [dict(causal=True), dict(causal=True, seqlen_q=1)],
    ),
    values(
        "prefill/func_window",
        "sliding windows (left, right), -1 unbounded",
        ("window",),
        FUNC,
        func_case,
        [dict(window=(2, 1)), dict(window=(3, -1)), dict(window=(-1, 0))],
    ),
    values(
        "prefill/func_chunk",
        "attention_chunk: keys of the row's own chunk only",
        ("chunk",),
        FUNC,
        func_case,
        [dict(chunk=3), dict(chunk=4, seqlen_k=9)],
    ),
    values(
        "prefill/func_softcap",
        "softcap * tanh(scores * scale / softcap)",
        ("softcap",),
        FUNC,
        func_case,
        [dict(softcap=1.5), dict(softcap=0.5, softmax_scale=2.0)],
    ),
    values(
        "prefill/func_gqa",
        "GQA and MQA: query head j reads key/value head j // (h / h_k)",
        ("gqa",),
        FUNC,
        func_case,
        [dict(heads=4, heads_k=2), dict(heads=3, heads_k=1)],
    ),
    values(
        "prefill/varlen",
        "flash_attn_varlen_func: packed sequences (cu_seqlens), zero-length ones among them",
        (),
        VARLEN,
        varlen_case,
        [dict(zero_length=True), dict(batch=3, seqlen_q=6, seqlen_k=6)],
    ),
    values(
        "prefill/varlen_causal",
        "causal per sequence, aligned to each one's bottom-right corner",
        ("causal",),
        VARLEN,
        varlen_case,
        [dict(causal=True, zero_length=True), dict(causal=True, seqlen_q=6, seqlen_k=9)],
    ),
    values(
        "prefill/varlen_seqused",
        "seqused_q / seqused_k: only the first rows and keys of each sequence",
        (),
        VARLEN,
        varlen_case,
        [dict(seqused=True), dict(seqused=True, zero_length=True)],
    ),
    values(
        "prefill/varlen_sinks",
        "sglang's sinks= (keyword-only): a sink logit per query head",
        ("sinks",),
        VARLEN,
        varlen_case,
        [dict(sinks=True), dict(sinks=True, seqused=True, zero_length=True)],
        keywords=("sinks",),
    ),
    values(
        "prefill/qkvpacked",
        "flash_attn_qkvpacked_func: qkv (b, s, 3, h, d)",
        (),
        PACKED,
        qkvpacked_case,
        [{}, dict(seqlen=8, d=32)],
    ),
    values(
        "prefill/qkvpacked_gqa",
        "the 4-D qkv (b, s, h + 2 h_k, d) with num_heads_q",
        ("gqa",),
        PACKED,
        qkvpacked_case,
        [dict(heads=4, heads_k=2), dict(heads=3, heads_k=1)],
    ),
    values(
        "prefill/combine",
        "flash_attn_combine: fp32 split-KV partials, some splits empty (LSE -inf)",
        (),
        COMBINE,
        combine_case,
        [{}, dict(cast_out=True), dict(splits=1)],
    ),
]

PREFILL_GRADS = [
    grads(
        "prefill/func_grads",
        "flash_attn_func: dq, dk, dv",
        (),
        FUNC,
        func_case,
        [{}, dict(softmax_scale=0.7, seqlen_q=6)],
    ),
    grads(
        "prefill/func_grads_masks",
        "dq, dk, dv with causal and sliding-window masks",
        ("causal", "window"),
        FUNC,
        func_case,
        [dict(causal=True), dict(window=(2, 1)), dict(causal=True, window=(3, -1))],
    ),
    grads(
        "prefill/func_grads_softcap",
        "dq, dk, dv through the softcap's tanh",
        ("softcap",),
        FUNC,
        func_case,
        [dict(softcap=1.5)],
    ),
    grads(
        "prefill/func_grads_gqa",
        "dk, dv summed over each key/value head's query heads",
        ("gqa",),
        FUNC,
        func_case,
        [dict(heads=4, heads_k=2), dict(heads=3, heads_k=1, seqlen_q=6)],
    ),
    grads(
        "prefill/func_grads_chunk",
        "dq, dk, dv with attention_chunk",
        ("chunk", "chunk_backward"),
        FUNC,
        func_case,
        [dict(chunk=3)],
    ),
    grads(
        "prefill/varlen_grads",
        "flash_attn_varlen_func: dq, dk, dv of packed sequences, seqused",
        (),
        VARLEN,
        varlen_case,
        [dict(zero_length=True), dict(seqused=True)],
    ),
    grads(
        "prefill/varlen_grads_causal",
        "dq, dk, dv with causal per sequence",
        ("causal",),
        VARLEN,
        varlen_case,
        [dict(causal=True, zero_length=True)],
    ),
    grads(
        "prefill/varlen_grads_sinks",
        "dq, dk, dv and dsinks with sglang's sinks=",
        ("sinks",),
        VARLEN,
        varlen_case,
        [dict(sinks=True), dict(sinks=True, seqused=True, zero_length=True)],
        keywords=("sinks",),
    ),
    grads(
        "prefill/qkvpacked_grads",
        "flash_attn_qkvpacked_func: dqkv (b, s, 3, h, d)",
        (),
        PACKED,
        qkvpacked_case,
        [{}],
    ),
    grads(
        "prefill/qkvpacked_grads_gqa",
        "dqkv of the 4-D qkv with num_heads_q",
        ("gqa",),
        PACKED,
        qkvpacked_case,
        [dict(heads=4, heads_k=2)],
    ),
]

PREFILL_ERRORS = [
    errors(
        f"prefill/{short}_{kind}",
        f"{function}: {what}",
        needs,
        function,
        check,
    )
    for short, function in (
        ("func", FUNC),
        ("varlen", VARLEN),
        ("qkvpacked", PACKED),
        ("combine", COMBINE),
    )
    for kind, what, needs, check in (
        ("errors", "invalid calls upstream refuses raise, inputs untouched", (), check_refused),
        (
            "messages",
            "the reference's exception types and messages for them",
            ("prefill_errors",),
            check_message,
        ),
    )
]

PREFILL = [*PREFILL_VALUES, *PREFILL_GRADS, *PREFILL_ERRORS]
