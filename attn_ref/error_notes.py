"""``catalogued``: the decorator that puts the catalog note on the package's errors (see
:mod:`errors.notes`).

Taken from this distribution's :mod:`errors` through :func:`attn_ref.packages.own_package`, so a
user's own module named ``errors`` does not break ``import attn_ref``. If the catalog tooling cannot
be loaded at all, the decorator returns functions unchanged: the errors are raised as always, only
without their note.
"""

from __future__ import annotations

import importlib
from typing import Callable, TypeVar

from .packages import own_package

F = TypeVar("F", bound=Callable)

try:
    catalogued = importlib.import_module(own_package("errors").__name__ + ".notes").catalogued
except Exception:  # the notes degrade; nothing else depends on them

    def catalogued(fn: F) -> F:
        return fn
