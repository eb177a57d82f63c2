"""The ``ranks`` fixture: a test module's rank function spawned once per (implementation, world
size).

The sequence-parallel test modules spawn real gloo groups with
:func:`attn_ref.sequence_parallel.launch` (seconds each), so a module spawns once per :class:`Spawn`
and checks all that spawn's cases against its reports. ``run_rank(impl, case_ids, world)`` is the
module's per-rank function (``impl``: ``"attn_ref"`` or ``"kernels"``); the fixture's value is the
list of the ranks' reports, rank 0 first.

Tests take ``ranks`` indirectly, parametrised by :func:`each_spawn` or :func:`each_spawn_and`; each
spawn runs once per module whatever the number of test functions that read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import pytest

from attn_ref import sequence_parallel as sp

#: Whole-run limit of one spawn (the launcher kills a hang after it), by implementation: a hang
#: guard, generous because `make test` runs two test files at once on a 2-core machine.
SPAWN_TIMEOUT_S = {"attn_ref": 480, "kernels": 600}


@dataclass(frozen=True)
class Spawn:
    """One launch: ``world`` ranks running ``<impl>.sequence_parallel`` (the ``ranks`` fixture's
    parameter)."""

    impl: str
    world: int

    @property
    def id(self) -> str:
        return f"{self.impl}-{self.world}ranks"


SPAWNS = [Spawn(impl, world) for impl in ("attn_ref", "kernels") for world in (2, 4)]
REFERENCE_SPAWNS = [spawn for spawn in SPAWNS if spawn.impl == "attn_ref"]


def spawned_ranks(run_rank: Callable, spawn_cases: Callable[[Spawn], Sequence]):
    """The ``ranks`` fixture: the reports of the spawn ``request.param`` of ``run_rank`` on its
    cases.

    ``spawn_cases(spawn)`` lists the cases (objects with an ``id``) that the spawn runs. Each spawn
    runs once per module, in the setup of its first test; its reports (or its failure) serve the
    module's later tests in any order, and are dropped when the module ends. (A module-scoped
    fixture parametrised by the spawn would rely on pytest grouping the tests by spawn, which it
    does not do for a parametrize that also has a direct argument: a spawn would run once per test
    function.)
    """
    outcomes: dict[Spawn, object] = {}  # spawn -> its reports, or the exception it raised

    @pytest.fixture
    def ranks(request) -> list[dict]:
        spawn: Spawn = request.param
        if spawn.impl == "kernels":
            pytest.importorskip(
                "kernels.sequence_parallel",
                reason="needs kernels.flash_attn_with_kvcache and kernels.merge_attention_states",
            )
        if spawn not in outcomes:
            if not outcomes:
                request.node.getparent(pytest.Module).addfinalizer(outcomes.clear)
            case_ids = [case.id for case in spawn_cases(spawn)]
            try:
                outcomes[spawn] = sp.launch(
                    run_rank,
                    spawn.world,
                    (spawn.impl, case_ids, spawn.world),
                    timeout_s=SPAWN_TIMEOUT_S[spawn.impl],
                )
            # the spawn failed: every test that reads it fails
            except Exception as exc:  # noqa: BLE001
                outcomes[spawn] = exc
        if isinstance(outcomes[spawn], Exception):
            raise outcomes[spawn]
        return outcomes[spawn]

    return ranks


def _timeout(spawn: Spawn):
    """A test's limit: the spawn's, plus the checks (the test whose setup spawns pays for it)."""
    return pytest.mark.timeout(SPAWN_TIMEOUT_S[spawn.impl] + 60)


def each_spawn(spawns: Iterable[Spawn] = SPAWNS):
    """``parametrize("ranks")``: one test per spawn."""
    params = [pytest.param(spawn, id=spawn.id, marks=_timeout(spawn)) for spawn in spawns]
    return pytest.mark.parametrize("ranks", params, indirect=True)


def each_spawn_and(
    argname: str,
    items: Callable[[Spawn], Iterable],
    spawns: Iterable[Spawn] = SPAWNS,
    item_id: Callable = lambda item: item.id,
):
    """``parametrize("ranks, <argname>")``: one test per spawn and each of its ``items(spawn)``.

    Ids read ``<impl>-<N>ranks-<item id>``.
    """
    params = [
        pytest.param(spawn, item, id=f"{spawn.id}-{item_id(item)}", marks=_timeout(spawn))
        for spawn in spawns
        for item in items(spawn)
    ]
    return pytest.mark.parametrize(("ranks", argname), params, indirect=["ranks"])
