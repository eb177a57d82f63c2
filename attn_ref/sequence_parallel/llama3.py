"""ring-flash-attention's llama3 schedule: packed documents across ranks, K/V all-gathered by head
strides.

The context parallelism of the Llama 3 paper, as ring-flash-attention implements it
(zhuzilin/ring-flash-attention at commit ``899628238f2f5bb8c028579c89b7cd56ea451d2a``,
``ring_flash_attn/llama3_flash_attn_varlen.py``), with its names, argument order, defaults and
return values:

* :func:`llama3_flash_attn_prepare_cu_seqlens` ``(cu_seqlens, causal, rank, world_size) ->
  (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, local_k_slice)``;
* :func:`llama3_flash_attn_varlen_func` ``(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k, heads_k_stride, local_k_slice, dropout_p=0.0, softmax_scale=None, causal=False,
  window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_attn_probs=False,
  group=None)`` and its ``_kvpacked_func(q, kv, ...)`` / ``_qkvpacked_func(qkv, ...)`` forms
  (``kv [S / P, 2, h_k, d]``, ``qkv [S / P, 3, h, d]``).

**Layout.** The packed batch is ``S`` tokens, documents back to back (``cu_seqlens``, ``(n + 1,)``
int32, ``0, ..., S``). Rank ``r`` of the ``P`` ranks holds tokens ``[r·S/P, (r+1)·S/P)``: ``q [S /
P, h, d]``, ``k``, ``v [S / P, h_k, d]``, whatever the document boundaries (a document may straddle
ranks, or span several). :func:`llama3_flash_attn_prepare_cu_seqlens` cuts the documents at the
rank's edges: ``cu_seqlens_q`` are the rank's query rows per document, ``cu_seqlens_k`` the keys
they need, which start at the *document's* first token (possibly on an earlier rank), so
``local_k_slice`` (the keys' rows in the gathered ``[S, h_k, d]``) can be longer than ``S / P``.
With ``causal`` the keys stop at the rank's last token; without, at the end of its last document.

**Forward.** For each stride of ``heads_k_stride`` KV heads (``h_k / heads_k_stride`` steps):
all-gather that stride of every rank's ``k`` and ``v`` (``[S, heads_k_stride, d]``), take rows
``local_k_slice``, and run the local ``flash_attn_varlen_func`` of the query heads that read them
(``heads_k_stride · h / h_k`` heads) with ``cu_seqlens_q``/``cu_seqlens_k``. The next stride's
gathers are posted before this stride's attention (double buffering), so communication overlaps
compute; a stride bounds the gathered K/V in memory to ``2 S · heads_k_stride · d``. Each query row
sees all its document's keys, aligned at their ends: the result is single-device attention over the
whole packed batch, per document. Outputs ``out [S / P, h, d]`` and, with ``return_attn_probs``,
``(out, softmax_lse [h, S / P] fp32, None)``.

**Backward.** Stride by stride again: gather the stride's K/V (prefetched one stride ahead), get
``dq``, ``dk``, ``dv`` of the local attention, then **reduce-scatter** the ``dk``/``dv`` of the
``[S, heads_k_stride, d]`` gathered keys: rank ``r`` receives the sum over ranks of the gradients of
its own tokens (in fp32, then q's dtype). ring-flash-attention calls FlashAttention's varlen
backward with the saved ``out`` and LSE; this package's ``flash_attn_varlen_func`` exposes its
backward through autograd, so the backward re-runs the stride's local forward under autograd (the
same ``out`` and LSE: the reference is deterministic) and differentiates it. The LSE output carries
a gradient too (ring-flash-attention drops it).

Bytes each rank receives per call (``e``: bytes per element of k; the gradients travel in fp32)::

    forward   (P - 1) · (S / P) · 2 h_k · d · e
    backward  (P - 1) · (S / P) · 2 h_k · d · (e + 4)

What differs from ring-flash-attention:

* ``dropout_p != 0`` and ``alibi_slopes`` raise ``NotImplementedError``;
* with ``causal`` or a window (masks that depend on positions), every document's keys must end
  where its queries end, which ``llama3_flash_attn_prepare_cu_seqlens(..., causal=True, ...)``
  guarantees; other offsets raise instead of computing a wrongly aligned mask (ring-flash-attention
  computes it);
* the inputs are checked on every rank, with the cross-rank agreement of :mod:`.agreement`, before
  the first gather; upstream's asserts (``total_length % world_size == 0``, ``nheads_k %
  heads_k_stride == 0``, ``alibi_slopes is None``) are catalogued errors with their condition in
  the message;
* ``deterministic`` is accepted and has no effect; gradients are in the inputs' dtype (accumulated
  in fp32), the LSE's gradient flows.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ..error_notes import catalogued
from ..flash_attn import resolve_varlen_call
from .agreement import describe, run_checks_on_every_rank
from .backend import REFERENCE_BACKEND, AttentionBackend
from .checks import check_no_dropout, check_positive_int, check_tensors
from .comm import Group, group_rank, group_size
from .ring_flash_attn import call_fields, check_no_alibi
from .ring_varlen import unpack_varlen


@catalogued
def llama3_flash_attn_prepare_cu_seqlens(
    cu_seqlens: torch.Tensor, causal: bool, rank: int, world_size: int
):
    """This rank's share of a packed batch: its query rows and the keys they need, per document.

    Args:
        cu_seqlens: ``(n + 1,)`` int32 offsets of the ``n`` documents of the whole packed batch
            (every rank passes the same), ``0, ..., S``; ``S`` divisible by ``world_size``.
        causal: whether the attention will be causal (the keys then stop at the rank's last token).
        rank: this rank's index in the group, ``0 <= rank < world_size``.
        world_size: ``P``, the number of ranks.

    Returns:
        ``(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, local_k_slice)``: the offsets of
        the rank's ``S / P`` query rows per document that has rows here (an empty document inside
        the share keeps its empty entry), the offsets of their keys inside ``local_k_slice`` (a
        ``slice`` of the gathered ``S`` rows, from the first document's start), and the longest
        of each as ints.
    """
    total_length = int(cu_seqlens[-1])
    check_total_length_divisible(total_length, world_size)
    share = total_length // world_size
    start, end = rank * share, (rank + 1) * share
    # the documents that hold rows [start, end): the first offset >= start (stepping back one when
    # it is past start: that document began on an earlier rank) up to the first offset >= end
    first = int(torch.searchsorted(cu_seqlens, start))
    first -= int(cu_seqlens[first]) != start
    last = int(torch.searchsorted(cu_seqlens, end))
    offsets = cu_seqlens[first : last + 1]
    keys_start = int(offsets[0])
    keys_end = end if causal else int(offsets[-1])
    cu_seqlens_q = (offsets - start).clamp(
        0, share
    )  # the first and last documents cut at the edges
    cu_seqlens_k = offsets - keys_start
    cu_seqlens_k[-1] = keys_end - keys_start
    return (
        cu_seqlens_q,
        cu_seqlens_k,
        int(cu_seqlens_q.diff().max()),
        int(cu_seqlens_k.diff().max()),
        slice(keys_start, keys_end),
    )


class _Llama3Attention(torch.autograd.Function):
    """The llama3 schedule (module docstring) as an autograd function: ``(q [S/P, h, d], k, v [S/P,
    h_k, d]) -> (out [S/P, h, d], lse [h, S/P])``, with its stride-by-stride backward."""

    @staticmethod
    def forward(ctx, q, k, v, plan: "_Plan"):
        outs, lses = [], []
        gathers = _StrideGathers(k, v, plan)
        for heads_k, k_all, v_all in gathers:
            with torch.no_grad():
                out, lse = plan.attend(q[:, plan.query_heads(heads_k)], k_all, v_all)
            outs.append(out)
            lses.append(lse)
        ctx.save_for_backward(q, k, v)
        ctx.plan = plan
        return torch.cat(outs, dim=1), torch.cat(lses, dim=0)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v = ctx.saved_tensors
        plan: _Plan = ctx.plan
        dq = torch.empty_like(q)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        for heads_k, k_all, v_all in _StrideGathers(k, v, plan):
            heads = plan.query_heads(heads_k)
            q_i, k_i, v_i = (x.detach().requires_grad_() for x in (q[:, heads], k_all, v_all))
            with torch.enable_grad():
                out, lse = plan.attend(q_i, k_i, v_i)
            grads = torch.autograd.grad(
                (out, lse), (q_i, k_i, v_i), (dout[:, heads], dlse[heads]), allow_unused=True
            )
            dq_i, dk_all, dv_all = (
                torch.zeros_like(x) if g is None else g for g, x in zip(grads, (q_i, k_i, v_i))
            )
            dq[:, heads] = dq_i
            dk[:, heads_k] = plan.reduce_scatter(dk_all)
            dv[:, heads_k] = plan.reduce_scatter(dv_all)
        return dq, dk, dv, None


class _Plan:
    """What one call computes with: group, strides, offsets, local attention. Every rank builds its
    own from checked arguments."""

    def __init__(self, q, k, offsets, heads_k_stride, options, group, backend):
        self.group, self.world = group, group_size(group)
        self.rows_k = k.shape[0]  # S / P
        self.heads_k, self.stride = k.shape[1], heads_k_stride
        self.group_size = q.shape[1] // k.shape[1]  # query heads per KV head
        self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k = offsets[:4]
        self.local_k_slice = offsets[4]
        self.options = options  # softmax_scale, causal, window_size
        self.varlen = backend.flash_attn_varlen_func

    def strides(self) -> list[slice]:
        """The KV-head strides, in order."""
        return [slice(i, i + self.stride) for i in range(0, self.heads_k, self.stride)]

    def query_heads(self, heads_k: slice) -> slice:
        """The query heads that read KV heads ``heads_k`` (GQA: query head ``j`` reads KV head
        ``j // g``)."""
        return slice(heads_k.start * self.group_size, heads_k.stop * self.group_size)

    def attend(self, q, k_all, v_all):
        """Local varlen attention of ``q [S/P, heads, d]`` over rows ``local_k_slice`` of the
        gathered ``k_all``, ``v_all [S, stride, d]``: ``(out [S/P, heads, d], lse [heads,
        S/P])``."""
        softmax_scale, causal, window_size = self.options
        return self.varlen(
            q,
            k_all[self.local_k_slice],
            v_all[self.local_k_slice],
            self.cu_seqlens_q,
            self.cu_seqlens_k,
            self.max_seqlen_q,
            self.max_seqlen_k,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            return_attn_probs=True,
        )

    def reduce_scatter(self, grad_all: torch.Tensor) -> torch.Tensor:
        """``[S, stride, d]`` gradients of the gathered rows -> this rank's ``[S/P, stride, d]``,
        summed over ranks in fp32 (the adjoint of the all-gather)."""
        grad_all = grad_all.float().contiguous()
        if self.world == 1:
            return grad_all
        mine = grad_all.new_empty(self.rows_k, *grad_all.shape[1:])
        _reduce_scatter_single()(mine, grad_all, group=self.group)
        return mine


class _StrideGathers:
    """Iterate ``(heads_k, k_all, v_all)`` over the KV-head strides: ``k_all``, ``v_all`` ``[S,
    stride, d]`` every rank's rows of those heads, in rank order. The next stride's all-gathers are
    posted (async) before the current one is handed out, so they overlap its compute."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, plan: _Plan):
        self.k, self.v, self.plan = k, v, plan

    def _post(self, heads_k: slice):
        parts = [self.k[:, heads_k].contiguous(), self.v[:, heads_k].contiguous()]
        if self.plan.world == 1:
            return parts, []
        gathered = [x.new_empty(self.plan.world * x.shape[0], *x.shape[1:]) for x in parts]
        handles = [
            _all_gather_single()(out, x, group=self.plan.group, async_op=True)
            for out, x in zip(gathered, parts)
        ]
        return gathered, handles

    def __iter__(self):
        strides = self.plan.strides()
        pending = self._post(strides[0])
        for i, heads_k in enumerate(strides):
            (k_all, v_all), handles = pending
            for handle in handles:
                handle.wait()
            if i + 1 < len(strides):
                pending = self._post(strides[i + 1])
            yield heads_k, k_all, v_all


def _all_gather_single():
    """``torch.distributed``'s one-tensor all-gather (``all_gather_into_tensor`` before torch 2.13),
    looked up at each call (tests count the bytes by wrapping it)."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_single():
    """``torch.distributed``'s one-tensor reduce-scatter (``reduce_scatter_tensor`` before torch
    2.13), looked up at each call."""
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _llama3(call: str, packed: dict, args: tuple, options: dict, backend: AttentionBackend):
    """The body of every entry point: the checks on every rank, the schedule, the return
    convention. ``packed``: ``{q, k, v}``, ``{q, kv}`` or ``{qkv}``; ``args``: ``(cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride, local_k_slice)``; ``options``: the
    keywords (``deterministic``, which has no effect, is not passed)."""
    group = options["group"]
    cu_seqlens_q, cu_seqlens_k, _, _, heads_k_stride, local_k_slice = args

    def checks():
        q, k, v = unpack_varlen(packed)
        check_no_alibi(options["alibi_slopes"])
        check_no_dropout("dropout_p", options["dropout_p"])
        check_backend_has_varlen(backend)
        check_tensors(q=q, k=k, v=v)
        rows_k = k.shape[0] if k.dim() else 0
        check_local_k_slice(local_k_slice, group_size(group) * rows_k)
        keys = local_k_slice.stop - local_k_slice.start
        # the local call's own checks (FA3's), on views of the sizes it will get
        resolve_varlen_call(
            q,
            k[:1].expand(keys, *k.shape[1:]) if k.dim() else k,
            v[:1].expand(keys, *v.shape[1:]) if v.dim() else v,
            *args[:4],
            None,
            None,
            options["softmax_scale"],
            options["causal"],
            None,
            None,
            None,
            None,
            options["window_size"],
            0,
            0.0,
            None,
        )
        check_positive_int("heads_k_stride", heads_k_stride)
        check_heads_k_stride(k.shape[1], heads_k_stride)
        check_keys_end_with_queries(
            cu_seqlens_q,
            cu_seqlens_k,
            local_k_slice.start,
            group_rank(group) * q.shape[0],
            options["causal"],
            options["window_size"],
        )
        return q, k, v

    fields = call_fields(
        packed,
        options["softmax_scale"],
        options["causal"],
        options["window_size"],
        cu_seqlens_q=describe(cu_seqlens_q, varlen_dim=0),
        cu_seqlens_k=describe(cu_seqlens_k, varlen_dim=0),
        heads_k_stride=heads_k_stride,
    )
    q, k, v = run_checks_on_every_rank(group, call, fields, checks)
    plan = _Plan(
        q,
        k,
        args[:4] + (local_k_slice,),
        heads_k_stride,
        (options["softmax_scale"], options["causal"], tuple(options["window_size"])),
        group,
        backend,
    )
    out, lse = _Llama3Attention.apply(q, k, v, plan)
    return (out, lse, None) if options["return_attn_probs"] else out


# The entry points: upstream's signatures (names, order, defaults; annotated here, which upstream's
# are not), each the body above for its layout.


@catalogued
def llama3_flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    heads_k_stride: int,
    local_k_slice: slice,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group: Group = None,
    *,
    backend: AttentionBackend = REFERENCE_BACKEND,
):
    """Attention of this rank's packed rows over their documents' keys on every rank (module
    docstring).

    Args:
        q (torch.Tensor): ``[S / P, h, d]``, this rank's rows of the packed batch.
        k (torch.Tensor): ``[S / P, h_k, d]`` (``h % h_k == 0``).
        v (torch.Tensor): ``[S / P, h_k, d]``.
        cu_seqlens_q (torch.Tensor): int32, from :func:`llama3_flash_attn_prepare_cu_seqlens`.
        cu_seqlens_k (torch.Tensor): int32, likewise.
        max_seqlen_q (int): likewise.
        max_seqlen_k (int): likewise.
        heads_k_stride (int): KV heads gathered per step; divides ``h_k``.
        local_k_slice (slice): the gathered rows this rank's queries need, likewise.
        dropout_p (float): must be 0 (``NotImplementedError`` otherwise).
        softmax_scale (float | None): default ``d ** -0.5``.
        causal (bool): causal inside each document.
        window_size (tuple[int, int]): FlashAttention's ``(left, right)``, inside each document.
        alibi_slopes (None): must be None (``NotImplementedError`` otherwise).
        deterministic (bool): accepted, no effect (forward and backward are deterministic).
        return_attn_probs (bool): also return the LSE (and None for the probabilities).
        group (ProcessGroup | None): the ranks; None is the default group (the whole world).
        backend (AttentionBackend): its ``flash_attn_varlen_func`` is the local attention (the
            kernels' in :mod:`kernels.sequence_parallel`).

    Returns:
        ``out [S / P, h, d]`` in q's dtype, or ``(out, softmax_lse [h, S / P] fp32, None)`` with
        ``return_attn_probs=True``.
    """
    return _llama3(
        "llama3_flash_attn_varlen_func",
        dict(q=q, k=k, v=v),
        (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride, local_k_slice),
        dict(
            dropout_p=dropout_p,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            alibi_slopes=alibi_slopes,
            return_attn_probs=return_attn_probs,
            group=group,
        ),
        backend,
    )


@catalogued
def llama3_flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    heads_k_stride: int,
    local_k_slice: slice,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group: Group = None,
    *,
    backend: AttentionBackend = REFERENCE_BACKEND,
):
    """:func:`llama3_flash_attn_varlen_func` with ``kv [S / P, 2, h_k, d]`` (k and v stacked on dim
    1)."""
    return _llama3(
        "llama3_flash_attn_varlen_kvpacked_func",
        dict(q=q, kv=kv),
        (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride, local_k_slice),
        dict(
            dropout_p=dropout_p,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            alibi_slopes=alibi_slopes,
            return_attn_probs=return_attn_probs,
            group=group,
        ),
        backend,
    )


@catalogued
def llama3_flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    heads_k_stride: int,
    local_k_slice: slice,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group: Group = None,
    *,
    backend: AttentionBackend = REFERENCE_BACKEND,
):
    """:func:`llama3_flash_attn_varlen_func` with ``qkv [S / P, 3, h, d]`` (q, k, v stacked on dim
    1)."""
    return _llama3(
        "llama3_flash_attn_varlen_qkvpacked_func",
        dict(qkv=qkv),
        (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride, local_k_slice),
        dict(
            dropout_p=dropout_p,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            alibi_slopes=alibi_slopes,
            return_attn_probs=return_attn_probs,
            group=group,
        ),
        backend,
    )


#: The three entry points, for :func:`~.ring_flash_attn.with_backend` users
#: (``kernels.sequence_parallel``).
LLAMA3_FLASH_ATTN_FUNCS = (
    llama3_flash_attn_varlen_func,
    llama3_flash_attn_varlen_kvpacked_func,
    llama3_flash_attn_varlen_qkvpacked_func,
)


# --------------------------------------------------------------------------------------------------
# Argument checks of this module
# --------------------------------------------------------------------------------------------------


def check_total_length_divisible(total_length: int, world_size: int) -> None:
    """ring-flash-attention asserts ``total_length % world_size == 0``: every rank holds an equal
    share of the packed batch."""
    if total_length % world_size:
        raise ValueError(
            f"total_length % world_size == 0 does not hold: the packed batch has {total_length} "
            f"tokens (cu_seqlens[-1]), which {world_size} ranks cannot share equally; pad the "
            f"batch to a multiple of {world_size} tokens"
        )


def check_heads_k_stride(nheads_k: int, heads_k_stride: int) -> None:
    """ring-flash-attention asserts ``nheads_k % heads_k_stride == 0``: the strides cover the KV
    heads exactly."""
    if nheads_k % heads_k_stride:
        raise ValueError(
            f"nheads_k % heads_k_stride == 0 does not hold: {nheads_k} KV heads cannot be gathered "
            f"in strides of {heads_k_stride}; pass a heads_k_stride that divides {nheads_k}"
        )


def check_backend_has_varlen(backend: AttentionBackend) -> None:
    """The llama3 schedule's local attention is the backend's ``flash_attn_varlen_func``."""
    if backend.flash_attn_varlen_func is None:
        raise NotImplementedError(
            f"the {backend.name!r} attention backend has no flash_attn_varlen_func, the local "
            "attention of the llama3 schedule; build the AttentionBackend with one, or use "
            "attn_ref.sequence_parallel (the reference) or kernels.sequence_parallel"
        )


def check_local_k_slice(local_k_slice: object, gathered_rows: int) -> None:
    """``local_k_slice`` selects rows of the gathered ``[S, ...]`` keys: a plain slice inside
    them."""
    if (
        not isinstance(local_k_slice, slice)
        or local_k_slice.step not in (None, 1)
        or any(
            isinstance(x, bool) or not isinstance(x, int)
            for x in (local_k_slice.start, local_k_slice.stop)
        )
        or not 0 <= local_k_slice.start <= local_k_slice.stop <= gathered_rows
    ):
        raise ValueError(
            f"local_k_slice must be slice(start, stop) with 0 <= start <= stop <= {gathered_rows} "
            f"(the gathered tokens), got {local_k_slice!r}; pass the slice that "
            "llama3_flash_attn_prepare_cu_seqlens returns"
        )


def check_keys_end_with_queries(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    keys_start: int,
    queries_start: int,
    causal: bool,
    window_size: tuple[int, int],
) -> None:
    """A causal or windowed mask is aligned at each document's last key (FlashAttention's
    bottom-right rule), which is the right place only where that key is the document's last query's
    token: every document's keys end where its queries end, in global positions.

    ``llama3_flash_attn_prepare_cu_seqlens(..., causal=True, ...)`` cuts the keys so; with
    ``causal=False`` it keeps whole documents, which only an unmasked call may use.
    """
    if not causal and tuple(window_size) == (-1, -1):
        return
    query_ends = [queries_start + int(x) for x in cu_seqlens_q[1:].tolist()]
    key_ends = [keys_start + int(x) for x in cu_seqlens_k[1:].tolist()]
    if query_ends != key_ends:
        raise NotImplementedError(
            f"causal={causal}, window_size={tuple(window_size)} needs every document's keys to end "
            f"where its queries end, got query ends {query_ends} and key ends {key_ends} (global "
            "positions): prepare the offsets with llama3_flash_attn_prepare_cu_seqlens(cu_seqlens, "
            "causal=True, ...), or call without a causal or windowed mask"
        )
