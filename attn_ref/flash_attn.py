"""FlashAttention-3's prefill and training entry points on the reference, with gradients.

:func:`flash_attn_func` (batched ``q (b, s_q, h, d)``, ``k``/``v (b, s_k, h_k, d|d_v)``),
:func:`flash_attn_varlen_func` (packed sequences: ``q (total_q, h, d)``, ``k``/``v (total_k,
h_k, d|d_v)`` with ``cu_seqlens_q``/``cu_seqlens_k``, optionally only the first
``seqused_q``/``seqused_k`` tokens of each sequence) and :func:`flash_attn_qkvpacked_func` (q, k
and v stacked in one tensor) take FA3's arguments (``hopper/flash_attn_interface.py``) in FA3's
order with FA3's defaults. :func:`flash_attn_combine` folds FA3's split-KV partial states
(``out_partial (n, b, s, h, d)``, ``lse_partial (n, b, s, h)``) with
:func:`~attn_ref.merge.combine_attention_states`.

Every entry point reduces to one computation on the packed layout: a list of sequences, each a
range of query rows and a range of keys, attended on its own with
:func:`~attn_ref.attention.attention_with_lse` (fp32 math, bounded memory, FA3's bottom-right
aligned masks per sequence). The autograd function :class:`_PackedAttention` saves ``out`` and the
LSE and differentiates with :func:`~attn_ref.backward.attention_backward`, one sequence at a time
(the gradient of the LSE, when the caller uses it, flows too; FA3's backward drops it). Per
sequence, with ``D_i = dO_i · out_i - dlse_i`` (:mod:`attn_ref.backward`), the sink logit of head
``h`` (a logit with no value) gets ``dsink_h = -Σ_i e^{sink_h - lse_ih} D_ih``.

The arguments are checked in FA3's order, in FA3's words where FA3 checks the same condition
(:mod:`attn_ref.fa3_checks`; ``mha_fwd`` for the attention entry points, ``mha_combine`` for
:func:`flash_attn_combine`), then the values of the varlen offsets and lengths.

fp8 (float8_e4m3fn) inputs are forward only, as in FA3: sequence ``i`` is dequantized to fp32 as
``flash_attn_with_kvcache`` dequantizes batch entry ``i``
(:func:`~attn_ref.attention.dequantize_per_kv_head`: ``x · x_descale[i, kv_head]``, each descale
``(b, h_k)`` fp32 or None = 1, read only for fp8), then attended as above; the output is bf16.

The reference is deterministic: the same call gives bitwise-equal outputs and gradients, whatever
``deterministic`` says. Not differentiable here, and refused at the forward when an input requires
grad: ``qv`` and fp8 inputs. ``num_splits``, ``pack_gqa`` and ``sm_margin`` only tune FA3's kernels:
accepted and ignored.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .argument_checks import (
    _default_scale,
    _flag,
    _require_cu_seqlens,
    _require_dtype,
    _require_index_range,
    _require_int,
    _require_ndim,
    _require_shape,
    _require_tensor,
)
from .attention import attention_with_lse, dequantize_per_kv_head
from .backward import _preprocess, attention_backward
from .call import output_dtype
from .error_notes import catalogued
from .fa3_checks import (
    _check_output_contiguous,
    _check_shape,
    check_func_inputs,
    check_varlen_inputs,
)
from .masks import AttentionMask
from .merge import check_state, combine_attention_states
from .validation import _check_scalars


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
    """Attention of a batch of equal-length sequences, differentiable: FA3's ``flash_attn_func``.

    FA3's signature, order and defaults. Row ``i`` of a sequence sees key ``j`` by FA3's masks,
    bottom-right aligned (row ``i`` sits at key position ``i + s_k - s_q``; a row that sees no key
    gives ``out = 0``, ``lse = -inf``); GQA: query head ``head`` reads KV head
    ``head // (h / h_k)``. Gradients flow to q, k and v, and through the LSE when it is returned
    and used (the module docstring).

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
        num_splits: FA3's KV splits; accepted, no effect here (the result is the same).
        pack_gqa: FA3's query-head packing switch; accepted, no effect here.
        deterministic: FA3's deterministic backward; the reference is always deterministic.
        sm_margin: SMs FA3 leaves free; accepted, no effect here.
        return_attn_probs: also return the LSE (FA3 returns no probabilities either).

    Returns:
        ``out (b, s_q, h, d_v)`` in q's dtype (bf16 for fp8), or ``(out, softmax_lse)`` with
        ``return_attn_probs``, ``softmax_lse (b, h, s_q)`` fp32 (natural log).
    """
    call = resolve_func_call(
        q,
        k,
        v,
        softmax_scale,
        causal,
        qv,
        q_descale,
        k_descale,
        v_descale,
        window_size,
        attention_chunk,
        softcap,
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
    """Attention of packed sequences of different lengths, differentiable: FA3's
    ``flash_attn_varlen_func``.

    FA3's signature, order and defaults, plus two keywords of sglang's function of the same name
    (``sgl_kernel.flash_attn.flash_attn_varlen_func``), keyword-only: sglang puts ``page_table``
    after ``seqused_k`` and ``only_qv`` before ``sm_margin``, so its positional order differs from
    FA3's past ``seqused_k`` (pass those arguments by keyword to call either). sglang's other
    keywords (``page_table``, ``only_qv``, ``score_mod``, ``aux_tensors``, ``ver``, ``out``) are
    not taken.

    Sequence ``i`` is the query rows ``cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1`` and the keys
    ``cu_seqlens_k[i] .. cu_seqlens_k[i + 1] - 1``; with ``seqused_q`` / ``seqused_k`` only the
    first ``seqused_q[i]`` rows and ``seqused_k[i]`` keys of it take part (the masks are aligned on
    those lengths). Rows past ``seqused_q[i]`` get ``out = 0``, ``lse = -inf`` and zero gradients
    (FA3 leaves them unwritten: their values are undefined there); unused keys get zero gradients.

    Args:
        q: ``(total_q, h, d)``, as :func:`flash_attn_func`'s q.
        k: ``(total_k, h_k, d)``, q's dtype, ``h_k`` divides ``h``.
        v: ``(total_k, h_k, d_v)``, q's dtype.
        cu_seqlens_q: ``(b + 1,)`` int32 offsets of the sequences in q: 0, ..., ``total_q``.
        cu_seqlens_k: ``(b + 1,)`` int32 offsets of the sequences in k and v: 0, ..., ``total_k``.
        max_seqlen_q: int; FA3 sizes its grid with it, the reference only checks that it is an int.
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
        num_splits: accepted, no effect here.
        pack_gqa: accepted, no effect here.
        deterministic: the reference is always deterministic.
        sm_margin: accepted, no effect here.
        return_attn_probs: return ``(out, softmax_lse)`` (FA3).
        sinks: ``(h,)`` sink logits (sglang): one more logit per head with no value, in the
            denominator and the LSE; differentiable.
        return_softmax_lse: return ``(out, softmax_lse, None, None)``: sglang's ``(out, lse,
            *rest)``, whose split partials are None when no split ran (the reference does not
            split). Takes precedence over ``return_attn_probs``.

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
    """Self-attention of q, k and v stacked in one tensor, differentiable: FA3's
    ``flash_attn_qkvpacked_func`` (signature, order and defaults); the gradient is that of
    ``qkv`` as a whole.

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
        deterministic: the reference is always deterministic.
        num_heads_q: the query heads ``h`` of a 4-D ``qkv``; not read for a 5-D one.
        sm_margin: accepted, no effect here.
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
    """The split-KV partial states of FA3, combined: FA3's ``flash_attn_combine`` (signature,
    order, defaults).

    For each row (batch entry, query position, head) with partial states ``(o_s, lse_s)``,
    ``s = 0..n-1``, over disjoint key sets::

        lse = log Σ_s e^{lse_s}          out = Σ_s e^{lse_s - lse} o_s

    folded in split order by :func:`~attn_ref.merge.combine_attention_states` (fp32; a row whose
    partials are all ``-inf`` gives ``out = 0``, ``lse = -inf``; ``+inf`` reads as ``-inf``).
    Arguments are checked by :func:`check_combine_args`, shared with
    :func:`kernels.flash_attn_combine`. Unlike FA3, any float dtype, any strides and any
    ``n >= 1`` are accepted, and ``out`` is always the tensor written (FA3 writes a new one when
    ``head_dim`` is not a multiple of 4).

    Args:
        out_partial: ``(n, b, s, h, d)``: the partial outputs.
        lse_partial: ``(n, b, s, h)``: their natural-log LSEs.
        out: ``(b, s, h, d)`` of dtype ``out_dtype``, written and returned; default: a new tensor.
        out_dtype: float32 (default), float16 or bfloat16.

    Returns:
        ``(out (b, s, h, d), softmax_lse (b, s, h))``: ``out`` in ``out_dtype``; ``softmax_lse``
        fp32, a ``(b, s, h)`` view of ``(b, h, s)`` memory, as FA3 returns it.
    """
    out_dtype = check_combine_args(out_partial, lse_partial, out, out_dtype)
    merged, lse = combine_attention_states(out_partial, lse_partial)
    return combined_to_caller(merged, lse, out, out_dtype)


def check_combine_args(out_partial, lse_partial, out, out_dtype) -> torch.dtype:
    """The arguments of :func:`flash_attn_combine`, for both implementations, in the order of FA3's
    ``mha_combine`` and in its words where it checks the same condition
    (:mod:`attn_ref.fa3_checks`): the states ``out_partial (n, b, s, h, d)`` and ``lse_partial (n,
    b, s, h)``, floating point on one device (:func:`~attn_ref.merge.check_state`, where FA3 wants
    fp32 on CUDA; ``n >= 1`` is checked by the fold,
    :func:`~attn_ref.merge.check_combine_states`), ``out_dtype`` one of FA3's output dtypes, and
    ``out``, when given, ``(b, s, h, d)`` in that dtype with a contiguous last dim. Returns the
    output dtype (``out_dtype``, default float32)."""
    _require_tensor("out_partial", out_partial)
    _require_tensor("lse_partial", lse_partial)
    _check_shape(
        out_partial.dim() == 5,
        "out_partial",
        "num_splits, batch_size, seqlen, num_heads, head_size_og",
    )
    _check_shape(
        lse_partial.shape == out_partial.shape[:-1],
        "lse_partial",
        "num_splits, batch_size, seqlen, num_heads",
    )
    check_state("out_partial", out_partial, "lse_partial", lse_partial)
    out_dtype = torch.float32 if out_dtype is None else out_dtype
    if out_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError("Output type must be FP32, FP16 or BF16")
    if out is not None:
        _require_tensor("out", out)
        _require_dtype("out", out, out_dtype)
        _check_output_contiguous(out)
        _check_shape(
            out.shape == out_partial.shape[1:], "out", "batch_size, seqlen, num_heads, head_size_og"
        )
    return out_dtype


def combined_to_caller(merged, lse, out, out_dtype):
    """The combined state ``merged (b, s, h, d)``, ``lse (b, s, h)`` (fp32) in FA3's return
    layout: ``out`` (written when given) in ``out_dtype`` and the LSE as a ``(b, s, h)`` view of
    contiguous ``(b, h, s)`` memory."""
    if out is None:
        out = merged.to(out_dtype)
    else:
        out.copy_(merged)
    return out, lse.transpose(1, 2).contiguous().transpose(1, 2)


class PackedCall(NamedTuple):
    """One call of the entry points, checked and reduced to packed sequences: what both
    implementations compute (:class:`_PackedAttention` here, its twin in
    :mod:`kernels.flash_attn`).

    ``q (total_q, h, d)``, ``k (total_k, h_k, d)``, ``v (total_k, h_k, d_v)``, ``qv (total_q, h,
    d_v)`` or None, ``sinks (h,)`` or None; ``sequences`` lists ``(q_start, rows, k_start, keys)``
    per sequence (the rows and keys that take part); ``softmax_scale`` and ``softcap`` are floats,
    ``mask`` the :class:`~attn_ref.masks.AttentionMask` of ``causal``, ``window_size`` and
    ``attention_chunk``; ``batch_shape`` is ``(b, s_q)`` for :func:`flash_attn_func` (its output
    is unflattened to it), None for packed inputs. ``q_descale``, ``k_descale``, ``v_descale``: the
    fp8 factors ``(n_seq, h_k)`` fp32 of sequence ``i`` in row ``i`` (None: 1; None unless fp8)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    qv: Optional[torch.Tensor]
    sinks: Optional[torch.Tensor]
    sequences: list[tuple[int, int, int, int]]
    softmax_scale: float
    mask: AttentionMask
    softcap: float
    q_descale: Optional[torch.Tensor]
    k_descale: Optional[torch.Tensor]
    v_descale: Optional[torch.Tensor]
    batch_shape: Optional[tuple[int, int]]

    def inputs(self) -> tuple:
        """The arguments of :class:`_PackedAttention` (and of its kernel twin), in order."""
        return self[:12]


def resolve_func_call(
    q,
    k,
    v,
    softmax_scale,
    causal,
    qv,
    q_descale,
    k_descale,
    v_descale,
    window_size,
    attention_chunk,
    softcap,
) -> PackedCall:
    """:func:`flash_attn_func`'s arguments, checked (:func:`~attn_ref.fa3_checks.check_func_inputs`,
    then the options), as a :class:`PackedCall`: batch entry ``i`` is the rows ``i s_q ..`` of the
    flattened q and the keys ``i s_k ..`` of the flattened k."""
    descales = check_func_inputs(q, k, v, qv, q_descale, k_descale, v_descale)
    b, sq = q.shape[:2]
    sk = k.shape[1]
    return PackedCall(
        q.flatten(0, 1),
        k.flatten(0, 1),
        v.flatten(0, 1),
        None if qv is None else qv.flatten(0, 1),
        None,
        [(i * sq, sq, i * sk, sk) for i in range(b)],
        *_options(q, qv, softmax_scale, causal, window_size, attention_chunk, softcap),
        *descales,
        (b, sq),
    )


def resolve_varlen_call(
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
) -> PackedCall:
    """:func:`flash_attn_varlen_func`'s arguments, checked
    (:func:`~attn_ref.fa3_checks.check_varlen_inputs`, the options, then the values of the
    offsets and lengths), as a :class:`PackedCall`."""
    descales = check_varlen_inputs(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q,
        seqused_k,
        qv,
        sinks,
        q_descale,
        k_descale,
        v_descale,
    )
    options = _options(q, qv, softmax_scale, causal, window_size, attention_chunk, softcap)
    sequences = _sequences(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    return PackedCall(q, k, v, qv, sinks, sequences, *options, *descales, None)


def split_qkvpacked(qkv, num_heads_q) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`flash_attn_qkvpacked_func`'s ``qkv``, checked, as views ``(q, k, v)``."""
    _require_tensor("qkv", qkv)
    if qkv.dim() == 5:
        _require_shape("qkv", qkv, (*qkv.shape[:2], 3, *qkv.shape[3:]), "(batch, seqlen, 3, h, d)")
        return qkv.unbind(dim=2)
    _require_ndim("qkv", qkv, 4, "(batch, seqlen, h + 2 * h_k, d) with num_heads_q")
    heads = qkv.shape[2]
    h = None if num_heads_q is None else _require_int("num_heads_q", num_heads_q)
    if h is None or not 0 < h < heads or (heads - h) % 2:
        raise ValueError(
            f"a 4-D qkv (batch, seqlen, h + 2 * h_k, d) needs num_heads_q = h with "
            f"0 < h < {heads} and {heads} - h even (h_k key heads, then h_k value heads), "
            f"got num_heads_q={num_heads_q!r}"
        )
    return qkv.split([h, (heads - h) // 2, (heads - h) // 2], dim=2)


def func_result(call: PackedCall, out, lse, return_attn_probs):
    """:func:`flash_attn_func`'s return value from the packed ``out (b s_q, h, d_v)`` and ``lse
    (h, b s_q)``: ``out (b, s_q, h, d_v)``, with ``return_attn_probs`` also ``lse (b, h, s_q)``."""
    out = out.unflatten(0, call.batch_shape)
    if _flag("return_attn_probs", return_attn_probs):
        return out, lse.unflatten(1, call.batch_shape).transpose(0, 1).contiguous()
    return out


def varlen_result(out, lse, return_attn_probs, return_softmax_lse):
    """:func:`flash_attn_varlen_func`'s return value: ``out``, ``(out, lse)`` (FA3's
    ``return_attn_probs``) or sglang's ``(out, lse, None, None)`` (``return_softmax_lse``, which
    takes precedence)."""
    if _flag("return_softmax_lse", return_softmax_lse):
        return out, lse, None, None
    if _flag("return_attn_probs", return_attn_probs):
        return out, lse
    return out


def _sequences(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
    """The varlen offsets and lengths (their dtypes and shapes checked by
    :func:`~attn_ref.fa3_checks.check_varlen_inputs`), their values checked, as ``[(q_start, rows,
    k_start, keys)]`` per sequence: each offsets tensor starts at 0, never decreases and ends at
    its tensor's length; ``seqused_q[i]`` / ``seqused_k[i]`` lie within sequence ``i``'s length."""
    for name, cu, x in (("cu_seqlens_q", cu_seqlens_q, q), ("cu_seqlens_k", cu_seqlens_k, k)):
        _require_cu_seqlens(name, cu, x.shape[0], f"{name[-1]}.shape[0]", read_values=True)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    lengths = []
    used_args = (("seqused_q", seqused_q, starts_q), ("seqused_k", seqused_k, starts_k))
    for name, used, starts in used_args:
        full = [b - a for a, b in zip(starts, starts[1:])]
        if used is not None:
            for i, (n, limit) in enumerate(zip(used.tolist(), full)):
                _require_index_range(f"{name}[{i}]", [n], 0, limit + 1)
        lengths.append(full if used is None else used.tolist())
    return [
        (starts_q[i], lengths[0][i], starts_k[i], lengths[1][i]) for i in range(len(starts_q) - 1)
    ]


def _options(q, qv, softmax_scale, causal, window_size, chunk, softcap):
    """The checked scalar options: ``(softmax_scale, mask, softcap)``, the scale defaulting to
    ``(d + d_qv) ** -0.5``; the scale and the softcap (0: off, as any value <= 0) are the float32
    values FA3 computes with, read as ``flash_attn_with_kvcache`` reads them
    (:func:`~attn_ref.validation._check_scalars`)."""
    mask = AttentionMask(causal, window_size, chunk)
    if softmax_scale is None:
        dims = q.shape[-1] + (0 if qv is None else qv.shape[-1])
        softmax_scale = _default_scale("d + d_qv" if qv is not None else "d", dims)
    scale, softcap = _check_scalars(softmax_scale, softcap)
    return scale, mask, softcap


class _PackedAttention(torch.autograd.Function):
    """Attention of packed sequences (``sequences``: ``[(q_start, rows, k_start, keys)]``), forward
    by :func:`~attn_ref.attention.attention_with_lse` and backward by
    :func:`~attn_ref.backward.attention_backward`, one sequence at a time. fp8 sequences are
    dequantized first (:func:`~attn_ref.attention.dequantize_per_kv_head`, factors of row ``i`` of
    the descales for sequence ``i``) and give a bf16 ``out``. ``qv`` and fp8 inputs get no gradient
    (the callers refuse one when it is asked)."""

    @staticmethod
    def forward(
        ctx, q, k, v, qv, sinks, sequences, scale, mask, softcap, q_descale, k_descale, v_descale
    ):
        total_q, h = q.shape[:2]
        group = h // k.shape[1]
        out = torch.zeros(total_q, h, v.shape[-1], dtype=torch.float32, device=q.device)
        lse = torch.full((h, total_q), float("-inf"), device=q.device)
        for i, (q0, rows, k0, keys) in enumerate(sequences):
            seq_q, seq_k, seq_v = q[q0 : q0 + rows], k[k0 : k0 + keys], v[k0 : k0 + keys]
            if q.dtype == torch.float8_e4m3fn:
                seq_q = dequantize_per_kv_head(seq_q, q_descale, i, group)
                seq_k = dequantize_per_kv_head(seq_k, k_descale, i)
                seq_v = dequantize_per_kv_head(seq_v, v_descale, i)
            out[q0 : q0 + rows], state_lse = attention_with_lse(
                seq_q,
                seq_k,
                seq_v,
                scale,
                mask,
                softcap,
                None if qv is None else qv[q0 : q0 + rows],
                sinks=sinks,
            )
            lse[:, q0 : q0 + rows] = state_lse.T
        out = out.to(output_dtype(q.dtype))
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.sequences, ctx.scale, ctx.mask, ctx.softcap = sequences, scale, mask, softcap
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dsinks = None if sinks is None else torch.zeros(sinks.shape, device=q.device)
        for q0, rows, k0, keys in ctx.sequences:
            r, n = slice(q0, q0 + rows), slice(k0, k0 + keys)
            seq_lse = lse[None, :, r]  # (1, h, rows)
            seq_dlse = None if dlse is None else dlse[None, :, r]
            grads = attention_backward(
                dout[None, r],
                q[None, r],
                k[None, n],
                v[None, n],
                out[None, r],
                seq_lse,
                ctx.scale,
                ctx.mask,
                seq_dlse,
                softcap=ctx.softcap,
            )
            dq[r], dk[n], dv[n] = (g[0] for g in grads)
            if dsinks is not None:
                # D = dO · out - dlse per row and head, the backward's row term: (h, rows)
                row_dlse = None if seq_dlse is None else seq_dlse[0].T
                delta = _preprocess(out[r].float(), dout[r].float(), row_dlse).T
                dsinks -= (torch.exp(sinks.float()[:, None] - seq_lse[0]) * delta).sum(-1)
        if dsinks is not None:
            dsinks = dsinks.to(sinks.dtype)
        return dq, dk, dv, None, dsinks, None, None, None, None, None, None, None
