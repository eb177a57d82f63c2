"""The oracle of the prefill section: FA3's ``flash_attn_func``, ``flash_attn_varlen_func``,
``flash_attn_qkvpacked_func`` and ``flash_attn_combine``, written densely.

A call is read as a list of sequences, each a range of query rows and a range of keys: batch entry
``i`` of ``flash_attn_func`` (and of the q, k and v that ``flash_attn_qkvpacked_func`` stacks), or
sequence ``i`` of ``cu_seqlens_q`` / ``cu_seqlens_k``, of which only the first ``seqused_q[i]`` rows
and ``seqused_k[i]`` keys take part. Each sequence is attended alone by the dense formula of
:func:`attn_ref.dense.attention` (explicit bottom-right masks, GQA heads repeated, sinks as an extra
logit column); rows that take no part get ``out = 0``, ``lse = -inf``. It shares no code with the
implementations it checks.

``upcast=True`` computes in float64 (the oracle); ``upcast=False`` in the inputs' dtype with the
scale on the keys, FlashAttention's low-precision baseline for its tolerance rule
(:func:`tolerance.fa_error`). Both are differentiable (no in-place operation), so
:func:`gradients` is autograd through them: float64 reference gradients, and the baseline's.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..dense import attention

#: The differentiable inputs of each function, in the order the gradient checks list them.
LEAVES = {
    "flash_attn_func": ("q", "k", "v"),
    "flash_attn_varlen_func": ("q", "k", "v", "sinks"),
    "flash_attn_qkvpacked_func": ("qkv",),
}
OPTIONS = ("softmax_scale", "causal", "window_size", "attention_chunk", "softcap")


def split_qkv(qkv: torch.Tensor, num_heads_q: Optional[int]):
    """``(q, k, v)`` of a stacked ``qkv``: ``(b, s, 3, h, d)`` along dim 2, or ``(b, s, h + 2 h_k,
    d)`` split ``h, h_k, h_k`` along the heads (``num_heads_q = h``)."""
    if qkv.dim() == 5:
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    h_k = (qkv.shape[2] - num_heads_q) // 2
    return qkv.split([num_heads_q, h_k, h_k], dim=2)


def _sequences(function: str, args: dict):
    """``(q, k, v, [(q_start, rows, used_rows, k_start, used_keys)], batch_shape)``: the packed
    ``q (total_q, h, d)``, ``k``, ``v (total_k, h_k, ·)`` and the sequences of a call;
    ``batch_shape`` is ``(b, s_q)`` for the batched functions, None for varlen."""
    if function == "flash_attn_varlen_func":
        q, k, v = args["q"], args["k"], args["v"]
        starts_q, starts_k = args["cu_seqlens_q"].tolist(), args["cu_seqlens_k"].tolist()
        lengths_q = [b - a for a, b in zip(starts_q, starts_q[1:])]
        lengths_k = [b - a for a, b in zip(starts_k, starts_k[1:])]
        used_q = lengths_q if args.get("seqused_q") is None else args["seqused_q"].tolist()
        used_k = lengths_k if args.get("seqused_k") is None else args["seqused_k"].tolist()
        sequences = list(zip(starts_q, lengths_q, used_q, starts_k, used_k))
        return q, k, v, sequences, None
    if function == "flash_attn_qkvpacked_func":
        q, k, v = split_qkv(args["qkv"], args.get("num_heads_q"))
    else:
        q, k, v = args["q"], args["k"], args["v"]
    b, s_q, s_k = q.shape[0], q.shape[1], k.shape[1]
    sequences = [(i * s_q, s_q, s_q, i * s_k, s_k) for i in range(b)]
    return q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), sequences, (b, s_q)


def attend(function: str, args: dict, upcast: bool = True):
    """``(out, lse)`` of a call of ``function`` with the keyword arguments ``args``, in the
    function's layouts: ``out (b, s_q, h, d_v)`` and ``lse (b, h, s_q)``, or ``out (total_q, h,
    d_v)`` and ``lse (h, total_q)`` for varlen. float64 with ``upcast``, else the inputs' dtype
    (``lse`` fp32 then); differentiable in the tensors of ``args``."""
    q, k, v, sequences, batch_shape = _sequences(function, args)
    compute = torch.float64 if upcast else q.dtype
    q, k, v = (x.to(compute) for x in (q, k, v))
    sinks = args.get("sinks")
    options = {name: args[name] for name in OPTIONS if name in args}
    h, dv = q.shape[1], v.shape[-1]
    lse_dtype = torch.promote_types(compute, torch.float32)
    outs, lses = [], []
    for q0, rows, used, k0, keys in sequences:
        if used:
            o, l = attention(
                q[None, q0 : q0 + used],
                k[None, k0 : k0 + keys],
                v[None, k0 : k0 + keys],
                sinks=sinks,
                upcast=upcast,
                **options,
            )
            outs.append(o[0])
            lses.append(l[0])
        outs.append(q.new_zeros(rows - used, h, dv))  # rows that take no part
        lses.append(torch.full((h, rows - used), float("-inf"), dtype=lse_dtype, device=q.device))
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)  # (total_q, h, dv), (h, total_q)
    if batch_shape is not None:
        out = out.unflatten(0, batch_shape)
        lse = lse.unflatten(1, batch_shape).transpose(0, 1)
    return out, lse


def used_rows(function: str, args: dict) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``(rows_q, rows_k)``: bool masks of the query rows (``total_q``) and keys (``total_k``) that
    take part in a varlen call with ``seqused_q`` / ``seqused_k`` (FA3 leaves the other rows'
    outputs unwritten: the suite does not compare them); None for the other calls."""
    if function != "flash_attn_varlen_func":
        return None
    _, _, _, sequences, _ = _sequences(function, args)
    rows_q = torch.zeros(args["q"].shape[0], dtype=torch.bool)
    rows_k = torch.zeros(args["k"].shape[0], dtype=torch.bool)
    for q0, _, used, k0, keys in sequences:
        rows_q[q0 : q0 + used] = True
        rows_k[k0 : k0 + keys] = True
    return rows_q, rows_k


def gradients(function: str, args: dict, upcast: bool = True) -> dict[str, torch.Tensor]:
    """The gradients of ``Σ out · dout`` (``dout = args["dout"]``) with respect to the inputs of
    :data:`LEAVES` that the call has: float64 with ``upcast``, else the low-precision baseline's
    (each in its input's dtype)."""
    leaves = {
        name: (args[name].double() if upcast else args[name].clone()).requires_grad_()
        for name in LEAVES[function]
        if args.get(name) is not None
    }
    out, _ = attend(function, {**args, **leaves}, upcast)
    if not out.requires_grad:  # no row takes part: nothing depends on the inputs
        return {name: torch.zeros_like(leaf) for name, leaf in leaves.items()}
    dout = args["dout"].to(out.dtype)
    grads = torch.autograd.grad(out, list(leaves.values()), dout, allow_unused=True)
    return {
        name: torch.zeros_like(leaf) if grad is None else grad
        for (name, leaf), grad in zip(leaves.items(), grads)
    }


def sink_terms(args: dict) -> torch.Tensor:
    """``(h,)`` float64: ``Σ_i e^{sink_h - lse_ih} Σ_c |dout_ihc · out_ihc|``, the sum of the
    magnitudes of the terms of the sinks' gradient ``dsink_h = -Σ_i e^{sink_h - lse_ih} (dout_ih ·
    out_ih)`` of a varlen call: the scale of its rounding noise. (A backward takes ``dout_ih ·
    out_ih`` from the output rounded to the input dtype, as FA's does; the sum can cancel to far
    less than its terms.)"""
    double = {name: args[name].double() for name in ("q", "k", "v", "sinks")}
    out, lse = attend("flash_attn_varlen_func", {**args, **double}, upcast=True)
    weights = torch.exp(double["sinks"][:, None] - lse).where(lse.isfinite(), 0)  # (h, total_q)
    return (weights * (args["dout"].double() * out).abs().sum(-1).T).sum(-1)


def combine(args: dict, upcast: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out (b, s, h, d), lse (b, s, h))`` of ``flash_attn_combine``: ``lse = log Σ_s e^{lse_s}``
    and ``out = Σ_s e^{lse_s - lse} out_s`` over the splits, in float64 (``upcast``), else in fp32
    with ``out`` rounded to ``out_dtype`` (default fp32) and ``lse`` fp32."""
    compute = torch.float64 if upcast else torch.float32
    out_partial, lse_partial = (args[n].to(compute) for n in ("out_partial", "lse_partial"))
    lse = torch.logsumexp(lse_partial, dim=0)  # (b, s, h)
    out = (torch.exp(lse_partial - lse)[..., None] * out_partial).sum(0)  # (b, s, h, d)
    if upcast:
        return out, lse
    return out.to(args.get("out_dtype") or torch.float32), lse
