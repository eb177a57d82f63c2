"""The tests' name for the independent dense oracle of the whole call,
:mod:`attn_ref.conformance.oracle` (shared with the conformance suite). Its attention is the dense
formula, :mod:`attn_ref.dense`, which the tests import as it is."""

from attn_ref.conformance.oracle import (  # noqa: F401
    FP8,
    OracleResult,
    assert_matches_oracle,
    kvcache_oracle,
    logical_cache,
    physical_slots,
    readable_logical_cache,
    rope,
    sdpa_attention,
)
