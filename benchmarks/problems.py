"""The benchmarked problems: shapes, inputs, and the byte and FLOP counts the figures are made of.

Every problem is one ``flash_attn_with_kvcache`` call over a paged KV cache (page size ``P``, the
pages of all sequences shuffled by a random permutation) in which each of the ``b`` sequences holds
``seqlen_k`` tokens, built by the tests' case factory (:mod:`benchmarks.calls`; the tests run every
benchmarked problem, scaled down, through both implementations against their oracle):

* **decode**: ``seqlen_q = 1``, no mask (the new token sees its whole context);
* **ragged decode** (``ragged=True``): the same, but sequence ``i`` holds ``(i + 1) / b`` of
  ``seqlen_k`` tokens (:meth:`Problem.seqlens_k`), so a dense baseline needs a padding mask;
* **prefill**: ``seqlen_q = seqlen_k``, causal (the prompt's keys are already in the cache).

Torch SDPA gets the same logical problem: K/V gathered from the pages into dense tensors ahead of
time (not timed), in SDPA's ``(b, h_k, seq, d)`` layout with the KV heads not repeated
(:func:`dense_kv`; SDPA's ``enable_gqa=True`` maps the query heads), and a mask only where the
problem needs one (:func:`sdpa_mask`: ragged lengths).

Counts (``h`` / ``h_k`` query / KV heads, ``d`` / ``dv`` head dims, ``e`` bytes per element):

* bytes, the least traffic a call needs (each input read once, the output written once), as in
  FlashAttention's ``hopper/benchmark_mla_decode.py``::

      K + V   = Σ_i seqlen_k(i) * h_k * (d + dv) * e      (b * seqlen_k * ... unless ragged)
      q + out = b * seqlen_q * h * (d + dv) * e
      indices = page_table (b * ceil(seqlen_k / P) * 4) + cache_seqlens (b * 4)

* FLOPs, two matmuls of ``2 * m * n * k`` each (the Triton tutorial's count)::

      flops = 2 * h * seqlen_q * Σ_i seqlen_k(i) * (d + dv) * visible

  with ``visible = 0.5`` for causal ``seqlen_q == seqlen_k`` (the tutorial's and FlashAttention's
  convention) and 1 otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from attn_ref import AttentionMask, paged_to_dense

from .calls import make_case

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Problem:
    """One benchmarked ``flash_attn_with_kvcache`` call (GQA: ``heads_q`` a multiple of
    ``heads_kv``)."""

    suite: str  # "decode" or "prefill"
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128
    page_size: int = 64
    dtype: str = "bfloat16"
    ragged: bool = False  # sequence i holds (i + 1) / b of seqlen_k tokens (decode only)

    @property
    def causal(self) -> bool:
        return self.suite == "prefill"

    @property
    def label(self) -> str:
        label = f"b={self.batch} sk={self.seqlen_k}" + (
            f" sq={self.seqlen_q}" if self.seqlen_q > 1 else ""
        )
        return ("ragged " if self.ragged else "") + label

    @property
    def element_size(self) -> int:
        return torch.finfo(DTYPES[self.dtype]).bits // 8

    @property
    def pages_per_sequence(self) -> int:
        return -(-self.seqlen_k // self.page_size)

    def seqlens_k(self) -> list[int]:
        """Tokens of each sequence: ``seqlen_k`` each, or ``seqlen_k * (i + 1) // b`` when
        ragged."""
        if not self.ragged:
            return [self.seqlen_k] * self.batch
        return [self.seqlen_k * (i + 1) // self.batch for i in range(self.batch)]

    def shape(self) -> dict:
        return {**asdict(self), "causal": self.causal}

    def case(self) -> dict:
        """Keyword arguments of :func:`benchmarks.calls.make_case` that build this problem: every
        sequence holds ``seqlen_k`` tokens in pages of ``page_size``."""
        return dict(
            batch=self.batch,
            seqlen_q=self.seqlen_q,
            capacity=self.seqlen_k,
            cached_tokens=self.seqlen_k,
            heads=self.heads_q,
            heads_k=self.heads_kv,
            d=self.head_dim,
            page_size=self.page_size,
            dtype=DTYPES[self.dtype],
            causal=self.causal,
        )

    def bytes_moved(self) -> int:
        """Least device-memory traffic of one call (see the module docstring)."""
        b, e, d = self.batch, self.element_size, self.head_dim
        kv = sum(self.seqlens_k()) * self.heads_kv * (d + d) * e
        q_and_out = b * self.seqlen_q * self.heads_q * (d + d) * e
        indices = b * self.pages_per_sequence * 4 + b * 4
        return kv + q_and_out + indices

    def flops(self) -> int:
        """Matmul FLOPs of one call (see the module docstring)."""
        visible = 0.5 if self.causal else 1.0
        d = self.head_dim
        return int(2 * self.heads_q * self.seqlen_q * sum(self.seqlens_k()) * (d + d) * visible)


def decode(batch: int, context: int, dtype: str = "bfloat16", ragged: bool = False) -> Problem:
    return Problem("decode", batch, 1, context, dtype=dtype, ragged=ragged)


def prefill(batch: int, seqlen: int, dtype: str = "bfloat16") -> Problem:
    return Problem("prefill", batch, seqlen, seqlen, dtype=dtype)


@dataclass
class KVCacheInputs:
    """Arguments of ``flash_attn_with_kvcache`` for a :class:`Problem`.

    ``q (b, sq, h, d)``; ``k_cache``, ``v_cache`` ``(num_pages, P, h_k, d)``; ``page_table
    (b, pages_per_sequence)`` int32, distinct pages in random order (``num_pages`` has 3 spare);
    ``cache_seqlens (b,)`` int32.
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    page_table: torch.Tensor
    cache_seqlens: torch.Tensor
    causal: bool

    def kwargs(self) -> dict:
        return {
            "q": self.q,
            "k_cache": self.k_cache,
            "v_cache": self.v_cache,
            "page_table": self.page_table,
            "cache_seqlens": self.cache_seqlens,
            "causal": self.causal,
        }

    def nbytes(self) -> int:
        return sum(
            t.nbytes
            for t in (self.q, self.k_cache, self.v_cache, self.page_table, self.cache_seqlens)
        )


def make_inputs(problem: Problem, device: str, seed: int = 0) -> KVCacheInputs:
    """The problem's call built by the tests' case factory (:func:`benchmarks.calls.make_case` on
    :meth:`Problem.case`): random normal q / K / V (never zeros: they hide indexing bugs) in a
    shuffled paged cache with a few spare pages."""
    args = make_case(**problem.case(), seed=seed, device=device)
    if problem.ragged:
        args["cache_seqlens"] = torch.tensor(problem.seqlens_k(), dtype=torch.int32, device=device)
    return KVCacheInputs(
        args["q"],
        args["k_cache"],
        args["v_cache"],
        args["page_table"],
        args["cache_seqlens"],
        problem.causal,
    )


def dense_kv(
    inputs: KVCacheInputs, seqlen_k: int, expand_gqa: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V gathered from the pages: ``(b, h_k, sk, d)``, or ``(b, h, sk, d)`` with each KV head
    repeated for its ``h / h_k`` query heads (query head ``j`` reads KV head ``j // (h / h_k)``)."""
    heads_q = inputs.q.shape[2]

    def gather(cache: torch.Tensor) -> torch.Tensor:
        # (b, h_k, sk, d)
        x = paged_to_dense(cache, inputs.page_table)[:, :seqlen_k].transpose(1, 2)
        if not expand_gqa:
            return x.contiguous()
        b, h_k, sk, d = x.shape
        return x[:, :, None].expand(b, h_k, heads_q // h_k, sk, d).reshape(b, heads_q, sk, d)

    return gather(inputs.k_cache), gather(inputs.v_cache)


def sdpa_mask(problem: Problem, device: str) -> torch.Tensor:
    """The explicit boolean mask ``(b, 1, sq, sk)`` of the problem (True = visible): bottom-right
    causal, and each sequence's keys only up to its length (:meth:`Problem.seqlens_k`)."""
    lengths = torch.tensor(problem.seqlens_k(), device=device)
    in_sequence = torch.arange(problem.seqlen_k, device=device) < lengths[:, None]  # (b, sk)
    mask = AttentionMask(causal=problem.causal)
    visible = mask.visible_keys(problem.seqlen_q, problem.seqlen_k, device=device)  # (sq, sk)
    return visible[None, None] & in_sequence[:, None, None, :]
