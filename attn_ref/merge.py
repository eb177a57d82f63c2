"""Merging attention states through their log-sum-exp (the ⊕ of split-KV, ring attention, prefixes).

An attention *state* over a set of keys ``K`` is ``(o, lse)`` with ``lse = log Σ_{j∈K} e^{ℓ_j}``
(natural log) and ``o = Σ_{j∈K} e^{ℓ_j - lse} v_j``. For disjoint key sets A and B::

    lse = log(e^{lse_A} + e^{lse_B})
    o   = e^{lse_A - lse} o_A + e^{lse_B - lse} o_B

computed stably by subtracting ``m = max(lse_A, lse_B)`` first. ⊕ is associative and commutative,
so any number of partial states (KV splits, ring steps) can be folded in any order.

Conventions: a state over no visible key is ``(0, -inf)``; merging two such states gives
``(0, -inf)``, never NaN. An LSE of ``+inf`` (FA3's marker for zero-length KV) is treated as
``-inf``, as sglang's ``merge_state`` does. Libraries that use base-2 LSEs (FlashInfer, the Triton
tutorial) must convert with ``lse_e = lse_2 * ln 2`` first.

:func:`merge_attention_states` merges two states, :func:`combine_attention_states` folds ``n``
stacked ones left to right, ``((s_0 ⊕ s_1) ⊕ s_2) ⊕ ...``, with :func:`_merge_states`, the fold
that :func:`attn_ref.kvcache.attend` also runs on its split states (the order the kernels' merge
kernel folds in). Their argument checks, :func:`check_merge_states` and
:func:`check_combine_states`, are also those of :func:`kernels.merge_attention_states` and
:func:`kernels.combine_attention_states` (same messages, same order).
"""

from __future__ import annotations

from functools import reduce

import torch

from .error_notes import catalogued


@catalogued
def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out_a, lse_a) ⊕ (out_b, lse_b)`` in fp32.

    Shapes: ``out_* (..., dim)``, ``lse_* (...)`` (= ``out.shape[:-1]``), any float dtype, one shape
    for both states: the LSE layout of sglang's ``merge_state``, ``out (s_q, h, d)`` with ``lse
    (s_q, h)``, and of ``attention_with_lse``. Returns fp32 ``(out (..., dim), lse (...))``.
    """
    check_merge_states(out_a, lse_a, out_b, lse_b)
    return _merge_pair(out_a.float(), lse_a.float(), out_b.float(), lse_b.float())


@catalogued
def combine_attention_states(
    out_partials: torch.Tensor, lse_partials: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``n`` attention states ``s_0 ⊕ s_1 ⊕ ... ⊕ s_{n-1}`` left to right, in index order (e.g.
    the split-KV partials), in fp32.

    Shapes: ``out_partials (n, ..., dim)``, ``lse_partials (n, ...)``, any float dtype. Returns fp32
    ``(out (..., dim), lse (...))``. ``+inf`` LSEs are read as ``-inf``, also when ``n = 1``.
    """
    check_combine_states(out_partials, lse_partials)
    outs = out_partials.to(torch.float32, copy=True)  # a copy: one state is returned as it is
    lses = _no_plus_inf(lse_partials.float())
    return _merge_states(list(zip(outs, lses)))


def check_merge_states(out_a, lse_a, out_b, lse_b) -> None:
    """Two attention states of one shape: ``out_* (..., dim)``, ``lse_* (...)`` =
    ``out_a.shape[:-1]``."""
    check_state("out_a", out_a, "lse_a", lse_a)
    check_state("out_b", out_b, "lse_b", lse_b)
    if out_b.shape != out_a.shape:
        raise ValueError(
            f"out_b must have the shape of out_a {tuple(out_a.shape)}, got {tuple(out_b.shape)}"
        )


def check_combine_states(out_partials, lse_partials) -> None:
    """``n >= 1`` stacked attention states (:func:`check_state`): ``out_partials (n, ..., dim)``,
    ``lse_partials (n, ...)``."""
    check_state("out_partials", out_partials, "lse_partials", lse_partials)
    if out_partials.dim() < 2 or out_partials.shape[0] == 0:
        raise ValueError(
            f"out_partials must be (n, ..., dim) with n >= 1 states, got shape "
            f"{tuple(out_partials.shape)}"
        )


def check_state(out_name: str, out, lse_name: str, lse) -> None:
    """An attention state: ``lse.shape == out.shape[:-1]``, both floating point, same device."""
    if not isinstance(out, torch.Tensor) or not isinstance(lse, torch.Tensor):
        raise TypeError(
            f"{out_name} and {lse_name} must be torch.Tensors, got {type(out).__name__} and "
            f"{type(lse).__name__}"
        )
    if out.dim() < 1 or tuple(lse.shape) != tuple(out.shape[:-1]):
        raise ValueError(
            f"{lse_name} must have shape {out_name}.shape[:-1] = {tuple(out.shape[:-1])}, got "
            f"{tuple(lse.shape)}"
        )
    if (
        not (out.dtype.is_floating_point and lse.dtype.is_floating_point)
        or out.device != lse.device
    ):
        raise ValueError(
            f"{out_name} and {lse_name} must be floating point on one device, got {out.dtype} on "
            f"{out.device} and {lse.dtype} on {lse.device}"
        )


def _merge_states(states):
    """The fold of checked fp32 states ``[(out (..., dim), lse (...))]`` in their order,
    ``((s_0 ⊕ s_1) ⊕ s_2) ⊕ ...``: ``(out (..., dim), lse (...))``; one state is returned as is."""
    return reduce(lambda a, b: _merge_pair(*a, *b), states)


def _merge_pair(out_a, lse_a, out_b, lse_b):
    """The ⊕ of two checked fp32 states ``out (..., dim)``, ``lse (...)``: ``(out (..., dim), lse
    (...))``."""
    lse_a, lse_b = _no_plus_inf(lse_a), _no_plus_inf(lse_b)
    m = torch.maximum(lse_a, lse_b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both -inf: weights 0, not NaN
    w_a, w_b = torch.exp(lse_a - m_safe), torch.exp(lse_b - m_safe)
    total = w_a + w_b
    lse = m_safe + torch.log(total)  # log(0) = -inf for a row with no key on either side
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    out = (w_a * inv)[..., None] * out_a + (w_b * inv)[..., None] * out_b
    return out, lse


def _no_plus_inf(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(lse == float("inf"), torch.full_like(lse, float("-inf")), lse)
