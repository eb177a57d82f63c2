"""The training problems: FA3's ``flash_attn_func`` forward and backward, against torch SDPA's.

One case is the attention of one training step on a batch of equal-length sequences::

    out = flash_attn_func(q, k, v, causal=causal)  # q (b, s, h, d), k and v (b, s, h_k, d)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)

timed as one call (:func:`flash_attn_step`), with every input made before the timer: the leaves q,
k, v (``requires_grad``) and the upstream gradient ``dout``. Any implementation of the entry point
takes the same step (``attn_ref.flash_attn_func`` on the CPU, ``kernels.flash_attn_func`` on a GPU).
SDPA's step (:func:`sdpa_step`) is ``F.scaled_dot_product_attention(q, k, v, is_causal=causal,
enable_gqa=True)`` on contiguous ``(b, h, s, d)`` leaves (``(b, h_k, s, d)`` for K/V: the KV heads
are not repeated) and the same ``torch.autograd.grad``. Both return ``(out, dq, dk, dv)`` in the
entry point's ``(b, s, heads, d)`` layout, so they can be compared.

Counts (FlashAttention's, as ``benchmarks/gpu_backward.py`` counts the backward):

* FLOPs: the forward's two matmuls, ``4 · B · H · S² · D``, and the backward's five, 2.5x that;
  a step is 3.5x the forward, halved for causal (:func:`training_flops`);
* bytes, the least traffic of a step: q, k, v and ``dout`` read, ``out``, ``dq``, ``dk``, ``dv``
  written, each once, and the fp32 LSE saved by the forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F

from .problems import DTYPES

#: ``() -> (out, dq, dk, dv)``, each ``(b, s, heads, d)``.
Step = Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class TrainingProblem:
    """One training step's attention: ``q (b, s, h, d)``, ``k``, ``v (b, s, h_k, d)``."""

    suite: ClassVar[str] = "training"

    seqlen: int
    dtype: str = "float32"
    causal: bool = True
    batch: int = 1
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128

    @property
    def label(self) -> str:
        return f"b={self.batch} s={self.seqlen} {'causal' if self.causal else 'full'}"

    def shape(self) -> dict:
        return {
            "batch": self.batch,
            "seqlen_q": self.seqlen,
            "seqlen_k": self.seqlen,
            "heads_q": self.heads_q,
            "heads_kv": self.heads_kv,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "causal": self.causal,
        }

    def flops(self) -> int:
        return training_flops(
            self.batch, self.heads_q, self.seqlen, self.seqlen, self.head_dim, self.causal
        )

    def bytes_moved(self) -> int:
        """q, out, dout, dq (``b · s · h · d`` each) and k, v, dk, dv (``b · s · h_k · d`` each)
        in the problem's dtype, and the fp32 LSE (``b · h · s``)."""
        b, s, d = self.batch, self.seqlen, self.head_dim
        e = torch.finfo(DTYPES[self.dtype]).bits // 8
        return 4 * e * b * s * (self.heads_q + self.heads_kv) * d + 4 * b * s * self.heads_q


def training_flops(
    batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool
) -> int:
    """FlashAttention's count of a forward and backward: ``3.5 · 4 · B · H · Sq · Sk · D``,
    halved for causal."""
    flops = 14 * batch * heads * seqlen_q * seqlen_k * head_dim  # 3.5 · 4 = 14
    return flops // 2 if causal else flops


@dataclass
class TrainingInputs:
    """The step's tensors in the entry point's layout: ``q``, ``dout (b, s, h, d)``, ``k``, ``v
    (b, s, h_k, d)``, in the problem's dtype, random normal."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor

    def nbytes(self) -> int:
        return sum(x.nbytes for x in (self.q, self.k, self.v, self.dout))


def make_inputs(problem: TrainingProblem, device: str, seed: int = 0) -> TrainingInputs:
    gen = torch.Generator(device=device).manual_seed(seed)
    b, s, d = problem.batch, problem.seqlen, problem.head_dim

    def randn(heads: int) -> torch.Tensor:
        x = torch.randn(b, s, heads, d, generator=gen, device=device)
        return x.to(DTYPES[problem.dtype])

    return TrainingInputs(
        randn(problem.heads_q), randn(problem.heads_kv), randn(problem.heads_kv),
        randn(problem.heads_q),
    )  # fmt: skip


def flash_attn_step(flash_attn_func: Callable, inputs: TrainingInputs, causal: bool) -> Step:
    """The step of an implementation of FA3's ``flash_attn_func``: its forward, then
    ``torch.autograd.grad`` of ``out`` with ``dout``. The leaves are made here, before any timer."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    dout = inputs.dout

    def step():
        out = flash_attn_func(q, k, v, causal=causal)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    return step


def sdpa_step(inputs: TrainingInputs, causal: bool, backend=None) -> tuple[Step, str]:
    """SDPA's step and its exact call: contiguous ``(b, heads, s, d)`` leaves made here (K/V with
    their ``h_k`` heads, ``enable_gqa=True``), under ``torch.nn.attention.sdpa_kernel(backend)``
    when a backend is named. If that backend refuses ``enable_gqa``, K/V are leaves with their
    heads repeated ahead of time and the step sums ``dk``/``dv`` over each group (the call says
    so)."""
    from torch.nn.attention import sdpa_kernel

    q, k, v, dout = (
        x.detach().transpose(1, 2).contiguous() for x in (inputs.q, inputs.k, inputs.v, inputs.dout)
    )  # (b, heads, s, d)
    group = q.shape[1] // k.shape[1]

    def attend(*leaves, **gqa):
        if backend is None:
            return F.scaled_dot_product_attention(*leaves, is_causal=causal, **gqa)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(*leaves, is_causal=causal, **gqa)

    leaves = tuple(x.requires_grad_() for x in (q, k, v))
    try:
        attend(*leaves, enable_gqa=True)
    except RuntimeError:  # this backend does not take GQA: repeat the KV heads before the timer
        leaves = (q, *(x.detach().repeat_interleave(group, 1).requires_grad_() for x in (k, v)))

        def step():
            out = attend(*leaves)
            dq, dk, dv = torch.autograd.grad(out, leaves, dout)
            dk, dv = (x.unflatten(1, (-1, group)).sum(2) for x in (dk, dv))
            return tuple(x.transpose(1, 2) for x in (out, dq, dk, dv))

        return step, (
            f"F.scaled_dot_product_attention(q, k, v, is_causal={causal}) with K/V heads repeated "
            "(the backend refused enable_gqa), dk/dv summed over each group, then "
            "torch.autograd.grad(out, (q, k, v), dout)"
        )

    def step():
        out = attend(*leaves, enable_gqa=True)
        return tuple(x.transpose(1, 2) for x in (out, *torch.autograd.grad(out, leaves, dout)))

    return step, (
        f"out = F.scaled_dot_product_attention(q, k, v, is_causal={causal}, enable_gqa=True); "
        "torch.autograd.grad(out, (q, k, v), dout)  # leaves (b, h, s, d), K/V (b, h_k, s, d)"
    )


def max_difference(got, expected) -> float:
    """The largest ``|got - expected|`` over ``(out, dq, dk, dv)``."""
    return max((g.float() - e.float()).abs().max().item() for g, e in zip(got, expected))
