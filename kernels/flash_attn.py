"""FlashAttention-3's prefill and training entry points and ``flash_attn_combine``, on the Triton
kernels.

The twins of :mod:`attn_ref.flash_attn`, with the same arguments, checks and return layouts, taken
from the reference: :func:`flash_attn_func`, :func:`flash_attn_varlen_func` and
:func:`flash_attn_qkvpacked_func` reduce a call to packed sequences, a
:class:`~attn_ref.flash_attn.PackedCall` (:func:`~attn_ref.flash_attn.resolve_func_call`,
:func:`~attn_ref.flash_attn.resolve_varlen_call`, :func:`~attn_ref.flash_attn.split_qkvpacked`),
compute it with the autograd function :class:`_PackedAttention` and return through
:func:`~attn_ref.flash_attn.func_result` / :func:`~attn_ref.flash_attn.varlen_result`.
Sequence ``i`` is the query rows ``q_start_i ..`` (``rows_i`` of them) of the packed ``q (total_q,
h, d)`` and the keys ``k_start_i ..`` (``keys_i``) of ``k (total_k, h_k, d)``, ``v (total_k, h_k,
d_v)``, attended on their own with FA3's masks aligned on ``rows_i`` and ``keys_i``::

    s_ij  = q_i·k_j (+ qv_i·v_j)
    ℓ_ij  = scale · s_ij,  or softcap · tanh(scale · s_ij / softcap);  -inf where key j is hidden
    lse_i = log(Σ_j e^{ℓ_ij} (+ e^{sink_head}))      out_i = Σ_j e^{ℓ_ij - lse_i} v_j

* **Forward**, one launch for every sequence (:func:`plan_packed_attention`): the forward kernel of
  ``flash_attn_with_kvcache`` (:mod:`kernels.attention`, unchanged) reads the packed K/V as a KV
  cache of one row, ``(1, total_k, h_k, ·)``, in which sequence ``i``'s keys start at its left
  padding ``k_start_i`` (``cache_leftpad``: key ``j`` at cache position ``k_start_i + j``,
  ``keys_i`` keys) and its query rows at ``q_start_i`` of the packed q (varlen q), as
  :func:`_kvcache_call` describes the call. Its grid is sized from the longest sequence
  (:func:`sequence_table`); rows past ``seqused_q`` are written by no program and keep ``out =
  0``, ``lse = -inf``.
* **Backward**, one launch per kernel for every sequence:
  :func:`kernels.backward.sequence_gradients` on the packed tensors, with the sequences as a
  :class:`kernels.backward.SequenceTable`; rows and keys outside the sequences get zero gradients.
  The sink logit of head ``h`` gets ``dsink_h = -Σ_i e^{sink_h - lse_ih} D_ih`` from the kernels'
  ``D_i = dO_i · out_i - dlse_i``, summed with torch.

No atomics anywhere (the backward sums GQA inside a program), so a call is bitwise repeatable
whatever ``deterministic`` says. As the reference: ``qv`` is forward only (refused when an input
requires grad, and not taken with fp8), fp8 inputs are forward only (the forward kernel dequantizes
them as for ``flash_attn_with_kvcache``, sequence ``i`` by row ``i`` of each ``(b, h_k)`` descale,
and writes a bf16 ``out``; refused when an input requires grad), ``num_splits``, ``pack_gqa`` and
``sm_margin`` are accepted and ignored (one split; the forward always packs a KV head's query heads
into one tile).

:func:`flash_attn_combine` is the reference's checks
(:func:`attn_ref.flash_attn.check_combine_args`) and return layout
(:func:`attn_ref.flash_attn.combined_to_caller`) around
:func:`kernels.merge.combine_attention_states`.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_ref.call import BatchTable, KVCacheCall
from attn_ref.error_notes import catalogued
from attn_ref.flash_attn import (
    check_combine_args,
    combined_to_caller,
    func_result,
    resolve_func_call,
    resolve_varlen_call,
    split_qkvpacked,
    varlen_result,
)
from attn_ref.masks import AttentionMask

from .backward import SequenceTable, sequence_gradients
from .kvcache import plan_kvcache
from .merge import combine_attention_states


@catalogued
def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
):
    """FA3's ``flash_attn_func`` on the kernels, as :func:`attn_ref.flash_attn.flash_attn_func`
    (signature, checks, results): attention of a batch of equal-length sequences, differentiable.

    Row ``i`` sees key ``j`` by FA3's masks, bottom-right aligned (a row that sees no key gives
    ``out = 0``, ``lse = -inf``); GQA: query head ``head`` reads KV head ``head // (h / h_k)``.
    Gradients flow to q, k and v, and through the LSE when it is returned and used.

    Args:
        q: ``(b, s_q, h, d)``, float16, bfloat16, float32 or float8_e4m3fn (forward only).
        k: ``(b, s_k, h_k, d)``, q's dtype, ``h_k`` divides ``h``.
        v: ``(b, s_k, h_k, d_v)``, q's dtype.
        softmax_scale: factor of ``q·k``; default ``(d + d_qv) ** -0.5``.
        causal: bottom-right aligned causal mask.
        qv: ``(b, s_q, h, d_v)``: adds ``qv·v`` to the scores (MLA); not with fp8. Forward only:
            refused when an input requires grad (``NotImplementedError``).
        q_descale: ``(b, h_k)`` fp32 factor of fp8 q per KV head (None: 1); read only for fp8
            inputs, as FA3.
        k_descale: ``(b, h_k)`` fp32 factor of fp8 k, likewise.
        v_descale: ``(b, h_k)`` fp32 factor of fp8 v, likewise.
        window_size: ``(left, right)`` keys visible around each row's position; -1 is unbounded.
        attention_chunk: keys only from the row's own chunk of this size (0: off).
        softcap: logits ``softcap * tanh(scale * s / softcap)`` before masking (0: off).
        num_splits: FA3's KV splits; accepted, no effect (one split).
        pack_gqa: FA3's query-head packing switch; accepted, no effect (always packed).
        deterministic: FA3's deterministic backward; the kernels are always deterministic.
        sm_margin: SMs FA3 leaves free; accepted, no effect.
        return_attn_probs: also return the LSE (FA3 returns no probabilities either).

    Returns:
        ``out (b, s_q, h, d_v)`` in q's dtype (bf16 for fp8), or ``(out, softmax_lse)`` with
        ``return_attn_probs``, ``softmax_lse (b, h, s_q)`` fp32 (natural log).
    """
    call = resolve_func_call(
        q, k, v, softmax_scale, causal, qv, q_descale, k_descale, v_descale, window_size,
        attention_chunk, softcap,
    )
    out, lse = _PackedAttention.apply(*call.inputs())
    return func_result(call, out, lse, return_attn_probs)


@catalogued
def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    sinks: Optional[torch.Tensor] = None,
    return_softmax_lse: bool = False,
):
    """FA3's ``flash_attn_varlen_func`` on the kernels, as
    :func:`attn_ref.flash_attn.flash_attn_varlen_func` (signature, checks, results): attention of
    packed sequences of different lengths, differentiable, with sglang's keyword-only ``sinks``
    and ``return_softmax_lse``.

    Sequence ``i`` is the query rows ``cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1`` and the keys
    ``cu_seqlens_k[i] .. cu_seqlens_k[i + 1] - 1``, of which only the first ``seqused_q[i]`` rows
    and ``seqused_k[i]`` keys take part when given (the masks are aligned on those lengths). Rows
    past ``seqused_q[i]`` get ``out = 0``, ``lse = -inf`` and zero gradients; unused keys get zero
    gradients. One launch covers every sequence, forward and per backward kernel; the grids are
    sized from the longest sequence used.

    Args:
        q: ``(total_q, h, d)``, as :func:`flash_attn_func`'s q.
        k: ``(total_k, h_k, d)``, q's dtype, ``h_k`` divides ``h``.
        v: ``(total_k, h_k, d_v)``, q's dtype.
        cu_seqlens_q: ``(b + 1,)`` int32 offsets of the sequences in q: 0, ..., ``total_q``.
        cu_seqlens_k: ``(b + 1,)`` int32 offsets of the sequences in k and v: 0, ..., ``total_k``.
        max_seqlen_q: int; checked to be an int (the grids use the longest sequence used).
        max_seqlen_k: int, likewise.
        seqused_q: ``(b,)`` int32, the rows used of each sequence (at most its length), or None.
        seqused_k: ``(b,)`` int32, the keys used of each sequence (at most its length), or None.
        softmax_scale: as :func:`flash_attn_func`.
        causal: as :func:`flash_attn_func`, per sequence.
        qv: ``(total_q, h, d_v)``, as :func:`flash_attn_func` (forward only).
        q_descale: ``(b, h_k)``, as :func:`flash_attn_func` (row ``i``: sequence ``i``).
        k_descale: likewise.
        v_descale: likewise.
        window_size: as :func:`flash_attn_func`, per sequence.
        attention_chunk: as :func:`flash_attn_func`, per sequence.
        softcap: as :func:`flash_attn_func`.
        num_splits: accepted, no effect.
        pack_gqa: accepted, no effect.
        deterministic: the kernels are always deterministic.
        sm_margin: accepted, no effect.
        return_attn_probs: return ``(out, softmax_lse)`` (FA3).
        sinks: ``(h,)`` sink logits (sglang): one more logit per head with no value, in the
            denominator and the LSE; differentiable.
        return_softmax_lse: return ``(out, softmax_lse, None, None)`` (sglang's ``(out, lse,
            *rest)``; no split runs). Takes precedence over ``return_attn_probs``.

    Returns:
        ``out (total_q, h, d_v)`` in q's dtype (bf16 for fp8), with ``softmax_lse (h, total_q)``
        fp32 as asked.
    """
    call = resolve_varlen_call(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q,
        seqused_k,
        softmax_scale,
        causal,
        qv,
        q_descale,
        k_descale,
        v_descale,
        window_size,
        attention_chunk,
        softcap,
        sinks,
    )
    out, lse = _PackedAttention.apply(*call.inputs())
    return varlen_result(out, lse, return_attn_probs, return_softmax_lse)


@catalogued
def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    deterministic: bool = False,
    num_heads_q: Optional[int] = None,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
):
    """FA3's ``flash_attn_qkvpacked_func`` on the kernels, as
    :func:`attn_ref.flash_attn.flash_attn_qkvpacked_func`: self-attention of q, k and v stacked in
    one tensor, differentiable (the gradient is that of ``qkv`` as a whole).

    Args:
        qkv: ``(b, s, 3, h, d)`` (q, k, v along dim 2), or ``(b, s, h + 2 h_k, d)`` with
            ``num_heads_q = h`` (the q heads, then the k heads, then the v heads: GQA).
        softmax_scale: factor of ``q·k``; default ``d ** -0.5``.
        causal: as :func:`flash_attn_func`.
        q_descale: as :func:`flash_attn_func`.
        k_descale: as :func:`flash_attn_func`.
        v_descale: as :func:`flash_attn_func`.
        window_size: as :func:`flash_attn_func`.
        attention_chunk: as :func:`flash_attn_func`.
        softcap: as :func:`flash_attn_func`.
        deterministic: the kernels are always deterministic.
        num_heads_q: the query heads ``h`` of a 4-D ``qkv``; not read for a 5-D one.
        sm_margin: accepted, no effect.
        return_attn_probs: return ``(out, softmax_lse)``.

    Returns:
        ``out (b, s, h, d)`` in qkv's dtype (bf16 for fp8), or ``(out, softmax_lse (b, h, s))``.
    """
    q, k, v = split_qkvpacked(qkv, num_heads_q)
    return flash_attn_func(
        q,
        k,
        v,
        softmax_scale,
        causal,
        None,
        q_descale,
        k_descale,
        v_descale,
        window_size,
        attention_chunk,
        softcap,
        1,
        None,
        deterministic,
        sm_margin,
        return_attn_probs,
    )


@catalogued
def flash_attn_combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FA3's ``flash_attn_combine``, as :func:`attn_ref.flash_attn.flash_attn_combine`.

    Args:
        out_partial: ``(n, b, s, h, d)``: the partial outputs of ``n`` KV splits.
        lse_partial: ``(n, b, s, h)``: their natural-log LSEs.
        out: ``(b, s, h, d)`` of dtype ``out_dtype``, written and returned; default: a new tensor.
        out_dtype: float32 (default), float16 or bfloat16.

    Returns:
        ``(out (b, s, h, d), softmax_lse (b, s, h))``: ``lse = log Σ_s e^{lse_s}``,
        ``out = Σ_s e^{lse_s - lse} o_s`` in ``out_dtype``; ``softmax_lse`` fp32, a
        ``(b, s, h)`` view of ``(b, h, s)`` memory.
    """
    out_dtype = check_combine_args(out_partial, lse_partial, out, out_dtype)
    merged, lse = combine_attention_states(out_partial, lse_partial)
    return combined_to_caller(merged, lse, out, out_dtype)


class _PackedAttention(torch.autograd.Function):
    """Attention of packed sequences (``sequences``: ``[(q_start, rows, k_start, keys)]``) on the
    kernels, the twin of :class:`attn_ref.flash_attn._PackedAttention` (same inputs, same outputs
    ``out (total_q, h, d_v)`` in q's dtype, bf16 for fp8, and ``lse (h, total_q)`` fp32): the
    forward kernel over every sequence in one launch, the backward kernels likewise (the module
    docstring). ``qv`` and fp8 inputs get no gradient (the callers refuse one when it is
    asked)."""

    @staticmethod
    def forward(ctx, q, k, v, qv, sinks, sequences, scale, mask, softcap, q_descale, k_descale,
                v_descale):
        table, max_seqlens = sequence_table(sequences, q.device)
        launches, (out, lse) = plan_packed_attention(q, k, v, qv, sinks, table, max_seqlens, scale,
                                                     mask, softcap,
                                                     (q_descale, k_descale, v_descale))
        for launch in launches:
            launch.run()
        ctx.save_for_backward(q, k, v, out, lse, sinks, *table)
        ctx.max_seqlens, ctx.scale, ctx.mask, ctx.softcap = max_seqlens, scale, mask, softcap
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks, *table = ctx.saved_tensors
        dq, dk, dv, delta = sequence_gradients(
            dout, q, k, v, out, lse, dlse, SequenceTable(*table), ctx.max_seqlens, ctx.scale,
            ctx.mask, ctx.softcap,
        )
        dsinks = None
        if sinks is not None:
            # e^{sink_h - lse_ih}, the sink's probability, (h, total_q); rows outside the sequences
            # (lse = -inf, D = 0) add nothing
            p_sink = torch.where(torch.isinf(lse), 0.0, torch.exp(sinks.float()[:, None] - lse))
            dsinks = -(p_sink * delta).sum(-1).to(sinks.dtype)  # dsink_h = -Σ_i p_sink_ih D_ih
        return dq, dk, dv, None, dsinks, None, None, None, None, None, None, None


def sequence_table(sequences: list[tuple[int, int, int, int]],
                   device) -> tuple[SequenceTable, tuple[int, int]]:
    """``[(q_start, rows, k_start, keys)]`` as a :class:`kernels.backward.SequenceTable` of ``(n,)``
    int32 tensors on ``device`` (one copy to the device), and the static bounds ``(max rows, max
    keys)`` that size the grids."""
    columns = torch.tensor(sequences, dtype=torch.int32).reshape(-1, 4).T.contiguous()  # (4, n)
    q_starts, rows, k_starts, keys = columns.to(device)
    max_seqlens = tuple(max((s[i] for s in sequences), default=0) for i in (1, 3))
    return SequenceTable(q_starts, rows, k_starts, keys), max_seqlens


def plan_packed_attention(q, k, v, qv, sinks, table: SequenceTable, max_seqlens: tuple[int, int],
                          scale: float, mask: AttentionMask, softcap: float, descales: tuple):
    """The forward of packed sequences: ``(launches, (out, lse))``, the forward kernel's launch
    (:func:`kernels.kvcache.plan_kvcache` of :func:`_kvcache_call`) and the tensors it fills, ``out
    (total_q, h, d_v)`` in q's dtype (bf16 for fp8) and ``lse (h, total_q)`` fp32, allocated here
    as 0 and ``-inf``: the values rows past ``seqused_q`` keep (no program writes them)."""
    plan = plan_kvcache(_kvcache_call(q, k, v, qv, sinks, table, max_seqlens, scale, mask,
                                      softcap, descales))  # nothing appended: no cache backup
    out, lse, _, _ = plan.results
    out.zero_()
    lse.fill_(float("-inf"))
    return plan.launches, (out, lse)


def _kvcache_call(q, k, v, qv, sinks, table: SequenceTable, max_seqlens: tuple[int, int],
                  scale: float, mask: AttentionMask, softcap: float,
                  descales: tuple) -> KVCacheCall:
    """The packed sequences as the ``flash_attn_with_kvcache`` call whose forward kernel computes
    them: varlen ``q (total_q, h, d)`` (sequence ``i``'s rows from ``q_starts[i]``), and ``k``,
    ``v`` as the contiguous cache ``(1, total_k, h_k, ·)`` that every sequence reads in row 0 from
    its left padding ``k_starts[i]`` on (``seqlens_k[i]`` keys); nothing appended, one split, no
    rotary; the fp8 ``descales`` ``(q, k, v)``, each ``(n_seq, h_k)`` fp32 or None, indexed by
    batch entry ``i``, which is sequence ``i``; the mask bounded by the longest sequence
    (``max_seqlens``, FA3's normalisation, int32 values)."""
    k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (k, v))
    q_descale, k_descale, v_descale = descales
    zeros = torch.zeros_like(table.q_starts)
    batch = BatchTable(
        seqlens_q=table.seqlens_q, q_starts=table.q_starts, cache_rows=zeros,
        leftpads=table.k_starts, seqlens_k=table.seqlens_k, new_lens=zeros, new_starts=zeros,
        cache_seqlens=table.k_starts + table.seqlens_k, rotary_starts=zeros,
    )
    return KVCacheCall(
        q=q, k_cache=k[None], v_cache=v[None], k=None, v=None, qv=qv, rotary_cos=None,
        rotary_sin=None, page_table=None, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale,
        sinks=sinks, out=None, batch_size=table.q_starts.shape[0], num_heads=q.shape[1],
        num_heads_k=k.shape[1], head_dim=q.shape[2], head_dim_v=v.shape[2], varlen_q=True,
        seqlen_q_bound=max_seqlens[0], batch=batch, page_size=0, capacity=k.shape[0],
        softmax_scale=scale, mask=mask.bounded(*max_seqlens), softcap=softcap,
        rotary_interleaved=False, rotary_dim=0, rotary_q_fixed_position=False, only_qv=False,
        num_splits=1, empty_kv=False, return_softmax_lse=True,
    )
