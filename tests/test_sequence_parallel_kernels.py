"""The sequence-parallel schemes on the Triton kernels (interpreter on CPU), across real gloo ranks.

:mod:`kernels.sequence_parallel` binds the shared SP code to ``kernels.flash_attn_with_kvcache`` and
``kernels.merge_attention_states``; this module runs the cases and error cases of
:mod:`test_sequence_parallel_ranks` with it (one spawn per rank count) and applies the same checks:
every rank's rows match single-device attention over the whole sequence; and some gradient cases of
:mod:`test_sp_backward` (the Triton backward under the ring backward and the collectives' adjoints).
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "kernels.sequence_parallel", reason="needs kernels.flash_attn_with_kvcache and kernels.merge_attention_states"
)

from rank_spawns import spawned_ranks  # noqa: E402
from test_sequence_parallel_ranks import CASES, check_case, check_error, error_cases, run_rank  # noqa: E402
import test_sp_backward  # noqa: E402

SPAWN_TIMEOUT_S = 300


two_ranks = spawned_ranks(run_rank, "kernels", [c.id for c in CASES[2]], 2, SPAWN_TIMEOUT_S)
four_ranks = spawned_ranks(run_rank, "kernels", [c.id for c in CASES[4]], 4, SPAWN_TIMEOUT_S)


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


#: Gradient cases on the kernels (interpreter: a few, one per scheme), by world size.
GRAD_CASE_IDS = {
    2: ["ulysses2x1-gqa-causal-rep-suffix-float16", "kv_gather2x1-gqa-full-rep-suffix",
        "ring1x2-gqa-causal-zigzag-bfloat16", "usp1x2-gqa-causal-zigzag-rep-prefix"],
    4: ["usp2x2-gqa-causal-zigzag-rep-prefix"],
}


def _grad_cases(world: int) -> list:
    return [c for c in test_sp_backward.CASES[world] if c.id in GRAD_CASE_IDS[world]]


two_ranks_gradients = spawned_ranks(test_sp_backward.run_rank, "kernels", GRAD_CASE_IDS[2], 2, SPAWN_TIMEOUT_S)
four_ranks_gradients = spawned_ranks(test_sp_backward.run_rank, "kernels", GRAD_CASE_IDS[4], 4, SPAWN_TIMEOUT_S)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("case", _grad_cases(2), ids=lambda c: c.id)
def test_kernels_two_ranks_gradients_match_single_device(two_ranks_gradients, case):
    test_sp_backward.check_grads(two_ranks_gradients, case)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
@pytest.mark.parametrize("case", _grad_cases(4), ids=lambda c: c.id)
def test_kernels_four_ranks_gradients_match_single_device(four_ranks_gradients, case):
    test_sp_backward.check_grads(four_ranks_gradients, case)
