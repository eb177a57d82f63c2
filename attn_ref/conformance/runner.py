"""Running the suite: each selected feature's probes against the target, into a :class:`Report`."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Optional, Union

import torch

from .call import call_target, cpu_copy
from .capabilities import declared_unsupported
from .features import FEATURES
from .grid import Feature, Probe, Size, select as select_features
from .report import FAIL, NOT_EXPORTED, NOT_SUPPORTED, PASS, Failure, FeatureResult, Report
from .repro import repro_snippet
from .target import Target, resolve_target
from .verdict import Verdict, failed


def run_conformance(
    target: Union[str, Callable],
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    select: Union[str, list[str]] = "quick",
    seed: int = 0,
    unsupported: Iterable[str] = (),
    features: Optional[list[Feature]] = None,
    progress: Optional[Callable[[FeatureResult], None]] = None,
) -> Report:
    """Run the conformance suite against ``target`` (a ``module:function`` string or the function).

    ``select``: ``quick`` / ``default`` / ``full``, or feature and family names (see
    :func:`grid.select`); ``unsupported``: capabilities the target declares it lacks, united with
    its ``CONFORMANCE_UNSUPPORTED``; ``progress`` is called with each feature's result as it is
    done. The prefill features call the functions found beside the target
    (:func:`target.resolve_target`); those it does not export are reported "not exported".
    """
    found, declared, size, chosen = plan(target, select, unsupported, features)
    results = []
    for feature in chosen:
        result = run_feature(found, feature, size, dtype, seed, str(device), declared)
        results.append(result)
        if progress is not None:
            progress(result)
    return Report(
        found.name,
        str(device),
        str(dtype).removeprefix("torch."),
        size.name,
        seed,
        sorted(declared),
        results,
        [found.import_name(export) for export in found.exports],
    )


def plan(
    target: Union[str, Callable],
    select: Union[str, list[str]],
    unsupported: Iterable[str],
    features: Optional[list[Feature]] = None,
) -> tuple[Target, frozenset, Size, list[Feature]]:
    """The target (with the prefill functions beside it), its declared-unsupported capabilities,
    the size and the features of a run (every name checked before anything runs)."""
    found = resolve_target(target)
    declared = declared_unsupported(found.fn, unsupported)
    size, chosen = select_features(FEATURES if features is None else features, select)
    return found, declared, size, chosen


def run_feature(
    target: Target,
    feature: Feature,
    size: Size,
    dtype: torch.dtype,
    seed: int,
    device: str,
    declared: frozenset,
) -> FeatureResult:
    """One feature: "not exported" if it calls a function (or keyword) the target does not export,
    "not supported" if it needs a declared capability, else all its probes."""
    absent = target.missing(feature.function, feature.keywords)
    if absent:
        return FeatureResult(feature.name, feature.summary, NOT_EXPORTED, not_exported=absent)
    missing = sorted(set(feature.needs) & declared)
    if missing:
        return FeatureResult(feature.name, feature.summary, NOT_SUPPORTED, unsupported=missing)
    fn, name = target.function(feature.function), target.import_name(feature.function)
    start = time.perf_counter()
    result = FeatureResult(feature.name, feature.summary, PASS)
    for probe in feature.probes(size, dtype, seed, device):
        args, verdict = run_probe(fn, probe)
        result.probes += 1
        if verdict.ratio is not None:
            result.worst_ratio = max(result.worst_ratio or 0.0, verdict.ratio)
        if not verdict.passed:
            result.status = FAIL
            result.failures.append(
                Failure(probe.label, verdict.detail, repro_snippet(probe, args, name))
            )
    result.seconds = time.perf_counter() - start
    return result


def run_probe(fn: Callable, probe: Probe) -> tuple[dict, Verdict]:
    """Build the probe's arguments, call ``fn``, judge the outcome (a check that cannot read the
    outcome, e.g. a result of the wrong structure, is a failure too)."""
    args = probe.builder(**probe.build)
    before = cpu_copy(args)
    outcome = call_target(fn, args, probe.knobs, probe.call, probe.function)
    try:
        return args, probe.check(before, args, outcome, **probe.check_args)
    except Exception as exc:  # the result is malformed in a way the check did not foresee
        return args, failed(
            f"the outcome could not be checked ({type(exc).__name__}: {exc}); outcome: "
            f"{outcome!r:.200}"
        )
