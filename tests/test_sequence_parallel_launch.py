"""The local launcher: a failing rank or a hang ends the run with an error instead of blocking it.

Four small spawns of 2 gloo ranks. (Successful runs and their per-rank results are exercised by
:mod:`test_sequence_parallel_ranks`.)
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from attn_ref import sequence_parallel as sp


def fail_on_rank_one_while_rank_zero_waits() -> None:
    """Rank 1 raises before a collective; rank 0 waits in it forever (until the launcher kills
    it)."""
    if dist.get_rank() == 1:
        raise ValueError("bad argument on rank 1")
    dist.all_reduce(torch.ones(1))


def sleep_forever() -> None:
    time.sleep(600)


def exit_zero_on_rank_one() -> int:
    """Rank 1 calls ``sys.exit(0)``: that ends rank 1 (a failure of that rank), not the caller."""
    if dist.get_rank() == 1:
        sys.exit(0)
    return dist.get_rank()


def crash_on_rank_one() -> int:
    """Rank 1 dies without a Python exception (as on a segfault or an OOM kill), once the group
    is formed: a rank that dies while gloo connects also fails its peer's
    ``init_process_group``, and which of the two deaths the launcher sees first is a race."""
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(3)
    return dist.get_rank()


@pytest.mark.timeout(120)
def test_a_failing_rank_raises_its_error_and_stops_the_others():
    start = time.monotonic()
    with pytest.raises(ValueError, match="bad argument on rank 1") as info:
        sp.launch(fail_on_rank_one_while_rank_zero_waits, 2, timeout_s=60)
    assert any(
        "--- rank 1 of 2 ---" in note and "Traceback" in note for note in info.value.__notes__
    )
    assert time.monotonic() - start < 45  # the grace period, not the 60 s timeout


@pytest.mark.timeout(120)
def test_a_hang_raises_timeout_error():
    with pytest.raises(
        TimeoutError, match=r"ranks \[0, 1\] of 2 did not finish within timeout_s=4 s"
    ):
        sp.launch(sleep_forever, 2, timeout_s=4)


@pytest.mark.timeout(120)
def test_a_rank_that_dies_silently_raises_child_process_error():
    with pytest.raises(
        ChildProcessError, match=r"rank 1 exited with code 3 without reporting a result"
    ):
        sp.launch(crash_on_rank_one, 2, timeout_s=60)


@pytest.mark.timeout(120)
def test_a_rank_calling_sys_exit_is_a_failure_of_that_rank():
    with pytest.raises(ChildProcessError) as info:
        sp.launch(exit_zero_on_rank_one, 2, timeout_s=60)
    assert str(info.value) == "rank 1 of 2 ended with SystemExit: 0"
    assert isinstance(info.value.__cause__, SystemExit)
    assert any(
        "--- rank 1 of 2 ---" in note and "sys.exit(0)" in note for note in info.value.__notes__
    )
