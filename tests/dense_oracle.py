"""The tests' name for the independent dense oracle, :mod:`attn_ref.conformance.oracle` (shared with
the conformance suite)."""

from attn_ref.conformance.oracle import (  # noqa: F401
    FP8, OracleResult, assert_matches_oracle, dense_attention, kvcache_oracle, logical_cache, masked_keys,
    physical_slots, readable_logical_cache, rope, sdpa_attention,
)
