"""The local operations every sequence-parallel scheme is built from, as one swappable parameter.

Ulysses, K/V gather, ring and USP only *move* tensors between ranks. The arithmetic happens in a few
local operations, and an :class:`AttentionBackend` names the implementation of each:

* **attend** ``(q, k, v, softmax_scale, mask) -> (out, lse)``: attention of ``q [b, s_q, h, d]``
  over ``k [b, s_k, h_k, d]``, ``v [b, s_k, h_k, d_v]`` (GQA: query head ``head`` reads KV
  head ``head // g``, ``g = h / h_k``), computed by ``flash_attn_with_kvcache(q, k_cache=k,
  v_cache=v, return_softmax_lse=True)`` with K/V as a dense cache and no ``cache_seqlens`` (every
  key valid). ``mask`` is an :class:`~attn_ref.masks.AttentionMask`, **bottom-right aligned**
  (causal: query row ``i`` sees keys ``j <= i + s_k - s_q``). Returns ``out [b, s_q, h, d_v]`` in
  q's dtype and ``lse [b, s_q, h]`` fp32 (natural log, ``-inf`` for a row that sees no key): the
  state layout, ``lse.shape == out.shape[:-1]``, which ``merge`` takes; the backend converts from
  and to FA's ``(b, h, s_q)`` at its calls.
* **merge** ``(out_a, lse_a, out_b, lse_b) -> (out, lse)``: the ⊕ of two attention states over
  disjoint key sets, ``lse = logaddexp(lse_a, lse_b)``, ``out = e^{lse_a - lse} out_a +
  e^{lse_b - lse} out_b``, in fp32 (``merge_attention_states``; ``lse.shape == out.shape[:-1]``).
* **attend_backward** ``(dout, q, k, v, out, lse, softmax_scale, mask, dlse) -> (dq, dk, dv)``:
  the gradients of ``attend`` from its saved output and LSE (``attention_backward``, see
  :mod:`attn_ref.backward`), in fp32 so that callers (the ring) accumulate in fp32. ``out``/``lse``
  may be the *final* state of a query row after merges: a block's gradients are then its exact
  share.

``attend`` is differentiable (an autograd Function whose backward is ``attend_backward``); a backend
without ``attention_backward`` computes forward only and refuses the backward.

:data:`REFERENCE_BACKEND` binds them to :mod:`attn_ref`; :mod:`kernels.sequence_parallel` binds the
same SP code to the Triton kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.autograd.function import once_differentiable

from ..backward import attention_backward
from ..flash_attn import flash_attn_varlen_func
from ..kvcache import flash_attn_with_kvcache
from ..masks import AttentionMask
from ..merge import merge_attention_states


@dataclass(frozen=True)
class AttentionBackend:
    """Local attention + merge used by the SP schemes (see the module docstring for the contract).

    Attributes:
        name: label shown in reprs and test ids.
        flash_attn_with_kvcache: a function with sglang's ``flash_attn_with_kvcache`` API that
            supports ``return_softmax_lse=True`` (LSE ``[b, h, s_q]``).
        merge_attention_states: ``(out_a, lse_a, out_b, lse_b) -> (out, lse)`` in fp32.
        attention_backward: :func:`attn_ref.attention_backward`'s API, or None (forward only: a
            backward through this backend raises ``NotImplementedError``).
        flash_attn_varlen_func: FA3's ``flash_attn_varlen_func`` (differentiable, with
            ``return_attn_probs``), the local attention of the llama3 schedule (:mod:`.llama3`), or
            None (no llama3 entry point on this backend).
    """

    name: str
    flash_attn_with_kvcache: Callable
    merge_attention_states: Callable
    attention_backward: Optional[Callable] = None
    flash_attn_varlen_func: Optional[Callable] = None

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        softmax_scale: float,
        mask: AttentionMask,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out [b, s_q, h, d_v] in q's dtype, lse [b, s_q, h] fp32)`` of q over all of k/v;
        differentiable."""
        return _Attend.apply(self, q, k, v, softmax_scale, mask)

    def attend_forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        softmax_scale: float,
        mask: AttentionMask,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`attend` without autograd (the ring's forward loop calls it inside its own
        Function)."""
        out, lse, *_ = self.flash_attn_with_kvcache(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            softmax_scale=softmax_scale,
            **mask.options(),
            return_softmax_lse=True,
        )
        return out, lse.transpose(1, 2)  # [b, h, s_q] -> [b, s_q, h], the layout of out[..., 0]

    def attend_backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        softmax_scale: float,
        mask: AttentionMask,
        dlse: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 ``(dq [b, s_q, h, d], dk [b, s_k, h_k, d], dv [b, s_k, h_k, d_v])`` of
        :meth:`attend`.

        ``out``/``lse`` (``[b, s_q, h, d_v]`` / ``[b, s_q, h]``) are the rows' saved (final) state
        and ``dout``/``dlse`` their gradients (``dlse`` None: no gradient flows into the LSE).
        """
        check_backward_available(self.name, self.attention_backward)
        return self.attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse.transpose(1, 2),
            softmax_scale,
            mask,
            dlse=None if dlse is None else dlse.transpose(1, 2),
            grad_dtype=torch.float32,
        )

    def merge(
        self, out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out_a, lse_a) ⊕ (out_b, lse_b)``: fp32 ``(out [..., d_v], lse [...])``."""
        return self.merge_attention_states(out_a, lse_a, out_b, lse_b)


class _Attend(torch.autograd.Function):
    """:meth:`AttentionBackend.attend` with :meth:`AttentionBackend.attend_backward` as its
    backward."""

    @staticmethod
    def forward(ctx, backend: AttentionBackend, q, k, v, softmax_scale: float, mask: AttentionMask):
        out, lse = backend.attend_forward(q, k, v, softmax_scale, mask)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.backend, ctx.softmax_scale, ctx.mask = backend, softmax_scale, mask
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.backend.attend_backward(
            dout, q, k, v, out, lse, ctx.softmax_scale, ctx.mask, dlse
        )
        return None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


#: The PyTorch reference: :func:`attn_ref.flash_attn_with_kvcache`,
#: :func:`attn_ref.merge_attention_states`, :func:`attn_ref.attention_backward` and
#: :func:`attn_ref.flash_attn_varlen_func`.
REFERENCE_BACKEND = AttentionBackend(
    "attn_ref",
    flash_attn_with_kvcache,
    merge_attention_states,
    attention_backward,
    flash_attn_varlen_func,
)


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_backward_available(backend_name: str, attention_backward: object) -> None:
    """A gradient needs the backend's ``attention_backward`` (never another backend's numerics in
    its place).

    Raised on every rank at the same point of the backward (the first local attention backward), so
    no rank is left waiting in a collective.
    """
    if attention_backward is None:
        raise NotImplementedError(
            f"the {backend_name!r} attention backend has no backward (attention_backward=None), so "
            "no gradient can flow through its sequence-parallel attention; train with "
            "attn_ref.sequence_parallel (the PyTorch reference backward), or build the "
            "AttentionBackend with an attention_backward"
        )
