"""Module-scoped fixtures that run one test module's rank function once per rank count.

The sequence-parallel test modules spawn real gloo groups with :func:`attn_ref.sequence_parallel.launch`
(seconds each), so every module spawns once per world size and checks all its cases against the
reports. ``run_rank(impl, case_ids, world)`` is the module's per-rank function (``impl``: ``"attn_ref"``
or ``"kernels"``); the fixture's value is the list of the ranks' reports, rank 0 first.
"""

from __future__ import annotations

from typing import Callable, Sequence

import pytest

from attn_ref import sequence_parallel as sp


def spawned_ranks(run_rank: Callable, impl: str, case_ids: Sequence[str], world: int, timeout_s: float):
    """A module-scoped fixture: the reports of ``world`` ranks running ``run_rank`` on ``case_ids``."""

    @pytest.fixture(scope="module")
    def reports() -> list[dict]:
        return sp.launch(run_rank, world, (impl, list(case_ids), world), timeout_s=timeout_s)

    return reports
