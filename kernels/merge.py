"""Merging attention states through their log-sum-exp: the split-KV combine and ring-attention ⊕.

An attention state over a key set is ``(o, lse)`` with natural-log ``lse``; for disjoint key sets
(:mod:`attn_ref.merge`)::

    lse = log(e^{lse_a} + e^{lse_b})          o = e^{lse_a - lse} o_a + e^{lse_b - lse} o_b

computed stably with ``m = max(lse_a, lse_b)`` subtracted first (``m = 0`` when both are ``-inf``,
so an empty pair gives ``(0, -inf)``, never NaN). ``+inf`` (FA3's zero-length-KV marker) counts as
``-inf``, as in the reference and sglang's ``merge_state``.

One kernel folds ``n`` states left to right, ``((s_0 ⊕ s_1) ⊕ s_2) ⊕ ...``, exactly as the
reference reduces its split partials. State 0 and states ``1..n-1`` come through separate pointers
and strides, so the same kernel serves

* the split-KV combine (state 0 = ``out_accum[0]``, the rest = ``out_accum[1:]``), writing the final
  output in its own layout and dtype;
* :func:`merge_attention_states` (two separate tensors, ``n = 2``);
* :func:`combine_attention_states` (``n`` stacked states).

Every state is addressed as ``(A0, A1, A2, dim)`` (LSE ``(A0, A1, A2)``) through strides; the grid
is ``(cdiv(A2, BLOCK_R), A1, A0)`` and a program merges ``BLOCK_R`` rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attn_ref.error_notes import catalogued
from attn_ref.merge import check_combine_states, check_merge_states

from .launch import Launch, explicit_rounding, next_power_of_2
from .numerics import store_as


@catalogued
def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out_a, lse_a) ⊕ (out_b, lse_b)``, as :func:`attn_ref.merge.merge_attention_states`.

    Shapes: ``out_* (..., dim)``, ``lse_* (...)`` = ``out.shape[:-1]`` (sglang's ``merge_state``
    layout: ``out (s_q, h, d)``, ``lse (s_q, h)``), natural-log LSE, any float dtype. Returns fp32
    ``(out (..., dim), lse (...))``. The inputs are read in place (no stacking). Arguments are
    checked by :func:`attn_ref.merge.check_merge_states`, as in the reference.
    """
    check_merge_states(out_a, lse_a, out_b, lse_b)
    rows_a, rows_b = _rows(out_a), _rows(out_b)  # (R, dim) each
    return _fold(rows_a[None, None], lse_a.reshape(1, 1, -1), rows_b[None, None, None],
                 lse_b.reshape(1, 1, 1, -1), out_a.shape)


@catalogued
def combine_attention_states(out_partials: torch.Tensor, lse_partials: torch.Tensor):
    """Fold ``n`` attention states ``s_0 ⊕ s_1 ⊕ ... ⊕ s_{n-1}`` (e.g. the split-KV partials).

    Shapes: ``out_partials (n, ..., dim)``, ``lse_partials (n, ...)``. Returns fp32
    ``(out (..., dim), lse (...))``. ``+inf`` LSEs are read as ``-inf``, also when ``n = 1``.
    Arguments are checked by :func:`attn_ref.merge.check_combine_states`, as in the reference.
    """
    check_combine_states(out_partials, lse_partials)
    n = out_partials.shape[0]
    states = _rows(out_partials, leading=1)[:, None, None]  # (n, 1, 1, R, dim)
    lses = lse_partials.reshape(n, 1, 1, -1)  # (n, 1, 1, R)
    return _fold(states[0], lses[0], states[1:], lses[1:], out_partials.shape[1:])


def _rows(x: torch.Tensor, leading: int = 0) -> torch.Tensor:
    """``(lead..., ..., dim)`` -> ``(lead..., R, dim)`` with a contiguous channel axis."""
    x = x.reshape(*x.shape[:leading], -1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


def _fold(first_out, first_lse, rest_out, rest_lse, out_shape):
    """Run the merge kernel on row views; returns fp32 ``(out (out_shape), lse
    (out_shape[:-1]))``."""
    # (1, 1, R, dim)
    out = torch.empty(first_out.shape, dtype=torch.float32, device=first_out.device)
    lse = torch.empty(first_lse.shape, dtype=torch.float32, device=first_out.device)  # (1, 1, R)
    if out.numel() > 0:
        plan_merge(first_out, first_lse, rest_out, rest_lse, out, lse).run()
    return out.view(out_shape), lse.view(out_shape[:-1])


def plan_merge(first_out, first_lse, rest_out, rest_lse, out, lse) -> Launch:
    """Launch that folds state 0 with states ``1..n-1`` into ``(out, lse)``.

    Shapes: ``first_out (A0, A1, A2, dim)``, ``first_lse (A0, A1, A2)``, ``rest_out (n-1, A0, A1,
    A2, dim)``, ``rest_lse (n-1, A0, A1, A2)``, ``out (A0, A1, A2, dim)`` (any float dtype), ``lse
    (A0, A1, A2)`` fp32. Every ``dim`` axis must have stride 1.
    """
    a0, a1, a2, dim = out.shape
    block_dim = max(16, next_power_of_2(dim))
    # rows per program (fixed: fewer compiled variants)
    block_r = max(1, min(64, 4096 // block_dim))
    args = dict(
        first_out_ptr=first_out, first_lse_ptr=first_lse,
        rest_out_ptr=rest_out, rest_lse_ptr=rest_lse,
        out_ptr=out, lse_ptr=lse, num_rest=rest_out.shape[0], rows=a2,
        stride_fo=tuple(first_out.stride()[:3]), stride_fl=tuple(first_lse.stride()),
        stride_ro=tuple(rest_out.stride()[:4]), stride_rl=tuple(rest_lse.stride()),
        stride_o=tuple(out.stride()[:3]), stride_l=tuple(lse.stride()),
    )
    constexprs = dict(DIM=dim, BLOCK_R=block_r, BLOCK_DIM=block_dim,
                      ROUND_TO=explicit_rounding(out.dtype))
    return Launch(_merge_states_kernel, (triton.cdiv(a2, block_r), a1, a0), args, constexprs,
                  num_warps=4, num_stages=1, dummy_device=out.device)


@triton.jit(do_not_specialize=["num_rest", "rows"])
def _merge_states_kernel(
    first_out_ptr,  # (A0, A1, A2, dim): state 0
    first_lse_ptr,  # (A0, A1, A2)
    rest_out_ptr,  # (n - 1, A0, A1, A2, dim): states 1 .. n-1
    rest_lse_ptr,  # (n - 1, A0, A1, A2)
    out_ptr,  # (A0, A1, A2, dim) merged output, any float dtype
    lse_ptr,  # (A0, A1, A2) fp32 merged LSE
    num_rest,  # n - 1
    rows,  # A2
    stride_fo, stride_fl,  # state 0: (A0, A1, A2) strides of out (dim contiguous) and lse
    stride_ro, stride_rl,  # states 1 .. n-1: (state, A0, A1, A2) strides of out and lse
    stride_o, stride_l,  # the merged out and lse: (A0, A1, A2) strides
    DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_DIM: tl.constexpr, ROUND_TO: tl.constexpr,
):
    pid_r, a1, a0 = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    offs_r = (pid_r * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # (BLOCK_R,) index along A2
    offs_d = tl.arange(0, BLOCK_DIM)  # (BLOCK_DIM,)
    row_mask = offs_r < rows  # (BLOCK_R,)
    mask = row_mask[:, None] & (offs_d[None, :] < DIM)  # (BLOCK_R, BLOCK_DIM)

    # (BLOCK_R, BLOCK_DIM), (BLOCK_R,): state 0's out and lse
    first_out_ptrs = (_row_ptrs(first_out_ptr, stride_fo[0], stride_fo[1], stride_fo[2], a0, a1,
                                offs_r)[:, None] + offs_d[None, :])
    first_lse_ptrs = _row_ptrs(first_lse_ptr, stride_fl[0], stride_fl[1], stride_fl[2], a0, a1,
                               offs_r)
    # (BLOCK_R, BLOCK_DIM), (BLOCK_R,)
    o, lse = _load_state(first_out_ptrs, first_lse_ptrs, mask, row_mask)
    # (BLOCK_R, BLOCK_DIM), (BLOCK_R,): state 1's
    rest_out_ptrs = (_row_ptrs(rest_out_ptr, stride_ro[1], stride_ro[2], stride_ro[3], a0, a1,
                               offs_r)[:, None] + offs_d[None, :])
    rest_lse_ptrs = _row_ptrs(rest_lse_ptr, stride_rl[1], stride_rl[2], stride_rl[3], a0, a1,
                              offs_r)
    for _ in range(num_rest):
        o_s, lse_s = _load_state(rest_out_ptrs, rest_lse_ptrs, mask, row_mask)
        o, lse = _merge_pair(o, lse, o_s, lse_s)
        rest_out_ptrs += stride_ro[0]  # next state (64-bit pointer arithmetic)
        rest_lse_ptrs += stride_rl[0]

    out_ptrs = (_row_ptrs(out_ptr, stride_o[0], stride_o[1], stride_o[2], a0, a1, offs_r)[:, None]
                + offs_d[None, :])  # (BLOCK_R, BLOCK_DIM)
    store_as(out_ptrs, o, mask, ROUND_TO)
    lse_ptrs = _row_ptrs(lse_ptr, stride_l[0], stride_l[1], stride_l[2], a0, a1, offs_r)
    tl.store(lse_ptrs, lse, mask=row_mask)


@triton.jit
def _row_ptrs(ptr, stride0, stride1, stride2, a0, a1, offs_r):
    """(BLOCK_R,) pointers to rows ``offs_r`` (BLOCK_R,) of an ``(A0, A1, A2, ...)`` tensor at
    ``[a0, a1]``, its strides ``stride0 .. stride2``."""
    return ptr + a0 * stride0 + a1 * stride1 + offs_r * stride2


@triton.jit
def _load_state(out_ptrs, lse_ptrs, mask, row_mask):
    """Load ``o`` (R, BLOCK_DIM) and ``lse`` (R,) as fp32, with ``+inf`` LSEs read as ``-inf``."""
    o = tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptrs, mask=row_mask, other=float("-inf")).to(tl.float32)
    return o, tl.where(lse == float("inf"), float("-inf"), lse)


@triton.jit
def _merge_pair(o_a, lse_a, o_b, lse_b):
    """``(o_a, lse_a) ⊕ (o_b, lse_b)`` on (R, BLOCK_DIM) / (R,) fp32 tiles, stable form."""
    m = tl.maximum(lse_a, lse_b)
    shift = tl.where(m == float("-inf"), 0.0, m)  # both empty: weights 0, not NaN
    w_a = tl.exp(lse_a - shift)
    w_b = tl.exp(lse_b - shift)
    total = w_a + w_b
    inv = tl.where(total > 0.0, 1.0 / tl.where(total > 0.0, total, 1.0), 0.0)
    o = (w_a * inv)[:, None] * o_a + (w_b * inv)[:, None] * o_b
    lse = tl.where(total > 0.0, shift + tl.log(tl.where(total > 0.0, total, 1.0)), float("-inf"))
    return o, lse
