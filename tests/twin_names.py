"""The naming rule of twins, shared by the mirror-order test and the side-by-side pages' test.

A kernel piece takes its reference twin's name; a launched program adds ``_kernel`` and a launch
planner ``plan_``; a leading underscore does not count.
"""

from __future__ import annotations


def twin_name(name: str) -> str:
    """``_split_states_kernel``, ``_split_states`` -> ``split_states``; ``plan_append_kv`` ->
    ``append_kv``."""
    return name.lstrip("_").removeprefix("plan_").removesuffix("_kernel")
