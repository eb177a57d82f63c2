"""The repro snippet of a failed probe: a standalone script that rebuilds the probe's seeded
arguments, makes the exact call the suite made, and judges it with the suite's own check.

Pasted into a file and run, it prints the verdict and ends with an ``AssertionError`` while the bug
is there (and exits quietly once it is fixed).
"""

from __future__ import annotations

from .call import call_kwargs
from .grid import Probe


def repro_snippet(probe: Probe, args: dict, target: str) -> str:
    """The script for ``probe`` of ``target`` (``module:function``); ``args`` are the arguments the
    probe built (which of them the call passes is decided as in :func:`call.call_kwargs`)."""
    module, _, path = target.partition(":")
    head, _, rest = path.partition(".")
    fn = f"{head}.{rest}" if rest else "fn"
    imported = f"from {module} import {head}" if rest else f"from {module} import {head} as fn"
    if probe.call is None:
        passed_args = [
            f"{name}=args[{name!r}]"
            if name in args and name not in probe.knobs
            else f"{name}={value!r}"
            for name, value in call_kwargs(args, probe.knobs, probe.function).items()
        ]
        call = f"{fn}({', '.join(passed_args)})"
        call_import = []
    else:  # the probe calls the target its own way (e.g. forward, then backward)
        call = f"{probe.call.__name__}({fn}, args, {probe.knobs!r})"
        call_import = [f"from {probe.call.__module__} import {probe.call.__name__}"]
    check_args = "".join(f", {key}={val!r}" for key, val in probe.check_args.items())
    lines = [
        f"# Repro: {probe.feature} [{probe.label}], attn_ref conformance suite, target {target}",
        "import torch",
        "",
        "from attn_ref.conformance.call import cpu_copy",
        f"from {probe.builder.__module__} import {probe.builder.__name__}",
        *call_import,
        f"from {probe.check.__module__} import {probe.check.__name__}",
        imported,
        "",
        f"args = {probe.builder.__name__}({_kwargs(probe.build)})",
        "before = cpu_copy(args)  # the oracle's copy, taken before the call",
        "try:",
        f"    outcome = {call}",
        "except Exception as exc:",
        "    outcome = exc",
        f"verdict = {probe.check.__name__}(before, args, outcome{check_args})",
        "print(verdict)",
        "assert verdict.passed, verdict.detail",
    ]
    return "\n".join(lines) + "\n"


def _kwargs(build: dict) -> str:
    """``key=value`` pairs; ``repr`` of a dtype (``torch.bfloat16``) is its importable name."""
    return ", ".join(f"{key}={val!r}" for key, val in build.items())
