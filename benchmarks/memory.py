"""Peak resident memory that one CPU call adds, read from the kernel's own accounting (Linux).

``tracemalloc`` does not see torch's allocations, so the peak is taken from ``/proc/self/status``:

1. free what Python and the C allocator hold but do not use (``gc.collect()``, glibc
   ``malloc_trim(0)``), so the call cannot silently reuse pages that an earlier call left resident;
2. reset the process's resident high-water mark (``echo 5 > /proc/self/clear_refs``);
3. ``peak_extra = VmHWM after the call - VmRSS before it``.

This counts every page the call touches (torch's buffers, temporaries, the output), at page
granularity, and nothing allocated before it (the inputs). Where ``/proc/self/clear_refs`` cannot be
written (not Linux, or a sandbox that forbids it) the peak is reported as unavailable, not guessed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Callable, Optional

METHOD = (
    "VmHWM - VmRSS around the call, after gc + malloc_trim and a clear_refs high-water-mark reset"
)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise LookupError(field)


def _release_free_memory() -> None:
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_extra_bytes(fn: Callable[[], object]) -> Optional[int]:
    """Peak resident bytes that ``fn()`` adds on top of what is resident before it (None:
    unmeasurable)."""
    _release_free_memory()
    if not _reset_high_water_mark():
        return None
    before = _status_bytes("VmRSS")
    result = fn()
    peak = _status_bytes("VmHWM")
    del result
    return max(0, peak - before)
