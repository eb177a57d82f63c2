"""Parsers of option values shared by the checks (TEMPORARY home, merged into the helpers module)."""

from __future__ import annotations

import numbers
import operator
from typing import Optional

import torch

from .call import INT64_MAX

def _int64(x) -> Optional[int]:
    """``x`` as an int if it is one (Python or numpy int, integer 1-element tensor) within int64, as
    FA3's int64 arguments need, else None. Bools and floats are not ints here."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
        return None
    try:
        value = operator.index(x)
    except TypeError:
        return None
    return value if -INT64_MAX - 1 <= value <= INT64_MAX else None



def _window_pair(window_size) -> tuple[int, int]:
    """``(left, right)`` from ``window_size[0]``, ``window_size[1]`` (FA3 reads only those two)."""
    try:
        sides = _int64(window_size[0]), _int64(window_size[1])
    except (TypeError, IndexError, KeyError):
        sides = None, None
    if None in sides:
        raise ValueError(
            f"window_size must hold two ints (left, right) in int64 range, a negative side meaning "
            f"unbounded, got {window_size!r}"
        )
    return sides



def _chunk_size(attention_chunk) -> int:
    """sglang's ``0 if attention_chunk is None else int(attention_chunk)``; ``<= 0`` is off (FA3)."""
    try:
        chunk = _int64(0 if attention_chunk is None else int(attention_chunk))
    except (TypeError, ValueError, OverflowError, RuntimeError):
        chunk = None
    if chunk is None:
        raise ValueError(
            f"attention_chunk must be None or convertible with int() to an int64 (<= 0 = off), "
            f"got {attention_chunk!r}"
        )
    return max(chunk, 0)



def _flag(name: str, x, none_is_false: bool = False) -> bool:
    """A bool argument: a bool (Python or NumPy), an int 0 / 1, or a 1-element bool or integer
    tensor holding 0 / 1; ``None`` too where sglang only tests the value's truth (``only_qv``)."""
    if x is None and none_is_false:
        return False
    if isinstance(x, torch.Tensor):
        scalar = x.numel() == 1 and x.device.type != "meta" and not (x.dtype.is_floating_point or x.is_complex())
        value = x.item() if scalar else None
    elif isinstance(x, numbers.Integral) or type(x).__name__ in ("bool_", "bool"):
        value = int(x)
    else:
        value = None
    if value not in (0, 1):
        raise TypeError(f"{name} must be a bool, got {x!r}")
    return bool(value)
