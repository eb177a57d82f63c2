"""The two local operations every sequence-parallel scheme is built from, as one swappable parameter.

Ulysses, K/V gather, ring and USP only *move* tensors between ranks. The arithmetic happens in two
local operations, and an :class:`AttentionBackend` names the implementation of each:

* **attend** ``(q, k, v, softmax_scale, causal) -> (out, lse)``: attention of ``q [B, Sq, H, D]``
  over ``k [B, Sk, Hkv, D]``, ``v [B, Sk, Hkv, Dv]`` (GQA: query head ``h`` reads KV head
  ``h // (H / Hkv)``), computed by ``flash_attn_with_kvcache(q, k_cache=k, v_cache=v,
  return_softmax_lse=True)`` with K/V as a dense cache and no ``cache_seqlens`` (every key valid).
  ``causal`` is **bottom-right aligned**: query row ``i`` sees keys ``j <= i + Sk - Sq``. Returns
  ``out [B, Sq, H, Dv]`` in q's dtype and ``lse [B, Sq, H]`` fp32 (natural log, ``-inf`` for a row
  that sees no key).
* **merge** ``(out_a, lse_a, out_b, lse_b) -> (out, lse)``: the ⊕ of two attention states over
  disjoint key sets, ``lse = logaddexp(lse_a, lse_b)``, ``out = e^{lse_a - lse} out_a +
  e^{lse_b - lse} out_b``, in fp32 (``merge_attention_states``; ``lse.shape == out.shape[:-1]``).

:data:`REFERENCE_BACKEND` binds them to :mod:`attn_ref`; :mod:`kernels.sequence_parallel` binds the
same SP code to the Triton kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..kvcache import flash_attn_with_kvcache
from ..merge import merge_attention_states


@dataclass(frozen=True)
class AttentionBackend:
    """Local attention + merge used by the SP schemes (see the module docstring for the contract).

    Attributes:
        name: label shown in reprs and test ids.
        flash_attn_with_kvcache: a function with sglang's ``flash_attn_with_kvcache`` API that
            supports ``return_softmax_lse=True`` (LSE ``[B, H, Sq]``).
        merge_attention_states: ``(out_a, lse_a, out_b, lse_b) -> (out, lse)`` in fp32.
    """

    name: str
    flash_attn_with_kvcache: Callable
    merge_attention_states: Callable

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out [B, Sq, H, Dv] in q's dtype, lse [B, Sq, H] fp32)`` of q over all of k/v."""
        out, lse, *_ = self.flash_attn_with_kvcache(
            q.contiguous(), k.contiguous(), v.contiguous(),
            softmax_scale=softmax_scale, causal=causal, return_softmax_lse=True,
        )
        return out, lse.transpose(1, 2)  # [B, H, Sq] -> [B, Sq, H], the layout of out[..., 0]

    def merge(
        self, out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out_a, lse_a) ⊕ (out_b, lse_b)``: fp32 ``(out [..., Dv], lse [...])``."""
        return self.merge_attention_states(out_a, lse_a, out_b, lse_b)


#: The PyTorch reference: :func:`attn_ref.flash_attn_with_kvcache` + :func:`attn_ref.merge_attention_states`.
REFERENCE_BACKEND = AttentionBackend("attn_ref", flash_attn_with_kvcache, merge_attention_states)
