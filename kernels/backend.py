"""Where the kernels can run, checked before the first launch of a call.

Triton runs a kernel on a GPU, or, with ``TRITON_INTERPRET=1`` set before the kernels are decorated
(that is, before :mod:`kernels` is imported), through its numpy interpreter on the CPU. Launched on
CPU tensors otherwise, Triton fails deep inside its driver with ``0 active drivers ([]). There
should only be one.`` (no GPU driver) or a pointer error (a GPU, but CPU tensors).
:func:`require_backend` turns both into an error that names the fix, raised before anything is
launched, so no cache is partly written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch


def interpreter_requested(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for Triton's interpreter (``TRITON_INTERPRET`` set, not empty or
    0)."""
    return environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require_backend(arguments: Iterable, interpreting: bool,
                    environ: Mapping[str, str] = os.environ) -> None:
    """Raise unless the kernels can take ``arguments`` (a launch's runtime arguments): in the
    interpreter anything goes; otherwise no tensor may be on the CPU. ``interpreting`` is whether
    the kernels were decorated for the interpreter (:data:`kernels.launch.INTERPRETING`);
    ``environ`` tells a late ``TRITON_INTERPRET`` apart."""
    if interpreting or not any(isinstance(x, torch.Tensor) and x.device.type == "cpu"
                               for x in arguments):
        return
    if interpreter_requested(environ):
        raise NotImplementedError(
            "TRITON_INTERPRET=1 was set after kernels was imported; Triton reads it when the "
            "kernels are "
            "defined: set it before the first import of kernels (in the shell, or at the top of "
            "the script)"
        )
    raise NotImplementedError(
        "the Triton kernels got CPU tensors without Triton's interpreter: run them on a CUDA "
        "device, or "
        "set TRITON_INTERPRET=1 before importing kernels to run them on the CPU (slow; for tests), "
        "or "
        "use attn_ref, the PyTorch reference with the same API"
    )
