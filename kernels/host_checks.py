"""Whether :func:`kernels.flash_attn_with_kvcache` runs the validation's value checks.

The value checks (:func:`attn_ref.value_checks.check_kvcache_values` and the ``cu_seqlens_*``
offsets: index ranges, cache capacity, ``cu_seqlens`` values, duplicate write slots, rotary table
rows, ...) read index tensors back to the host: a device-to-host sync per call, which a CUDA graph
capture refuses. The static checks (types, shapes, dtypes, devices, options) read no tensor values
and always run.

The value checks are **on**, unless

* the current CUDA stream is capturing a graph (``torch.cuda.is_current_stream_capturing()``), or
* the environment variable ``ATTN_REF_HOST_CHECKS`` is ``0`` (or ``false``, ``no``, ``off``: the
  rule of :mod:`attn_ref.switches`; read at each call), or
* the call runs inside ``with kernels.no_host_checks():``.

Without them the call reads no device value on the host (its launches are sized from shapes and
static bounds, :mod:`kernels.kvcache`), and an input that breaks a value rule (an out-of-range page
index, a sequence longer than the cache, ...) is computed as garbage or faults, as in FA3. The
reference, :func:`attn_ref.flash_attn_with_kvcache`, always runs every check.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from attn_ref.switches import switch_on

#: Environment variable: ``0`` turns the value checks off outside capture too.
ENV_VAR = "ATTN_REF_HOST_CHECKS"

_OFF = contextvars.ContextVar("kernels_no_host_checks", default=False)


@contextlib.contextmanager
def no_host_checks():
    """Within the block, :func:`kernels.flash_attn_with_kvcache` skips the value checks (module
    docstring).

    Example::

        with kernels.no_host_checks():
            out = kernels.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens)
    """
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def value_checks_enabled(device: torch.device) -> bool:
    """Whether a call with tensors on ``device`` runs the value checks now (module docstring)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return False
    return not _OFF.get() and switch_on(ENV_VAR)
