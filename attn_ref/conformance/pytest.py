"""The conformance suite inside a pytest session: one test per feature.

In a test module of your own::

    from attn_ref.conformance.pytest import conformance_test

    test_my_kernel = conformance_test("my_pkg.attention:flash_attn_with_kvcache", device="cuda",
                                      select="quick", unsupported=["fp8"])

``pytest -k test_my_kernel`` then reports ``test_my_kernel[values/leftpad]`` and so on: a failure
carries the verdict and the repro snippet; a feature that needs a declared-unsupported capability is
skipped with the reason "not supported" (``pytest -rs`` lists them), and a prefill feature whose
function the target does not export with the reason "not exported".
"""

from __future__ import annotations

from typing import Callable, Iterable, Union

import pytest
import torch

from .grid import Feature
from .report import FAIL, NOT_EXPORTED, NOT_SUPPORTED
from .runner import plan, run_feature


def conformance_test(
    target: Union[str, Callable],
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    select: Union[str, list[str]] = "quick",
    seed: int = 0,
    unsupported: Iterable[str] = (),
) -> Callable:
    """A pytest test function parametrised over the selected features (arguments as
    :func:`attn_ref.conformance.run_conformance`); bind it to a ``test_*`` name in a test module."""
    found, declared, size, features = plan(target, select, unsupported)

    @pytest.mark.parametrize("feature", features, ids=[feature.name for feature in features])
    def test_conformance(feature: Feature) -> None:
        result = run_feature(found, feature, size, dtype, seed, str(device), declared)
        if result.status == NOT_EXPORTED:
            pytest.skip(f"not exported: {feature.name} calls {', '.join(result.not_exported)}")
        if result.status == NOT_SUPPORTED:
            pytest.skip(
                f"not supported: {feature.name} needs {', '.join(result.unsupported)}, declared "
                "unsupported"
            )
        if result.status == FAIL:
            pytest.fail(
                "\n\n".join(f"[{f.label}] {f.detail}\n\n{f.repro}" for f in result.failures),
                pytrace=False,
            )

    return test_conformance
