"""The shape of the suite: features, their probes, the sizes, and what ``--select`` picks.

A *feature* is one thing an implementation can get wrong on its own (``values/leftpad``,
``in_place/append``, ``errors/sglang_order``...), in one of five families: ``values`` (out and LSE
against the float64 oracle), ``in_place`` (what the call writes), ``errors`` (what it refuses, and
how), ``odd_shapes``, and ``prefill``, the section of FA3's prefill functions that the target may
export beside it (:mod:`attn_ref.conformance.prefill`). A feature needs *capabilities* (``paged``,
``fp8``...): the names a target may declare unsupported
(:mod:`attn_ref.conformance.capabilities`).

A *probe* is one call of the target and its verdict: the builder of its arguments and the builder's
keyword arguments (written out again in a failure's repro snippet), the extra keyword arguments of
the call, and the check that judges the outcome. A feature lists its probe variants in order; a
size (``quick``, ``default``, ``full``) takes the first or all of them at a scale of the shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from .capabilities import check_names

FAMILIES = ("values", "in_place", "errors", "odd_shapes", "prefill")


@dataclass(frozen=True)
class Size:
    """``variants``: how many of a feature's variants run (None = all); ``scale`` multiplies the
    cache capacity of value-like probes (``seqlen_q`` by its square root); ``seeds``: each variant
    runs once per seed, counted from the suite's ``--seed``."""

    name: str
    variants: int | None
    scale: int
    seeds: int


SIZES = {
    "quick": Size("quick", variants=1, scale=1, seeds=1),
    "default": Size("default", variants=None, scale=4, seeds=1),
    "full": Size("full", variants=None, scale=16, seeds=2),
}


@dataclass(frozen=True)
class Probe:
    """One call: ``args = builder(**build)``, ``outcome = target(**args, **knobs)`` (or, with
    ``call``, ``call(target, args, knobs)``; or the exception it raised), ``verdict = check(before,
    args, outcome, **check_args)`` with ``before`` a CPU copy of ``args`` taken before the call.
    ``function``: the prefill function called (None: ``flash_attn_with_kvcache``), whose defaults
    :func:`call.call_kwargs` leaves out."""

    feature: str
    label: str
    builder: Callable[..., dict]
    build: dict
    check: Callable
    knobs: dict = field(default_factory=dict)
    check_args: dict = field(default_factory=dict)
    call: Optional[Callable] = None
    function: Optional[str] = None


@dataclass(frozen=True)
class Feature:
    """``probes(size, dtype, seed, device)`` lists the probes of one size; ``needs`` are the
    capabilities it exercises; ``function`` is the prefill function its probes call (None: the
    target itself), and ``keywords`` the keywords that function must take
    (:meth:`target.Target.missing`)."""

    name: str
    summary: str
    needs: tuple[str, ...]
    probes: Callable[[Size, object, int, str], list[Probe]]
    function: Optional[str] = None
    keywords: tuple[str, ...] = ()

    @property
    def family(self) -> str:
        return self.name.split("/")[0]


def select(
    features: list[Feature], select: str | list[str] = "quick"
) -> tuple[Size, list[Feature]]:
    """The size and the features ``select`` names: a size name (every feature at that size), or
    feature names, family names (``values``) and at most one size name, comma-separated or as a list
    (the features named, at that size, quick by default)."""
    words = [
        w.strip() for w in (select.split(",") if isinstance(select, str) else select) if w.strip()
    ]
    by_name = {f.name: f for f in features}
    check_names(
        "--select entry",
        [w for w in words if w not in SIZES and w not in FAMILIES],
        [*SIZES, *FAMILIES, *by_name],
    )
    sizes = [w for w in words if w in SIZES]
    size = SIZES[sizes[-1] if sizes else "quick"]
    named = [w for w in words if w not in SIZES]
    if not named:
        return size, list(features)
    return size, [f for f in features if f.name in named or f.family in named]
