"""The sequence-parallel schemes on the Triton kernels (interpreter on CPU), across real gloo ranks.

:mod:`kernels.sequence_parallel` binds the shared SP code to ``kernels.flash_attn_with_kvcache`` and
``kernels.merge_attention_states``; this module runs the cases and error cases of
:mod:`test_sequence_parallel_ranks` with it (one spawn per rank count) and applies the same checks:
every rank's rows match single-device attention over the whole sequence. The kernel backend has no
backward yet: a backward through it raises (it never falls back to the reference's numerics).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "kernels.sequence_parallel", reason="needs kernels.flash_attn_with_kvcache and kernels.merge_attention_states"
)

from attn_ref import sequence_parallel as sp  # noqa: E402
from test_sequence_parallel_ranks import CASES, check_case, check_error, error_cases, run_rank  # noqa: E402

SPAWN_TIMEOUT_S = 300


def _spawn(world: int) -> list[dict]:
    return sp.launch(run_rank, world, ("kernels", [c.id for c in CASES[world]], world), timeout_s=SPAWN_TIMEOUT_S)


@pytest.fixture(scope="module")
def two_ranks():
    return _spawn(2)


@pytest.fixture(scope="module")
def four_ranks():
    return _spawn(4)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("case", CASES[2], ids=lambda c: c.id)
def test_kernels_two_ranks_match_single_device(two_ranks, case):
    check_case(two_ranks, case)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("error", error_cases(2), ids=lambda e: e.name)
def test_kernels_two_ranks_errors_on_every_rank(two_ranks, error):
    check_error(two_ranks, error)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("case", CASES[4], ids=lambda c: c.id)
def test_kernels_four_ranks_match_single_device(four_ranks, case):
    check_case(four_ranks, case)


def test_kernel_backend_refuses_the_backward():
    """No Triton backward yet: the forward works with inputs that require grad, the backward raises."""
    from kernels import sequence_parallel as ksp

    q, k, v = (torch.randn(1, 8, 2, 16, requires_grad=True) for _ in range(3))
    out = ksp.USPAttention(2, 16, causal=True)(q, k, v)  # one rank: local attention on the kernels
    ring_out, _ = ksp.ring_attention(q, k, v, causal=True)  # a ring of one rank
    for result in (out, ring_out):
        with pytest.raises(NotImplementedError, match=r"the 'kernels' attention backend has no backward"):
            result.sum().backward()
