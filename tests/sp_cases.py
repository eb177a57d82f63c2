"""Shared pieces of the sequence-parallel tests across ranks (:mod:`test_sequence_parallel_ranks`,
:mod:`test_sp_backward`, :mod:`test_sp_dropin`): the call record :class:`Case`, the inputs of a case
and where each rank's tokens sit in the whole sequence, and the single-device references.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

import attn_ref
from attn_ref import sequence_parallel as sp
from backward_cases import dense_forward

#: Global (sharded) sequence length, replicated tokens, batch, head dim.
SEQ, N_REP, BATCH, HEAD_DIM = 16, 3, 2, 16


@dataclass(frozen=True)
class Case:
    """One SP call: a scheme on ``ulysses_degree x ring_degree`` ranks and its options.

    ``scheme``: "ulysses", "kv_gather", "auto" (UlyssesAttention modes), "ring" (ring_attention)
    or "usp". ``replicated``: "" or "suffix" (UlyssesAttention's replicated tensors), or "prefix",
    "suffix", "kv_prefix" (USPAttention's counts).
    """

    scheme: str
    ulysses_degree: int
    ring_degree: int
    gqa: bool = False
    causal: bool = False
    zigzag: bool = False
    replicated: str = ""
    varlen: bool = False
    dtype: str = "float32"

    @property
    def id(self) -> str:
        flags = [
            f"{self.scheme}{self.ulysses_degree}x{self.ring_degree}",
            "gqa" if self.gqa else "mha",
            "causal" if self.causal else "full",
            "zigzag" if self.zigzag else "",
            f"rep-{self.replicated}" if self.replicated else "",
            "varlen" if self.varlen else "",
            self.dtype if self.dtype != "float32" else "",
        ]
        return "-".join(f for f in flags if f)

    @property
    def heads(self) -> tuple[int, int]:
        """``(H, Hkv)``: divisible by the Ulysses degree, and GQA groups of 2."""
        h = max(4, 2 * self.ulysses_degree)
        return h, h // 2 if self.gqa else h


def _attention(q, k, v, causal):
    """Single-process reference: ``(out [B, S, H, D], lse [B, S, H])`` over the whole sequence."""
    out, lse = attn_ref.flash_attn_with_kvcache(q, k, v, causal=causal, return_softmax_lse=True)[:2]
    return out, lse.transpose(1, 2)


def _attention_lowp(q, k, v, causal):
    """The same attention computed in q's dtype (FA's ``upcast=False`` oracle), for the
    tolerance."""
    scale = q.shape[-1] ** -0.5
    return dense_forward(q, k, v, scale, upcast=False, causal=causal)[0]


def _full_inputs(case: Case) -> dict[str, torch.Tensor]:
    """The whole sequence (``q k v [B, SEQ, H|Hkv, D]``) and the replicated tokens (``N_REP``
    rows)."""
    gen = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))  # the same on every rank
    h, hkv = case.heads
    dtype = getattr(torch, case.dtype)

    def rand(rows, heads):
        return torch.randn(BATCH, rows, heads, HEAD_DIM, generator=gen).to(dtype)

    return dict(
        q=rand(SEQ, h),
        k=rand(SEQ, hkv),
        v=rand(SEQ, hkv),
        rq=rand(N_REP, h),
        rk=rand(N_REP, hkv),
        rv=rand(N_REP, hkv),
    )


def _global_sequence(case: Case, x: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of the single-device problem, replicated tokens placed where the scheme puts them."""
    if case.replicated == "prefix":
        return tuple(torch.cat([x["r" + n], x[n]], 1) for n in "qkv")
    if case.replicated == "suffix":
        return tuple(torch.cat([x[n], x["r" + n]], 1) for n in "qkv")
    if case.replicated == "kv_prefix":
        return x["q"], torch.cat([x["rk"], x["k"]], 1), torch.cat([x["rv"], x["v"]], 1)
    return x["q"], x["k"], x["v"]


def _varlen_lens(world: int) -> list[int]:
    """Unequal local lengths summing to SEQ: the first rank holds 3 more tokens, the second 3
    fewer."""
    lens = [SEQ // world] * world
    lens[0] += 3
    lens[1] -= 3
    return lens


def _my_positions(case: Case, groups: sp.SequenceParallelGroups) -> torch.Tensor:
    """Global positions of this rank's sharded tokens."""
    if case.varlen:
        lens = _varlen_lens(groups.sp_size)
        start = sum(lens[: groups.sp_rank])
        return torch.arange(start, start + lens[groups.sp_rank])
    return sp.shard_positions(
        SEQ, groups.sp_rank, case.ulysses_degree, case.ring_degree, case.zigzag
    )
