"""What :class:`~.ulysses.UlyssesAttention` and :class:`~.usp.USPAttention` share as attention
layers.

Both take sglang's leading constructor arguments (``num_heads, head_size, num_kv_heads,
softmax_scale, causal, supported_attention_backends, prefix``, in sglang's order), check them alike,
keep them as attributes, check q/k/v against them, and compute with the local operations of their
class attribute
:attr:`SequenceParallelAttention.backend`, which :mod:`kernels.sequence_parallel` rebinds to the
Triton kernels.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .backend import REFERENCE_BACKEND, AttentionBackend
from .checks import check_attention_inputs, check_positive_int


class SequenceParallelAttention(torch.nn.Module):
    """The base of the sequence-parallel attention layers: sglang's head arguments and the
    backend."""

    #: Local attention + merge; :mod:`kernels.sequence_parallel` rebinds it to the Triton kernels.
    backend: AttentionBackend = REFERENCE_BACKEND

    def _set_heads(
        self,
        num_heads: int,
        head_size: int,
        num_kv_heads: Optional[int],
        softmax_scale: Optional[float],
        causal: bool,
        supported_attention_backends: Optional[set],
        prefix: str,
        extra_impl_args: dict,
    ) -> None:
        """sglang's arguments, checked (:func:`check_head_config`) and kept as attributes.

        ``num_kv_heads`` defaults to ``num_heads`` (``h % h_k == 0``, GQA), ``softmax_scale`` to
        ``head_size ** -0.5``; the backends, prefix and extra arguments are kept, not used.
        """
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_head_config(num_heads, head_size, num_kv_heads, softmax_scale)
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.softmax_scale = head_size**-0.5 if softmax_scale is None else softmax_scale
        self.causal = causal
        self.supported_attention_backends, self.prefix, self.extra_impl_args = (
            supported_attention_backends,
            prefix,
            extra_impl_args,
        )

    def _check_inputs(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_extra_rows: int = 0
    ) -> None:
        """q ``[b, S / P, h, d]``, k/v ``[b, S / P + kv_extra_rows, h_k, d|d_v]`` fit each other and
        the layer's heads."""
        check_attention_inputs(q, k, v, kv_extra_rows=kv_extra_rows)
        check_declared_heads(q, k, self.num_heads, self.num_kv_heads, self.head_size)


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_head_config(
    num_heads: object, head_size: object, num_kv_heads: object, softmax_scale: object
) -> None:
    """Constructor arguments shared by :class:`UlyssesAttention` and :class:`USPAttention`."""
    check_positive_int("num_heads", num_heads)
    check_positive_int("head_size", head_size)
    check_positive_int("num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"Query heads ({num_heads}) must be divisible by KV heads ({num_kv_heads})."
        )
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(
                f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}"
            )
        if not (math.isfinite(softmax_scale) and softmax_scale > 0):
            raise ValueError(
                f"softmax_scale must be a finite number > 0 or None, got {softmax_scale}"
            )


def check_declared_heads(
    q: torch.Tensor, k: torch.Tensor, num_heads: int, num_kv_heads: int, head_size: int
) -> None:
    """The tensors match the module's ``num_heads``, ``num_kv_heads`` and ``head_size``."""
    if q.shape[2] != num_heads or k.shape[2] != num_kv_heads:
        raise ValueError(
            f"q must have num_heads={num_heads} and k, v num_kv_heads={num_kv_heads} heads (dim "
            "2), "
            f"got q {q.shape[2]} and k {k.shape[2]}"
        )
    if q.shape[3] != head_size:
        raise ValueError(f"q and k must have head_size={head_size} (dim 3), got {q.shape[3]}")
