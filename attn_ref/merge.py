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
"""

from __future__ import annotations

import torch


def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out_a, lse_a) ⊕ (out_b, lse_b)`` in fp32.

    Shapes: ``out_* (..., dim)``, ``lse_* (...)`` (= ``out.shape[:-1]``). Returns fp32 ``(out, lse)``.
    """
    lse_a = _no_plus_inf(lse_a.float())
    lse_b = _no_plus_inf(lse_b.float())
    m = torch.maximum(lse_a, lse_b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both -inf: weights 0, not NaN
    w_a, w_b = torch.exp(lse_a - m_safe), torch.exp(lse_b - m_safe)
    total = w_a + w_b
    lse = m_safe + torch.log(total)  # log(0) = -inf for a row with no key on either side
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    out = (w_a * inv)[..., None] * out_a.float() + (w_b * inv)[..., None] * out_b.float()
    return out, lse


def _no_plus_inf(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(lse == float("inf"), torch.full_like(lse, float("-inf")), lse)
