"""Memory shared between tensors: the checks of the memory a ``flash_attn_with_kvcache`` call
writes.

The call writes the caches (append) and ``out``; a written element that another argument also reads,
or that two slots share, makes the result depend on the order of the writes (FA3 runs them in
parallel). Offsets below are in elements of the tensor's storage. The validation phases
(:mod:`attn_ref.validation`) call :func:`_require_writable` and :func:`_require_unshared`; the value
checks (:mod:`attn_ref.value_checks`) call the latter with the offsets of
:func:`_cache_write_offsets` for the appended cache slots.
"""

from __future__ import annotations

import torch

from .paged import cache_slots


def _non_overlapping(x: torch.Tensor) -> bool:
    """True if no two elements of ``x`` share memory: sorted by stride, every dimension's stride
    exceeds the span of the smaller ones (a stride-0 / expanded view fails; a sufficient test)."""
    if x.is_contiguous():
        return True
    span = 0
    for stride, size in sorted((st, n) for st, n in zip(x.stride(), x.shape) if n > 1):
        if stride <= span:
            return False
        span += (size - 1) * stride
    return True


def _all_offsets(x: torch.Tensor) -> torch.Tensor:
    """Storage offsets of every element of ``x``, ``(x.numel(),)`` int64."""
    offsets = torch.tensor([x.storage_offset()], dtype=torch.int64)
    for size, stride in zip(x.shape, x.stride()):
        offsets = (offsets[:, None] + torch.arange(size, dtype=torch.int64) * stride).flatten()
    return offsets


def _contains(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Which storage ``offsets`` are elements of ``x`` (``x`` non-overlapping): peel the dimensions
    off from the largest stride down; an offset is an element iff nothing is left at the end."""
    rest = offsets - x.storage_offset()
    inside = rest >= 0
    for stride, size in sorted(
        ((st, n) for st, n in zip(x.stride(), x.shape) if n > 1), reverse=True
    ):
        index = torch.clamp(torch.div(rest, stride, rounding_mode="floor"), 0, size - 1)
        rest = rest - index * stride
    return inside & (rest == 0)


def _storage_start(x: torch.Tensor) -> int:
    """Address of the start of ``x``'s storage (cheaper than ``x.untyped_storage().data_ptr()``)."""
    return x.data_ptr() - x.storage_offset() * x.element_size()


def _shares_memory(x: torch.Tensor, offsets, y: torch.Tensor) -> bool:
    """Whether elements of ``x`` at ``offsets()`` (a callable, evaluated only if needed) lie in
    ``y``'s memory. Different element sizes over one byte range count as shared."""
    if x.numel() == 0 or y.numel() == 0 or "meta" in (x.device.type, y.device.type):
        return False
    if x.device != y.device or _storage_start(x) != _storage_start(y):
        return False

    def byte_range(t):
        last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        return t.storage_offset() * t.element_size(), (last + 1) * t.element_size()

    (x0, x1), (y0, y1) = byte_range(x), byte_range(y)
    if x1 <= y0 or y1 <= x0:
        return False
    if x.element_size() != y.element_size() or not _non_overlapping(y):
        return True
    return bool(_contains(y, offsets().to(torch.int64)).any())


def _require_writable(name: str, x: torch.Tensor) -> None:
    """``x`` is written in place: it must not have elements that share memory, nor require grad
    while grad mode is on (PyTorch refuses in-place writes there, and so does FA3's op)."""
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{name} requires grad, but the call writes it in place; pass a tensor that "
            f"does not require grad (e.g. {name}.detach())"
        )
    if not _non_overlapping(x):
        raise ValueError(
            f"{name} has elements that share memory (e.g. a stride-0 view from expand), "
            f"but the call writes it in place; pass a tensor with its own memory per "
            f"element (e.g. {name}.contiguous())"
        )


def _storage_starts(arguments: dict) -> dict:
    """:func:`_storage_start` of each tensor among ``arguments`` (name -> argument)."""
    return {name: _storage_start(x) for name, x in arguments.items() if isinstance(x, torch.Tensor)}


def _require_unshared(name: str, offsets, arguments: dict, starts: dict) -> None:
    """The elements of argument ``name`` the call writes (``offsets()``) must not be memory of
    another argument; ``starts`` maps the tensor arguments to their :func:`_storage_start`."""
    x = arguments[name]
    for other_name, start in starts.items():
        if (
            other_name != name
            and start == starts.get(name)
            and _shares_memory(x, offsets, arguments[other_name])
        ):
            raise ValueError(
                f"{name} shares memory with {other_name}, and the call writes {name}: "
                f"pass tensors that do not overlap"
            )


def _cache_write_offsets(cache: torch.Tensor, page_table, rows, starts, lens) -> torch.Tensor:
    """Storage offsets of every element the append writes into ``cache``: positions
    ``starts[i] .. starts[i] + lens[i] - 1`` of cache row ``rows[i]``, all heads and channels."""
    table = page_table.cpu() if page_table is not None else None
    tokens = []
    for row, start, n in zip(rows, starts, lens):
        major, minor = cache_slots(row, torch.arange(start, start + n), table, cache.shape[1])
        tokens.append(major * cache.stride(0) + minor * cache.stride(1))
    heads = torch.arange(cache.shape[2]) * cache.stride(2)
    channels = torch.arange(cache.shape[3]) * cache.stride(3)
    return (
        cache.storage_offset() + torch.cat(tokens)[:, None, None] + heads[:, None] + channels
    ).flatten()
