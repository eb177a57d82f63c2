"""``UlyssesAttention``: sglang's sequence-parallel attention over one SP group, in two modes.

Each of the ``P`` ranks holds ``S / P`` tokens of the sequence (``[b, S / P, h, d]``, rank order)
and, optionally, replicated tokens every rank holds whole (``replicated_q/k/v [b, S_r, h|h_k, d]``,
e.g. the text of a text-to-image model). The result equals single-device attention over the sequence
``[shard_0, ..., shard_{P-1}, replicated]``: the replicated tokens act as a **suffix**, counted
once.

* **Ulysses** (``sp_attention_mode="ulysses"``): an all-to-all turns sequence shards into head
  shards, ``[b, S / P, h, d] -> [b, S, h / P, d]``; each rank attends the whole sequence for its
  ``h / P`` heads (attention never mixes heads, so this is exact), with its slice of the replicated
  heads appended as a suffix; the inverse all-to-all brings the output back to
  ``[b, S / P, h, d]``, and an all-gather over heads rebuilds the replicated output ``[b, S_r, h,
  d]`` on every rank. Needs ``h % P == 0`` and ``h_k % P == 0``; supports ``causal`` and
  ``seq_lens`` (unequal local lengths).
* **K/V gather** (``"kv_gather"``): all-gather K and V along the sequence, ``[b, S, h_k, d]``,
  append the replicated K/V as a suffix, and attend the local queries (plus the replicated ones)
  over all of it. No head divisibility and no output collective: the replicated output is computed,
  whole, on every rank. Like sglang it refuses ``causal`` and ``seq_lens``.
* ``"auto"``: K/V gather where it can serve the call, Ulysses otherwise (causal modules, varlen
  calls), like sglang's ``sp_split_auto``.

Ring parallelism is refused (sglang: the all-to-all spans the combined group); use
:class:`USPAttention` for Ulysses x ring.

**Backward.** Both modes are differentiable: the all-to-all's adjoint is the inverse all-to-all, the
K/V all-gather's a reduce-scatter; replicated tokens follow :mod:`.replicated` (every rank passes
the same gradient for ``replicated_out`` and gets the full gradient of ``replicated_q/k/v``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..error_notes import catalogued
from ..masks import NO_MASK, AttentionMask
from .agreement import describe, run_checks_on_every_rank
from .checks import (
    check_4d,
    check_heads_split,
    check_kv_heads_split,
    check_local_seq_len,
    check_seq_lens,
    check_seq_lens_values,
    check_tensors,
    check_usp_heads_split,
)
from .comm import all_gather, all_to_all_4d, all_to_all_4d_packed, heads_of_rank
from .groups import SequenceParallelGroups, layout_of as _layout
from .layer import SequenceParallelAttention
from .replicated import replicated_input, replicated_output

#: sglang's text for UlyssesAttention under ring parallelism (raised as NotImplementedError).
ULYSSES_RING_MESSAGE = (
    "UlyssesAttention's all-to-all spans the combined sequence parallel group and is not "
    "ring-aware; it would silently shuffle across ring ranks instead of rotating KV within them. "
    "Ring parallelism is not supported for models still using UlyssesAttention -- use USPAttention "
    "instead."
)
SP_ATTENTION_MODES = ("ulysses", "kv_gather", "auto")


class UlyssesAttention(SequenceParallelAttention):
    """Sequence-parallel attention over ``groups.sp_group`` (see the module docstring).

    The positional arguments and ``**extra_impl_args`` are sglang's, in sglang's order; the
    keyword-only ``sp_attention_mode`` and ``groups`` are this package's.

    Args:
        num_heads: query heads ``h``.
        head_size: head dim ``d``.
        num_kv_heads: ``h_k`` (default ``h``; ``h % h_k == 0``, GQA).
        softmax_scale: default ``head_size ** -0.5``.
        causal: causal attention over the global sequence (Ulysses mode only).
        supported_attention_backends: accepted and kept as an attribute; in sglang it chooses the
            local attention backend, here :attr:`backend` does.
        prefix: accepted and kept as an attribute (sglang's layer name).
        sp_attention_mode: ``"ulysses"``, ``"kv_gather"`` or ``"auto"``.
        groups: the SP layout (:func:`init_sequence_parallel_groups`); default: Ulysses over the
            whole default group, or a single rank without ``torch.distributed``.
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
        *,
        sp_attention_mode: str = "ulysses",
        groups: Optional[SequenceParallelGroups] = None,
        **extra_impl_args: object,
    ):
        super().__init__()
        groups = SequenceParallelGroups.from_world() if groups is None else groups
        check_ulysses_only(groups.ring_degree)
        check_sp_attention_mode(sp_attention_mode, causal)
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
        self.groups = groups
        # sglang's (mode, is_auto): a causal module cannot use the gather, so auto means Ulysses.
        self.sp_attention_mode = (
            "ulysses" if sp_attention_mode == "auto" and causal else sp_attention_mode
        )
        self.sp_attention_mode_is_auto = sp_attention_mode == "auto"

    @catalogued
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        replicated_q: Optional[torch.Tensor] = None,
        replicated_k: Optional[torch.Tensor] = None,
        replicated_v: Optional[torch.Tensor] = None,
        seq_lens: Optional[Sequence[int]] = None,
        *,
        return_softmax_lse: bool = False,
    ):
        """Attention of this rank's tokens (and the replicated ones) over the whole sequence.

        Args:
            q: ``[b, S / P, h, d]``: this rank's shard of the queries (rank order).
            k: ``[b, S / P, h_k, d]``: this rank's shard of the keys.
            v: ``[b, S / P, h_k, d]``: this rank's shard of the values.
            replicated_q: ``[b, S_r, h, d]`` queries every rank holds whole (a suffix of the
                sequence); ``replicated_q``, ``replicated_k`` and ``replicated_v`` come all three or
                none.
            replicated_k: ``[b, S_r, h_k, d]`` keys every rank holds whole.
            replicated_v: ``[b, S_r, h_k, d]`` values every rank holds whole.
            seq_lens: the local length ``S / P`` of every rank (unequal shards, Ulysses mode).
            return_softmax_lse: also return the LSEs (fp32, ``[b, S / P, h]`` / ``[b, S_r, h]``).

        Returns:
            ``(out [b, S / P, h, d], replicated_out [b, S_r, h, d] or None)``, with
            ``(..., lse, replicated_lse)`` appended when ``return_softmax_lse``.
        """
        reps = (replicated_q, replicated_k, replicated_v)
        gather = self.sp_attention_mode == "kv_gather" and not (
            self.sp_attention_mode_is_auto and seq_lens is not None
        )
        varlen_dim = None if seq_lens is None else 1
        fields = dict(
            path="kv_gather" if gather else "ulysses",
            causal=self.causal,
            softmax_scale=self.softmax_scale,
            heads=(self.num_heads, self.num_kv_heads, self.head_size),
            layout=_layout(self.groups),
            q=describe(q, varlen_dim),
            k=describe(k, varlen_dim),
            v=describe(v, varlen_dim),
            replicated=tuple(describe(x) for x in reps),
            seq_lens=describe(seq_lens),
            return_softmax_lse=return_softmax_lse,
        )
        check = self._check_kv_gather_call if gather else self._check_ulysses_call
        replicated, seq_lens = run_checks_on_every_rank(
            self.groups.sp_group,
            "UlyssesAttention.forward",
            fields,
            lambda: check(q, k, v, *reps, seq_lens),
        )
        if gather:
            return self._forward_with_kv_gather(q, k, v, *reps, return_softmax_lse)
        return self._forward_ulysses(q, k, v, *reps, seq_lens, return_softmax_lse)

    def _check_kv_gather_call(self, q, k, v, replicated_q, replicated_k, replicated_v, seq_lens):
        """sglang's order: 4-D, varlen, all three replicated or none; then this package's checks."""
        check_tensors(q=q, k=k, v=v)
        check_4d(q=q, k=k, v=v)
        replicated = check_kv_gather_call(seq_lens, replicated_q, replicated_k, replicated_v)
        self._check_shapes(q, k, v, replicated_q, replicated_k, replicated_v, replicated)
        return replicated, None

    def _check_ulysses_call(self, q, k, v, replicated_q, replicated_k, replicated_v, seq_lens):
        """sglang's order: 4-D, varlen vs replicated, the all-to-all's asserts; then this package's
        checks.

        Upstream's all-to-all checks nothing on one rank (it returns its input), so neither does
        this.
        """
        check_tensors(q=q, k=k, v=v)
        check_4d(q=q, k=k, v=v)
        check_ulysses_call(seq_lens, replicated_q, replicated_k, replicated_v)
        world, rank = self.groups.sp_size, self.groups.sp_rank
        if world == 1:
            # one rank: the whole sequence is local, as upstream, whatever seq_lens says
            seq_lens = None
        if seq_lens is None:
            check_heads_split(q.shape[2], world)
        else:  # usp.py's varlen all-to-all: length, this rank's entry, heads
            seq_lens = check_seq_lens(seq_lens, world)
            check_local_seq_len(q, seq_lens, rank)
            check_usp_heads_split(q.shape[2], world)
            check_seq_lens_values(seq_lens)
        replicated = check_replicated_together(replicated_q, replicated_k, replicated_v)
        self._check_shapes(q, k, v, replicated_q, replicated_k, replicated_v, replicated)
        check_kv_heads_split(self.num_kv_heads, world, "sequence parallel world size")
        return replicated, seq_lens

    def _check_shapes(
        self, q, k, v, replicated_q, replicated_k, replicated_v, replicated: bool
    ) -> None:
        self._check_inputs(q, k, v)
        if replicated:
            check_replicated_shapes(replicated_q, replicated_k, replicated_v, q, k, v)

    def _forward_ulysses(
        self, q, k, v, replicated_q, replicated_k, replicated_v, seq_lens, with_lse
    ):
        group, world, rank = self.groups.sp_group, self.groups.sp_size, self.groups.sp_rank
        # [b, S / P, h, d] -> [b, S, h / P, d]: all tokens, this rank's heads.
        q, k, v = all_to_all_4d_packed([q, k, v], 2, 1, group, seq_lens)
        seq = q.shape[1]
        if replicated_q is not None:
            # The replicated tokens: this rank's heads, appended as a suffix (never all-to-all'ed).
            reps = (replicated_input(x, group) for x in (replicated_q, replicated_k, replicated_v))
            q, k, v = (
                torch.cat([x, heads_of_rank(r, rank, world)], dim=1)
                for x, r in zip((q, k, v), reps)
            )
        out, lse = self.backend.attend(
            q, k, v, self.softmax_scale, AttentionMask(causal=self.causal)
        )
        results = []
        for x in (out, lse[..., None]) if with_lse else (out,):  # [b, S + S_r, h / P, d_v | 1]
            # [b, S, h / P, .] -> [b, S / P, h, .]: back to this rank's tokens, all heads.
            tokens = all_to_all_4d(x[:, :seq].contiguous(), 1, 2, group, seq_lens)
            # [b, S_r, h / P, .] -> [b, S_r, h, .] on every rank: an all-gather over heads.
            replicated = (
                None
                if replicated_q is None
                else replicated_output(
                    all_gather(x[:, seq:].contiguous(), dim=2, group=group), group
                )
            )
            results += [tokens, replicated]
        if with_lse:
            results[2:] = [None if x is None else x[..., 0] for x in results[2:]]
        return tuple(results)

    def _forward_with_kv_gather(self, q, k, v, replicated_q, replicated_k, replicated_v, with_lse):
        group = self.groups.sp_group
        # [b, S / P, h_k, d] -> [b, S, h_k, d]: every rank's keys and values, in rank order.
        if k.shape == v.shape:
            k, v = all_gather(torch.stack([k, v]), dim=2, group=group).unbind(0)
        else:
            k, v = all_gather(k, dim=1, group=group), all_gather(v, dim=1, group=group)
        local_len = q.shape[1]
        if replicated_q is not None:
            reps = (replicated_input(x, group) for x in (replicated_q, replicated_k, replicated_v))
            q, k, v = (torch.cat([x, r], dim=1) for x, r in zip((q, k, v), reps))
        out, lse = self.backend.attend(q, k, v, self.softmax_scale, NO_MASK)
        results = []
        for x in (out, lse) if with_lse else (out,):
            # every rank computed the replicated rows whole: they count once in the backward
            results += (
                [x, None]
                if replicated_q is None
                else [x[:, :local_len], replicated_output(x[:, local_len:], group)]
            )
        return tuple(results)


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_ulysses_only(ring_degree: int) -> None:
    """UlyssesAttention's all-to-all is not ring-aware (sglang PR #33353)."""
    if ring_degree > 1:
        raise NotImplementedError(ULYSSES_RING_MESSAGE)


def check_sp_attention_mode(mode: object, causal: bool) -> None:
    """``sp_attention_mode`` is known; an explicit K/V gather refuses causal attention (as
    sglang)."""
    if mode not in SP_ATTENTION_MODES:
        raise ValueError(f"sp_attention_mode must be one of {SP_ATTENTION_MODES}, got {mode!r}")
    if mode == "kv_gather" and causal:
        raise ValueError("K/V-gather SP does not support causal attention.")


def check_replicated_together(replicated_q, replicated_k, replicated_v) -> bool:
    """All three replicated tensors or none (sglang's K/V-gather text, applied on every path).

    Returns whether replicated tokens were given.
    """
    given = [x is not None for x in (replicated_q, replicated_k, replicated_v)]
    if any(given) and not all(given):
        raise ValueError("Replicated Q, K, and V must be provided together.")
    return all(given)


def check_kv_gather_call(seq_lens, replicated_q, replicated_k, replicated_v) -> bool:
    """sglang ``_forward_with_kv_gather``'s two checks, in its order. Returns whether replicated."""
    if seq_lens is not None:
        raise NotImplementedError("K/V-gather SP does not support varlen UlyssesAttention.")
    return check_replicated_together(replicated_q, replicated_k, replicated_v)


def check_ulysses_call(seq_lens, replicated_q, replicated_k, replicated_v) -> None:
    """The Ulysses path's first check: varlen excludes replicated tokens.

    (The path then checks "all three or none" after the all-to-all's asserts, where sglang asserts
    k/v when ``replicated_q`` is given; sglang silently ignores a lone ``replicated_k``, here any
    partial set raises.)
    """
    if seq_lens is not None and any(
        x is not None for x in (replicated_q, replicated_k, replicated_v)
    ):
        raise ValueError("Varlen Ulysses attention does not support replicated QKV")


def check_replicated_shapes(
    replicated_q: torch.Tensor,
    replicated_k: torch.Tensor,
    replicated_v: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Replicated tokens look like q/k/v apart from their sequence length ``S_r`` (dim 1)."""
    check_tensors(replicated_q=replicated_q, replicated_k=replicated_k, replicated_v=replicated_v)
    check_4d(replicated_q=replicated_q, replicated_k=replicated_k, replicated_v=replicated_v)
    pairs = (
        ("replicated_q", replicated_q, q),
        ("replicated_k", replicated_k, k),
        ("replicated_v", replicated_v, v),
    )
    for name, rep, x in pairs:
        if rep.dtype != x.dtype or rep.device != x.device:
            raise ValueError(
                f"{name} must have the dtype and device of {name[-1]} ({x.dtype}, {x.device}), "
                f"got {rep.dtype}, {rep.device}"
            )
        if rep.shape[0] != x.shape[0] or rep.shape[2:] != x.shape[2:]:
            raise ValueError(
                f"{name} must be [batch, S_r, heads, head_dim] = [{x.shape[0]}, S_r, {x.shape[2]}, "
                f"{x.shape[3]}] like {name[-1]}, got {tuple(rep.shape)}"
            )
    if not (replicated_q.shape[1] == replicated_k.shape[1] == replicated_v.shape[1]):
        raise ValueError(
            "replicated_q, replicated_k and replicated_v must have the same sequence length (dim "
            "1), got "
            f"{replicated_q.shape[1]}, {replicated_k.shape[1]}, {replicated_v.shape[1]}"
        )
