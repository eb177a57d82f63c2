"""Every error flash_attn_with_kvcache raises, in both implementations: exact type, exact text,
caches untouched (the kernels raise what the reference raises, from the same validation).

The cases are the tables of :mod:`attn_ref.conformance.error_cases` (shared with the conformance
suite); calls upstream accepts (and arguments it ignores) are in ``test_compat_fa3_kvcache.py``.
"""

import pytest
import torch

from attn_ref import flash_attn_with_kvcache
from attn_ref.conformance.error_cases import (
    PACKAGE_CHECKS,
    UPSTREAM_ORDER,
    UPSTREAM_REJECTS,
    base,
    message_matches,
)
from kvcache_cases import KERNELS, REF, over


@pytest.mark.parametrize("impl, case", over([REF, KERNELS], UPSTREAM_ORDER))
def test_upstream_errors_and_order(impl, case):
    check_raises(impl.api, *case)


@pytest.mark.parametrize("impl, case", over([REF, KERNELS], PACKAGE_CHECKS))
def test_package_errors(impl, case):
    check_raises(impl.api, *case)


def check_raises(api, change, error, message):
    """``api`` (a ``flash_attn_with_kvcache``, called on the CPU tensors of the case) raises exactly
    ``error(message)`` and leaves the caches as they were."""
    args = change(base())
    caches = {
        name: args[name].clone()
        for name in ("k_cache", "v_cache")
        if isinstance(args.get(name), torch.Tensor) and args[name].device.type != "meta"
    }
    with pytest.raises(error) as info:
        api(**args)
    assert type(info.value) is error
    assert message_matches(str(info.value), message)
    assert all(torch.equal(args[name], before) for name, before in caches.items())


def test_base_call_is_valid_and_appends():
    args = base()
    before = args["v_cache"].clone()
    flash_attn_with_kvcache(**args)
    assert not torch.equal(before, args["v_cache"])


def test_only_qv_with_k_fills_placeholder_and_v_cache():
    # q=None, k_cache=None, only_qv with k: the placeholder takes k's head dim (32 != dv) and the
    # call goes through; v lands in v_cache (sglang writes the new keys into its discarded
    # placeholder).
    args = dict(
        base(),
        q=None,
        k_cache=None,
        only_qv=True,
        qv=torch.randn(2, 2, 4, 16),
        k=torch.randn(2, 2, 2, 32),
    )
    flash_attn_with_kvcache(**args)
    assert torch.equal(args["v_cache"][0, 3:5], args["v"][0]) and torch.equal(
        args["v_cache"][1, 5:7], args["v"][1]
    )


def test_upstream_rejects_name_package_checks():
    assert set(UPSTREAM_REJECTS) <= set(PACKAGE_CHECKS)
