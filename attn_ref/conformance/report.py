"""The report of a run: per feature pass / fail / not supported / not exported, the worst error as a
ratio of the allowed error, the time, and for each failed probe what went wrong and a repro snippet.
A prefill feature whose function the target does not export is "not exported"; when every selected
prefill feature is, the text leaves them out of its table and says the section is not applicable.

:meth:`Report.to_json` is what ``--report FILE.json`` writes; :meth:`Report.text` what the command
line prints; :attr:`Report.exit_status` is 0 only when no feature failed.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Optional

PASS, FAIL, NOT_SUPPORTED, NOT_EXPORTED = "pass", "fail", "not supported", "not exported"


@dataclass
class Failure:
    """One failed probe: its label (the variant of the feature), what went wrong, the script."""

    label: str
    detail: str
    repro: str


@dataclass
class FeatureResult:
    """``worst_ratio``: the largest error ratio of the feature's probes (None when none was
    measured, e.g. error checks; ``inf`` for an exact check that failed); ``unsupported``: the
    declared capabilities that made it "not supported"; ``not_exported``: the function (or
    ``function(keyword=)``) that the target does not export and the feature calls."""

    name: str
    summary: str
    status: str
    probes: int = 0
    worst_ratio: Optional[float] = None
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    not_exported: list[str] = field(default_factory=list)


@dataclass
class Report:
    """``exports``: the prefill functions found beside the target (``module:function``), whether
    or not a selected feature called them."""

    target: str
    device: str
    dtype: str
    size: str
    seed: int
    unsupported: list[str]
    features: list[FeatureResult]
    exports: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[FeatureResult]:
        return [f for f in self.features if f.status == FAIL]

    @property
    def exit_status(self) -> int:
        return 1 if self.failed else 0

    def status(self, feature: str) -> str:
        """The status of one feature, by name."""
        return next(f.status for f in self.features if f.name == feature)

    def to_json(self) -> dict:
        """The report as JSON-ready data (an infinite ratio is written as the string ``"inf"``)."""
        data = asdict(self)
        for feature in data["features"]:
            if feature["worst_ratio"] is not None and math.isinf(feature["worst_ratio"]):
                feature["worst_ratio"] = "inf"
        data["passed"] = not self.failed
        return data

    def write(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.to_json(), file, indent=2)
            file.write("\n")

    def text(self, repros: bool = True) -> str:
        """A table of the features, then each failure with its repro snippet."""
        lines = [
            f"conformance of {self.target} on {self.device}, {self.dtype}, size {self.size}, seed "
            f"{self.seed}"
            + (
                f", declared unsupported: {', '.join(self.unsupported)}" if self.unsupported else ""
            ),
            "",
        ]
        prefill = [f for f in self.features if f.name.startswith("prefill/")]
        inapplicable = bool(prefill) and all(f.status == NOT_EXPORTED for f in prefill)
        rows = [f for f in self.features if not (inapplicable and f.name.startswith("prefill/"))]
        width = max((len(f.name) for f in rows), default=0)
        for f in rows:
            ratio = "" if f.worst_ratio is None else f"worst error ratio {f.worst_ratio:.3g}"
            if f.status == NOT_SUPPORTED:
                ratio = f"declared unsupported: {', '.join(f.unsupported)}"
            if f.status == NOT_EXPORTED:
                ratio = f"the target does not export {', '.join(f.not_exported)}"
            lines.append(
                f"{f.status.upper():<13} {f.name:<{width}}  {f.probes:>3} probes  "
                f"{f.seconds:6.2f}s  {ratio}"
            )
        statuses = (PASS, FAIL, NOT_SUPPORTED, NOT_EXPORTED)
        counts = {s: sum(f.status == s for f in self.features) for s in statuses}
        lines += ["", ", ".join(f"{n} {s}" for s, n in counts.items())]
        if prefill:
            lines.append(self._prefill_line(inapplicable))
        for f in self.failed:
            for failure in f.failures:
                lines += ["", f"FAIL {f.name} [{failure.label}]: {failure.detail}"]
                if repros:
                    lines += ["", failure.repro]
        return "\n".join(lines)

    def _prefill_line(self, inapplicable: bool) -> str:
        """What the prefill section tested: the functions found, or that it is not applicable (its
        features, all "not exported", are then left out of the table)."""
        found = ", ".join(self.exports) or "none of FA3's prefill functions"
        if inapplicable:
            return f"prefill section: not applicable, the target exports {found}"
        return f"prefill section: {found}"
