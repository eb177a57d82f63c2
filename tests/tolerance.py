"""The tests' name for FlashAttention's tolerance rules, :mod:`attn_ref.conformance.tolerance`
(shared with the conformance suite)."""

from attn_ref.conformance.tolerance import (  # noqa: F401
    EPS,
    assert_close_fa,
    assert_lse_close,
    assert_one_rounding_apart,
    rounding_atol,
)
