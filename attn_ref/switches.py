"""On/off settings read from environment variables, with one rule for every switch of the package.

A switch is on unless its variable is set to ``0``, ``false``, ``no`` or ``off`` (any case, spaces
around ignored); unset means on. Read at each use, so a test or a notebook can flip it at run time.
Used by ``ATTN_REF_SP_CHECK_RANKS`` (:mod:`attn_ref.sequence_parallel.agreement`) and
``ATTN_REF_HOST_CHECKS`` (:mod:`kernels.host_checks`).
"""

from __future__ import annotations

import os

#: Values that turn a switch off.
OFF_VALUES = ("0", "false", "no", "off")


def switch_on(env_var: str) -> bool:
    """Whether the switch named by the environment variable ``env_var`` is on (module docstring)."""
    return os.environ.get(env_var, "1").strip().lower() not in OFF_VALUES
