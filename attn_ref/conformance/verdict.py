"""The judgement of one probe: passed or not, the worst error as a ratio of the allowed error, and a
sentence that says what was measured or what went wrong."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Verdict:
    """``ratio``: measured error / allowed error (at most 1 passes; ``inf`` for a wrong shape, NaN,
    an exact check that failed or an exception; None where nothing numeric was measured)."""

    passed: bool
    ratio: Optional[float]
    detail: str

    def __str__(self) -> str:
        ratio = "" if self.ratio is None else f" (error ratio {self.ratio:.3g})"
        return f"{'PASS' if self.passed else 'FAIL'}{ratio}: {self.detail}"


def measured(ratio: float, detail: str) -> Verdict:
    """A numeric check: passes when ``ratio <= 1``."""
    return Verdict(ratio <= 1, ratio, detail)


def failed(detail: str) -> Verdict:
    return Verdict(False, float("inf"), detail)


def passed(detail: str) -> Verdict:
    return Verdict(True, None, detail)


def worst(*verdicts: Verdict) -> Verdict:
    """One verdict for several checks of one call: the first failure, else the largest ratio."""
    for verdict in verdicts:
        if not verdict.passed:
            return verdict
    ratios = [v for v in verdicts if v.ratio is not None]
    if not ratios:
        return verdicts[0]
    top = max(ratios, key=lambda v: v.ratio)
    return Verdict(True, top.ratio, "; ".join(v.detail for v in verdicts))
