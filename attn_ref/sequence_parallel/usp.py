"""``USPAttention``: Ulysses inside a group of ``U`` ranks x ring across ``R`` such groups.

With the groups of :mod:`.groups` (Ulysses contiguous, ring strided) and the token layout of
:mod:`.layout`, SP rank ``(g, u)`` holds part ``u`` of ring block ``g``. One call:

1. **All-to-all in** over the Ulysses group: ``[b, S / P, h, d] -> [b, S / R, h / U, d]``. Member
   ``u`` now holds the whole ring block ``g`` for heads ``[u·h / U, (u+1)·h / U)``, and its ring
   peers (same ``u``, other ``g``) hold the same heads of the other blocks: the ring's precondition.
2. **Ring attention** over the ring group (``R > 1``, :mod:`.ring`, contiguous or zigzag blocks),
   or one local call (``R == 1``).
3. **All-to-all out**: ``[b, S / R, h / U, d] -> [b, S / P, h, d]``.

Constraints: ``h % U == 0`` and ``h_k % U == 0`` (not ``% (U·R)``: the ring lets ``P`` exceed the
head count); equal shapes on every rank.

**Replicated tokens** (one mode per call), counted once, as part of the rows of q/k/v that every
rank holds identically:

* ``num_replicated_prefix = n``: the first ``n`` rows of q, k, v (a text prefix);
* ``num_replicated_suffix = n``: the last ``n`` rows of q, k, v;
* ``num_replicated_kv_prefix = n``: ``n`` extra first rows of k and v only (cached text K/V; q has
  no replicated rows).

They skip the all-to-all; each rank takes its heads' slice, attends them once (never rotated in the
ring: their K/V state is merged in through ⊕), and the replicated output is rebuilt over heads with
an all-gather in the Ulysses group. The result equals single-device attention over
``[prefix, shard_0, ..., shard_{P-1}]`` (or ``[shards..., suffix]``), causal or not.

**Backward.** Differentiable end to end: the all-to-alls' adjoints are the inverse all-to-alls, the
ring has its ring backward (:mod:`.ring`), the replicated output's all-gather a reduce-scatter.
Replicated rows follow :mod:`.replicated`: every rank passes the same gradient for them and gets
the full gradient of its replicated q/k/v rows.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..error_notes import catalogued
from ..masks import AttentionMask
from .agreement import describe, run_checks_on_every_rank
from .checks import (
    check_4d,
    check_no_dropout,
    check_tensors,
    check_usp_heads_split,
    check_zigzag_rows,
)
from .comm import all_gather, all_to_all_4d, all_to_all_4d_packed, heads_of_rank
from .groups import SequenceParallelGroups, layout_of as _layout
from .layer import SequenceParallelAttention
from .replicated import replicated_input, replicated_output
from .ring import PREFIX_POSITION, SUFFIX_POSITION, Chunk, block_chunks, ring_attention_states


class USPAttention(SequenceParallelAttention):
    """Unified sequence parallelism (Ulysses x ring), see the module docstring.

    The positional arguments and ``**extra_impl_args`` are sglang's, in sglang's order; the
    keyword-only ``groups`` and ``zigzag`` are this package's.

    Args:
        num_heads: query heads ``h``.
        head_size: head dim ``d``.
        num_kv_heads: ``h_k`` (default ``h``; ``h % h_k == 0``, GQA).
        softmax_scale: default ``head_size ** -0.5``.
        causal: causal attention over the global sequence.
        supported_attention_backends: accepted and kept as an attribute; in sglang it chooses the
            local attention backend, here :attr:`backend` does.
        prefix: accepted and kept as an attribute (sglang's layer name).
        dropout_rate: must be 0 (attention dropout is not implemented; ``NotImplementedError``).
        skip_sequence_parallel: K/V that every rank holds whole (cross-attention to encoder
            outputs): each rank's local queries attend the local K/V, with no exchange.
        groups: the SP layout (:func:`init_sequence_parallel_groups`); default: Ulysses over the
            whole default group (``R = 1``), or a single rank without ``torch.distributed``.
        zigzag: the tokens are sharded zigzag (:func:`shard_sequence` with ``zigzag=True``), which
            balances the causal ring; otherwise contiguous.
        **extra_impl_args: accepted and kept as the attribute ``extra_impl_args`` (sglang passes
            them to its backend).
    """

    @catalogued
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        num_kv_heads: Optional[int] = None,
        softmax_scale: Optional[float] = None,
        causal: bool = False,
        supported_attention_backends: Optional[set] = None,
        prefix: str = "",
        dropout_rate: float = 0.0,
        skip_sequence_parallel: bool = False,
        *,
        groups: Optional[SequenceParallelGroups] = None,
        zigzag: bool = False,
        **extra_impl_args: object,
    ):
        super().__init__()
        self._set_heads(
            num_heads,
            head_size,
            num_kv_heads,
            softmax_scale,
            causal,
            supported_attention_backends,
            prefix,
            extra_impl_args,
        )
        check_no_dropout("dropout_rate", dropout_rate)
        self.dropout_p = dropout_rate
        self.skip_sequence_parallel = skip_sequence_parallel
        self.groups = SequenceParallelGroups.from_world() if groups is None else groups
        self.zigzag = zigzag

    @catalogued
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        num_replicated_prefix: int = 0,
        num_replicated_suffix: int = 0,
        num_replicated_kv_prefix: int = 0,
        skip_sequence_parallel_override: bool = False,
        *,
        return_softmax_lse: bool = False,
    ):
        """Attention of this rank's rows of q over the whole sequence.

        Args:
            q: ``[b, S / P, h, d]``: this rank's shard of the queries, with the replicated rows (if
                any) at the start or the end.
            k: ``[b, S / P + num_replicated_kv_prefix, h_k, d]``: this rank's shard of the keys.
            v: ``[b, S / P + num_replicated_kv_prefix, h_k, d]``: this rank's shard of the values.
            attn_mask: sglang's padding mask; not supported here (must be None), kept in the
                signature so that positional calls line up with sglang's.
            num_replicated_prefix: leading rows of q, k and v that every rank holds whole (see the
                module docstring); at most one of the three counts is non-zero.
            num_replicated_suffix: trailing rows of q, k and v that every rank holds whole.
            num_replicated_kv_prefix: leading rows of k and v only that every rank holds whole.
            skip_sequence_parallel_override: this call only, as ``skip_sequence_parallel=True``: q
                attends k/v ``[b, s_k, h_k, d]`` (any length) locally, and the counts are ignored,
                as in sglang. A single rank (SP size 1) does the same.
            return_softmax_lse: also return the LSE ``[b, S / P, h]`` (fp32).

        Returns:
            ``out [b, S / P, h, d]`` in q's dtype (and ``lse`` when asked).
        """
        counts = (num_replicated_prefix, num_replicated_suffix, num_replicated_kv_prefix)
        if (
            self.skip_sequence_parallel
            or skip_sequence_parallel_override
            or self.groups.sp_size == 1
        ):
            # sglang's order: skip or a single rank is local attention, before the replicated counts
            # are read (on one rank the replicated rows are ordinary rows of q, k, v; the result is
            # the same).
            self._check_local_call(q, k, v, attn_mask)
            return self._local(q, k, v, return_softmax_lse)
        fields = dict(
            causal=self.causal,
            zigzag=self.zigzag,
            softmax_scale=self.softmax_scale,
            heads=(self.num_heads, self.num_kv_heads, self.head_size),
            layout=_layout(self.groups),
            q=describe(q),
            k=describe(k),
            v=describe(v),
            attn_mask=describe(attn_mask),
            counts=tuple(describe(n) for n in counts),
            return_softmax_lse=return_softmax_lse,
        )
        run_checks_on_every_rank(
            self.groups.sp_group,
            "USPAttention.forward",
            fields,
            lambda: self._check_call(q, k, v, attn_mask, *counts),
        )

        position = SUFFIX_POSITION if num_replicated_suffix else PREFIX_POSITION
        q_rep_rows = num_replicated_prefix + num_replicated_suffix
        q_rep, q_shard = _split_replicated(q, q_rep_rows, position)
        (k_rep, k_shard), (v_rep, v_shard) = (
            _split_replicated(x, q_rep_rows + num_replicated_kv_prefix, position) for x in (k, v)
        )
        group, u_rank, u_degree = (
            self.groups.ulysses_group,
            self.groups.ulysses_rank,
            self.groups.ulysses_degree,
        )
        # [b, S / P, h, d] -> [b, S / R, h / U, d]: the ring block, this rank's heads.
        q_shard, k_shard, v_shard = all_to_all_4d_packed([q_shard, k_shard, v_shard], 2, 1, group)
        sp_group = self.groups.sp_group  # replicated inputs: the gradient sums every rank's share
        q_rep, k_rep, v_rep = (
            heads_of_rank(replicated_input(x, sp_group), u_rank, u_degree)
            for x in (q_rep, k_rep, v_rep)
        )

        out, lse = self._attend(q_rep, q_shard, k_rep, k_shard, v_rep, v_shard, position)
        out = out.to(q.dtype)
        rep_rows, shard_rows = _replicated_rows(q_rep.shape[1], q_shard.shape[1], position)
        # [b, S / R, h / U, d] -> [b, S / P, h, d], and the replicated rows' heads from the Ulysses
        # group.
        out = _heads_to_tokens(out, rep_rows, shard_rows, position, group, sp_group)
        if not return_softmax_lse:
            return out
        return out, _heads_to_tokens(
            lse[..., None], rep_rows, shard_rows, position, group, sp_group
        )[..., 0]

    def _check_call(
        self,
        q,
        k,
        v,
        attn_mask,
        num_replicated_prefix,
        num_replicated_suffix,
        num_replicated_kv_prefix,
    ):
        """sglang's order where it has the check (modes, then ``usp.py``'s heads assert), then this
        package's."""
        check_tensors(q=q, k=k, v=v)
        check_4d(q=q, k=k, v=v)
        check_no_attn_mask(attn_mask)
        check_replicated_modes(
            num_replicated_prefix, num_replicated_suffix, num_replicated_kv_prefix
        )
        u_degree = self.groups.ulysses_degree
        if u_degree > 1:  # usp.py's all-to-all returns its input on one rank, before its asserts
            check_usp_heads_split(q.shape[2], u_degree)
            # k's all-to-all asserts the same on its heads
            check_usp_heads_split(k.shape[2], u_degree)
        self._check_inputs(q, k, v, kv_extra_rows=num_replicated_kv_prefix)
        if num_replicated_prefix:
            check_replicated_fits("num_replicated_prefix", num_replicated_prefix, q.shape[1])
        if num_replicated_suffix:
            check_replicated_fits("num_replicated_suffix", num_replicated_suffix, q.shape[1])
        if self.zigzag:
            q_rep_rows = num_replicated_prefix + num_replicated_suffix
            check_zigzag_rows(
                u_degree * (q.shape[1] - q_rep_rows), "ulysses_degree x sharded rows per rank"
            )

    def _check_local_call(self, q, k, v, attn_mask):
        """Skip or one rank: q ``[b, S / P, h, d]`` over k, v ``[b, s_k, h_k, d]`` of any length."""
        check_tensors(q=q, k=k, v=v)
        check_4d(q=q, k=k, v=v)
        check_no_attn_mask(attn_mask)
        check_kv_lengths(k, v)
        self._check_inputs(q, k, v, kv_extra_rows=k.shape[1] - q.shape[1])

    def _local(self, q, k, v, with_lse):
        """Local attention of q over k/v: no collective (bottom-right causal when ``causal``)."""
        out, lse = self.backend.attend(
            q, k, v, self.softmax_scale, AttentionMask(causal=self.causal)
        )
        return (out, lse) if with_lse else out

    def _attend(self, q_rep, q_shard, k_rep, k_shard, v_rep, v_shard, position):
        """State ``(out, lse)`` of ``[q_rep, q_shard]`` (in sequence order) over the whole
        sequence."""
        q = _join_replicated(q_rep, q_shard, position)
        if self.groups.ring_degree == 1:
            # One call: the K/V of the ring block and the replicated tokens, in sequence order.
            k, v = (
                _join_replicated(k_rep, k_shard, position),
                _join_replicated(v_rep, v_shard, position),
            )
            return self.backend.attend(
                q, k, v, self.softmax_scale, AttentionMask(causal=self.causal)
            )
        ring_size, ring_rank, rows = (
            self.groups.ring_degree,
            self.groups.ring_rank,
            q_shard.shape[1],
        )
        rep_rows, shard_rows = _replicated_rows(q_rep.shape[1], rows, position)
        q_chunks = block_chunks(ring_rank, ring_size, rows, self.zigzag, offset=shard_rows.start)
        if q_rep.shape[1]:
            q_chunks += (Chunk(rep_rows, position),)
        fixed_kv = (
            (k_rep, v_rep, (Chunk(slice(0, k_rep.shape[1]), position),)) if k_rep.shape[1] else None
        )
        return ring_attention_states(
            q,
            k_shard,
            v_shard,
            q_chunks,
            lambda src: block_chunks(src, ring_size, rows, self.zigzag),
            group=self.groups.ring_group,
            backend=self.backend,
            softmax_scale=self.softmax_scale,
            causal=self.causal,
            fixed_kv=fixed_kv,
        )


def _heads_to_tokens(
    x, rep_rows: slice, shard_rows: slice, position: float, group, sp_group
) -> torch.Tensor:
    """``[b, rows, h / U, ...]`` of this rank's heads -> ``[b, S / P, h, ...]`` of this rank's
    tokens.

    Sharded rows take the inverse all-to-all; replicated rows (if any) all-gather their heads in the
    Ulysses ``group`` and count once over the SP group in the backward (every ring rank computed
    them).
    """
    shard = all_to_all_4d(x[:, shard_rows].contiguous(), 1, 2, group)
    if rep_rows.stop == rep_rows.start:
        return shard
    replicated = replicated_output(
        all_gather(x[:, rep_rows].contiguous(), dim=2, group=group), sp_group
    )
    return _join_replicated(replicated, shard, position)


def _split_replicated(
    x: torch.Tensor, n: int, position: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(replicated rows, sharded rows)`` of ``x``: the first ``n`` rows (prefix) or the last
    (suffix)."""
    if position == PREFIX_POSITION:
        return x[:, :n], x[:, n:]
    return x[:, x.shape[1] - n :], x[:, : x.shape[1] - n]


def _replicated_rows(n_rep: int, n_shard: int, position: float) -> tuple[slice, slice]:
    """Rows of the replicated and the sharded tokens in ``[rep, shard]`` (prefix) or ``[shard,
    rep]``."""
    if position == PREFIX_POSITION:
        return slice(0, n_rep), slice(n_rep, n_rep + n_shard)
    return slice(n_shard, n_shard + n_rep), slice(0, n_shard)


def _join_replicated(rep: torch.Tensor, shard: torch.Tensor, position: float) -> torch.Tensor:
    """Concatenate along the sequence in sequence order."""
    parts = [rep, shard] if position == PREFIX_POSITION else [shard, rep]
    return torch.cat(parts, dim=1)


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_no_attn_mask(attn_mask: object) -> None:
    """Padding masks (sglang's masked USP path) are not implemented."""
    if attn_mask is not None:
        raise NotImplementedError(
            "attn_mask is not supported by this USPAttention (no padding-mask path); pass "
            "attn_mask=None and shard sequences of equal length"
        )


def check_replicated_modes(
    num_replicated_prefix: int, num_replicated_suffix: int, num_replicated_kv_prefix: int
) -> int:
    """Counts are ints >= 0, at most one is set (sglang's text). Returns how many are set."""
    check_count("num_replicated_prefix", num_replicated_prefix)
    check_count("num_replicated_suffix", num_replicated_suffix)
    check_count("num_replicated_kv_prefix", num_replicated_kv_prefix)
    active = sum(
        int(n > 0) for n in (num_replicated_prefix, num_replicated_suffix, num_replicated_kv_prefix)
    )
    if active > 1:
        raise ValueError("USPAttention supports at most one replicated-token mode per call.")
    return active


def check_count(name: str, value: object) -> None:
    """``value`` is an int (not a bool) >= 0: a number of replicated tokens."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_replicated_fits(name: str, count: int, seq_len: int) -> None:
    """A replicated prefix/suffix of ``count`` rows leaves at least one sharded row in q."""
    if count >= seq_len:
        raise ValueError(
            f"{name} ({count}) must be smaller than q's local sequence length ({seq_len}): the "
            "replicated tokens are part of q, and every rank needs at least one sharded token"
        )


def check_kv_lengths(k: torch.Tensor, v: torch.Tensor) -> None:
    """Cross-attention K/V (any length, every rank holds them whole): k and v have the same rows."""
    if k.shape[1] != v.shape[1]:
        raise ValueError(
            f"k and v must have the same sequence length (dim 1), got {k.shape[1]} and {v.shape[1]}"
        )
