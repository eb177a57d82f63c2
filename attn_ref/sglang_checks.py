"""sglang's own Python checks of ``flash_attn_with_kvcache``, verbatim and in sglang's order.

The first phases of :func:`attn_ref.validation.check_kvcache_args`: sglang's ``ver`` check, then
its checks of the caches, of q and of the default ``softmax_scale`` (with sglang's placeholder
``k_cache`` and dummy ``q`` for ``only_qv``). sglang raises the two stride messages with ``assert``;
here they are ``ValueError`` with the same text.
"""

from __future__ import annotations

import torch

from .argument_checks import (
    _default_scale,
    _flag,
    _head_dim,
    _require_contiguous_last_dim,
    _require_tensor,
)


def _sglang_version(ver) -> None:
    """sglang's ``ver != 3`` check (SGL-B), before everything else, for any ``ver``: a value whose
    comparison fails (e.g. a multi-element tensor, an ambiguous truth value) is not 3."""
    try:
        three = not bool(ver != 3)
    except (TypeError, ValueError, RuntimeError):
        three = False
    if not three:
        raise ValueError(f"sgl_kernel.flash_attn only supports ver=3, got {ver!r}")


def _sglang_caches(q, k_cache, v_cache, k, only_qv) -> tuple[torch.Tensor, bool]:
    """sglang's cache checks: ``v_cache`` given, with a contiguous last dimension; ``only_qv`` (a
    truth value there); ``k_cache``, which only ``only_qv`` may leave out, for sglang's placeholder
    ``(*v_cache.shape[:-1], d)``, never read on that path (``d`` from q, else k, else 64), with a
    contiguous last dimension. Returns ``(k_cache, only_qv)``."""
    if v_cache is None:
        raise ValueError("v_cache must be provided")
    _require_tensor("v_cache", v_cache)
    _require_contiguous_last_dim("v_cache", v_cache)
    only_qv = _flag("only_qv", only_qv, none_is_false=True)
    if k_cache is None:
        if not only_qv:
            raise ValueError("k_cache can only be None when only_qv=True")
        source_name, source = ("q", q) if q is not None else ("k", k)
        if source is not None:
            _require_tensor(source_name, source)
        k_head_size = _head_dim(source_name, source) if source is not None else 64
        like = source if source is not None else v_cache
        k_cache = torch.empty(
            (*v_cache.shape[:-1], k_head_size), dtype=like.dtype, device=like.device
        )
    _require_tensor("k_cache", k_cache)
    _require_contiguous_last_dim("k_cache", k_cache)
    return k_cache, only_qv


def _sglang_q(q, qv, k_cache: torch.Tensor, only_qv: bool) -> torch.Tensor:
    """sglang's q checks: only ``only_qv`` with a ``qv`` may leave q out, for sglang's dummy
    ``(*qv.shape[:-1], k_cache's head dim)``, never read on that path. Returns q."""
    if q is None:
        if not only_qv:
            raise ValueError("q can only be None when only_qv=True")
        if qv is None:
            raise ValueError("q must be provided unless qv is provided with only_qv=True")
        _require_tensor("qv", qv)
        q = torch.empty((*qv.shape[:-1], k_cache.shape[-1]), dtype=qv.dtype, device=qv.device)
    _require_tensor("q", q)
    return q


def _sglang_softmax_scale(softmax_scale, q: torch.Tensor, qv, only_qv: bool):
    """sglang's default for ``softmax_scale=None``: ``qv.shape[-1] ** -0.5`` with ``only_qv`` (which
    needs qv), else ``(q.shape[-1] + qv.shape[-1]) ** -0.5`` (no qv: ``q.shape[-1] ** -0.5``).
    A given value is returned as it is (:func:`_check_scalars` checks it)."""
    if softmax_scale is not None:
        return softmax_scale
    if only_qv:
        if qv is None:
            raise ValueError("only_qv=True requires qv to be provided")
        _require_tensor("qv", qv)
        return _default_scale("qv.shape[-1]", _head_dim("qv", qv))
    if qv is not None:
        _require_tensor("qv", qv)
    dims = _head_dim("q", q) + (_head_dim("qv", qv) if qv is not None else 0)
    return _default_scale("q.shape[-1] + qv.shape[-1]" if qv is not None else "q.shape[-1]", dims)
