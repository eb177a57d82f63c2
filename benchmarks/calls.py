"""The case factory of the benchmarks' problems: :func:`make_case` and :func:`clone_args` live in
:mod:`attn_ref.conformance.calls` (shared with the tests and the conformance suite), so that timed
problems are tested ones."""

from attn_ref.conformance.calls import clone_args, make_case  # noqa: F401
