"""This distribution's other top-level packages, whatever their names are bound to in the user's
environment.

attn-ref ships three top-level packages: :mod:`attn_ref`, :mod:`kernels` and :mod:`errors`. The last
two have generic names that other code can take: a user's own ``errors.py`` or ``kernels.py`` next
to their script (the script's folder comes first on ``sys.path``), or Hugging Face's ``kernels``
distribution (the hub loader transformers uses). :func:`own_package` finds this distribution's
package by its folder, beside ``attn_ref/``: when the name resolves to that folder it is imported as
usual; otherwise the folder is loaded under a private name (``_attn_ref_own_kernels``), so both the
other module and this one work in the same process. Nothing is executed to find out where a name
resolves (:func:`importlib.util.find_spec` only reads ``sys.path``), and ``sys.modules[name]`` is
never replaced.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The folder that holds ``attn_ref/``, ``kernels/`` and ``errors/`` (a checkout or site-packages).
DISTRIBUTION_ROOT = Path(__file__).resolve().parent.parent
#: The names of this distribution's packages besides :mod:`attn_ref`.
OWN_PACKAGES = ("kernels", "errors")


def private_name(name: str) -> str:
    """The module name :func:`own_package` loads ``name`` under when ``name`` is taken."""
    return f"_attn_ref_own_{name}"


def own_package(name: str) -> ModuleType:
    """This distribution's top-level package ``name`` (``"kernels"`` or ``"errors"``).

    ``import name`` when that resolves to the folder ``DISTRIBUTION_ROOT / name``; else the folder
    is loaded as the package :func:`private_name` ``(name)``. ``ImportError`` when the folder is not
    there (another distribution installed into the same folder may have replaced its files).
    """
    folder = DISTRIBUTION_ROOT / name
    init = folder / "__init__.py"
    if owns_name(name):
        return importlib.import_module(name)
    private = private_name(name)
    if private in sys.modules:
        return sys.modules[private]
    if not init.is_file():
        raise ImportError(f"attn-ref's {name!r} package is missing: {init} does not exist")
    spec = importlib.util.spec_from_file_location(
        private, init, submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[private] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[private]
        raise
    return module


def owns_name(name: str) -> bool:
    """Whether ``import name`` gives (or gave) this distribution's package ``name``."""
    init = DISTRIBUTION_ROOT / name / "__init__.py"
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(module, "__file__", None)
    else:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return False
        origin = spec.origin if spec is not None else None
    return origin is not None and Path(origin).resolve() == init.resolve()


class KernelsNameTaken(ImportError, NotImplementedError):
    """The import name ``kernels`` is this distribution's Triton kernels, not Hugging Face's hub
    loader."""


def check_hub_kernels() -> None:
    """Fail early, with transformers' own message, where transformers' hub kernels would fail.

    transformers' ``use_kernels=True`` and ``attn_implementation="kernels-community/..."`` import
    Hugging Face's ``kernels`` distribution by that name. When the name resolves to this
    distribution's :mod:`kernels` instead, transformers reports "`kernels` is either not installed
    or uses an incompatible version" (and reads this distribution's version). This check raises the
    same text (a :class:`KernelsNameTaken`, an ``ImportError``) before a model is loaded; its
    catalog entry explains the clash (``python -m errors explain`` with the message pasted finds
    it), and the error carries that entry's note.
    """
    if not owns_name("kernels"):
        return
    from .error_notes import catalogued  # here, not above: error_notes imports this module

    catalogued(_raise_kernels_name_taken)()


def _raise_kernels_name_taken() -> None:
    from transformers.utils.import_utils import KERNELS_MAX_VERSION, KERNELS_MIN_VERSION

    raise KernelsNameTaken(
        "`kernels` is either not installed or uses an incompatible version. Please install a "
        "compatible "
        f"version ({KERNELS_MIN_VERSION} <= version < {KERNELS_MAX_VERSION}), e.g. `pip install "
        f"kernels=={KERNELS_MIN_VERSION}`"
    )
