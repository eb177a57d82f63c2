"""FA3's checks of its prefill and training entry points, in FA3's words and in FA3's order.

:func:`check_func_inputs` (``flash_attn_func``) and :func:`check_varlen_inputs`
(``flash_attn_varlen_func``) check the tensors of a call, for
:func:`~attn_ref.flash_attn.resolve_func_call` and :func:`~attn_ref.flash_attn.resolve_varlen_call`;
``flash_attn_combine``'s :func:`~attn_ref.flash_attn.check_combine_args` takes its shape and output
checks from here too. The reference and the kernels both call them, so both raise the same errors in
the same order.

Where FA3 checks a condition the reference checks too, the message is FA3's, verbatim, and it
comes at FA3's place: the ``TORCH_CHECK`` s and ``CHECK_SHAPE`` s of ``mha_fwd`` and
``mha_combine`` (``hopper/flash_api.cpp``, Dao-AILab/flash-attention@0251105a; sglang's fork,
sgl-flash-attn@10d78675, has the same texts and adds the sinks' checks). FA3 raises them as
``RuntimeError``; here they are ``ValueError``. ``CHECK_SHAPE(x, sizes...)`` prints the names of
the sizes it expects, not their values: so do these messages (:func:`_check_shape`).

In between, at the place of FA3's check of the same argument, stand the checks whose condition
differs from FA3's, in this package's words: q's dtype (float32 is taken here), the devices (one
device, rather than "on CUDA"), the sinks' dtype (any float, rather than bfloat16), ``qv`` with fp8
inputs (FA3 refuses it in its own words), the fp8 descale factors (checked as
``flash_attn_with_kvcache`` checks them, :func:`~attn_ref.argument_checks._check_descales`, where
FA3 reads them), and the refusals of what the reference does not implement (a gradient through fp8
inputs, which FA3's backward refuses too, or through ``qv``). FA3 reads a few sizes before its shape
checks (the batch size and the head counts); where a tensor of the wrong rank lacks one (FA3 would
fail on the read), the comparison is skipped and the shape check that follows rejects the tensor.
FA3's limits of its kernels (GPU, head dims and their alignment, strides, which its Python wrapper
makes contiguous anyway) are not checked: the reference computes those calls. The values of the
offsets and lengths are checked after all of these (:func:`attn_ref.flash_attn._sequences`).

sglang's ``flash_attn_varlen_func`` first checks ``max_seqlen_q is None or max_seqlen_k is None``
("max_seqlen_q and max_seqlen_k are required for FA3"); the reference keeps FA3's words and place
for that condition, as its positional signature is FA3's.

Notation: ``b`` batch, ``s_q`` / ``s_k`` lengths, ``h`` query heads, ``h_k`` key/value heads, ``d``
q/k head dim, ``d_v`` v head dim.
"""

from __future__ import annotations

from typing import Optional

import torch

from .argument_checks import (
    _check_descales,
    _refuse_fp8_qv,
    _require_device,
    _require_float,
    _require_max_seqlen,
    _require_supported_dtype,
    _require_tensor,
)


def check_func_inputs(q, k, v, qv, q_descale, k_descale, v_descale) -> tuple:
    """``flash_attn_func``'s tensors in ``mha_fwd``'s order: ``q (b, s_q, h, d)``, ``k (b, s_k, h_k,
    d)``, ``v (b, s_k, h_k, d_v)`` and ``qv (b, s_q, h, d_v)`` or None, with ``h_k`` dividing
    ``h``; for fp8 inputs the descales ``(b, h_k)`` fp32 or None, and no gradient asked. Returns
    the descales as the call reads them (None unless fp8)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _require_tensor(name, x)
    if qv is not None:
        _require_tensor("qv", qv)
    _check_dtypes_and_devices(q, k, v)
    _check_batch_sizes(_size(q, 0), _size(k, 0))
    _check_heads(_size(q, -2), _size(k, -2))
    _check_shape(q.dim() == 4, "q", "batch_size, seqlen_q, num_heads, head_size")
    _check_shape(
        k.dim() == 4 and k.shape[-1] == q.shape[-1],
        "k",
        "batch_size_k, seqlen_k, num_heads_k, head_size",
    )
    _check_shape(
        v.dim() == 4 and v.shape[:3] == k.shape[:3],
        "v",
        "batch_size_k, seqlen_k, num_heads_k, head_size_v",
    )
    _check_qv(qv, q, v)
    descales = _check_descales(
        q_descale, k_descale, v_descale, q.dtype, q.shape[0], k.shape[-2], q.device
    )
    _refuse_fp8_gradient(q, k, v)
    _refuse_qv_gradient(q, k, v, qv)
    return descales


def check_varlen_inputs(
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
) -> tuple:
    """``flash_attn_varlen_func``'s tensors in ``mha_fwd``'s order (then sglang's sinks): ``q
    (total_q, h, d)``, ``k (total_k, h_k, d)``, ``v (total_k, h_k, d_v)``, the int32 offsets
    ``cu_seqlens_q`` and ``cu_seqlens_k`` ``(b + 1,)`` with ``max_seqlen_q`` and ``max_seqlen_k``
    (ints), ``seqused_q`` and ``seqused_k`` ``(b,)`` int32 or None, ``qv (total_q, h, d_v)`` or
    None, ``sinks (h,)`` or None; for fp8 inputs the descales ``(b, h_k)`` fp32 or None, and no
    gradient asked. The offsets' values are not read here. Returns the descales as the call reads
    them (None unless fp8)."""
    for name, x in (
        ("q", q),
        ("k", k),
        ("v", v),
        ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_k", cu_seqlens_k),
    ):
        _require_tensor(name, x)
    optional = (("seqused_q", seqused_q), ("seqused_k", seqused_k), ("qv", qv), ("sinks", sinks))
    for name, x in optional:
        if x is not None:
            _require_tensor(name, x)
    _check_dtypes_and_devices(q, k, v)
    _require_device("cu_seqlens_q", cu_seqlens_q, q.device)
    _check_index_dtype(cu_seqlens_q.dtype == torch.int32, "cu_seqlens_q", "torch.int32")
    _require_max_seqlen("max_seqlen_q", max_seqlen_q, "cu_seqlens_q")
    _require_device("cu_seqlens_k", cu_seqlens_k, q.device)
    _check_index_dtype(cu_seqlens_k.dtype == torch.int32, "cu_seqlens_k", "torch.int32")
    _require_max_seqlen("max_seqlen_k", max_seqlen_k, "cu_seqlens_k")
    _check_batch_sizes(_size(cu_seqlens_q, 0), _size(cu_seqlens_k, 0))
    _check_heads(_size(q, -2), _size(k, -2))
    _check_shape(q.dim() == 3, "q", "total_q, num_heads, head_size")
    _check_shape(cu_seqlens_q.dim() == 1, "cu_seqlens_q", "batch_size + 1")
    _check_shape(
        k.dim() == 3 and k.shape[-1] == q.shape[-1], "k", "total_k, num_heads_k, head_size"
    )
    _check_shape(
        v.dim() == 3 and v.shape[:2] == k.shape[:2], "v", "total_k, num_heads_k, head_size_v"
    )
    _check_shape(cu_seqlens_k.shape == cu_seqlens_q.shape, "cu_seqlens_k", "batch_size + 1")
    batch = cu_seqlens_q.shape[0] - 1
    if seqused_q is not None:
        _check_index_dtype(seqused_q.dtype == torch.int32, "seqused_q", "int32")
        _require_device("seqused_q", seqused_q, q.device)
        _check_shape(seqused_q.shape == (batch,), "seqused_q", "batch_size")
    if seqused_k is not None:
        _check_index_dtype(seqused_k.dtype == torch.int32, "seqused_k", "int32")
        _require_device("seqused_k", seqused_k, q.device)
        _check_shape(seqused_k.shape == (batch,), "seqused_k", "batch_size")
    _check_qv(qv, q, v)
    descales = _check_descales(
        q_descale, k_descale, v_descale, q.dtype, batch, k.shape[-2], q.device
    )
    _refuse_fp8_gradient(q, k, v)
    _check_sinks(sinks, q)
    _refuse_qv_gradient(q, k, v, qv)
    return descales


def _check_dtypes_and_devices(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q's dtype one the package computes; k and v in q's dtype (FA3's words), on q's device."""
    _require_supported_dtype(q)
    _check_same_dtype(k.dtype == q.dtype, "key")
    _check_same_dtype(v.dtype == q.dtype, "value")
    _require_device("k", k, q.device)
    _require_device("v", v, q.device)


def _size(x: torch.Tensor, dim: int) -> Optional[int]:
    """``x.shape[dim]``, or None when ``x`` has no such dimension."""
    return x.shape[dim] if -x.dim() <= dim < x.dim() else None


def _check_same_dtype(ok: bool, other: str) -> None:
    """FA3's check that k (``other = "key"``) or v (``"value"``) has q's dtype."""
    if not ok:
        raise ValueError(f"query and {other} must have the same dtype")


def _check_index_dtype(ok: bool, name: str, dtype: str) -> None:
    """FA3's check of an index tensor's dtype, int32 (``dtype`` is how FA3 spells it there)."""
    if not ok:
        raise ValueError(f"{name} must have dtype {dtype}")


def _check_batch_sizes(batch: Optional[int], batch_k: Optional[int]) -> None:
    """q's batch size is k's: ``q.shape[0]`` and ``k.shape[0]``, or the lengths of
    ``cu_seqlens_q`` and ``cu_seqlens_k`` (each ``b + 1``); compared where both sizes exist."""
    if batch is not None and batch_k is not None and batch != batch_k:
        raise ValueError("batch_size must be equal to batch_size_k")


def _check_heads(num_heads: Optional[int], num_heads_k: Optional[int]) -> None:
    """GQA: ``h_k`` divides ``h`` (``h_k = 0`` divides nothing; FA3 would divide by zero)."""
    if num_heads is None or num_heads_k is None:
        return
    if num_heads_k == 0 or num_heads % num_heads_k != 0:
        raise ValueError("Number of heads in key/value must divide number of heads in query")


def _check_shape(ok: bool, name: str, dims: str) -> None:
    """FA3's ``CHECK_SHAPE(name, dims...)``: the message names the sizes ``dims``, not their
    values."""
    if not ok:
        raise ValueError(f"{name} must have shape ({dims})")


def _check_qv(qv: Optional[torch.Tensor], q: torch.Tensor, v: torch.Tensor) -> None:
    """``qv`` (MLA) in q's dtype, on q's device, of q's shape with v's head dim (FA3 calls it
    ``q_v``); not with fp8 inputs (FA3's first check of ``q_v``)."""
    if qv is None:
        return
    _refuse_fp8_qv(q.dtype)
    if qv.dtype != q.dtype:
        raise ValueError("q_v must have the same dtype as query")
    _require_device("qv", qv, q.device)
    shape_ok = qv.shape == (*q.shape[:-1], v.shape[-1])
    if q.dim() == 4:
        _check_shape(shape_ok, "q_v", "batch_size, seqlen_q, num_heads, head_size_v")
    else:
        _check_shape(shape_ok, "q_v", "total_q, num_heads, head_size_v")


def _refuse_fp8_gradient(q, k, v) -> None:
    """fp8 inputs are forward only (FA3's backward refuses fp8): refused when a gradient is
    asked."""
    if (
        q.dtype == torch.float8_e4m3fn
        and torch.is_grad_enabled()
        and any(x.requires_grad for x in (q, k, v))
    ):
        raise NotImplementedError(
            "fp8 inputs have no backward (FA3's backward refuses fp8): run the call under "
            "torch.no_grad() (or detach q, k and v) to compute it without gradients"
        )


def _check_sinks(sinks: Optional[torch.Tensor], q: torch.Tensor) -> None:
    """sglang's sinks: one float logit per query head, ``(h,)``, on q's device."""
    if sinks is None:
        return
    _require_float("sinks", sinks)
    _require_device("sinks", sinks, q.device)
    _check_shape(sinks.shape == (q.shape[-2],), "sinks", "num_heads")


def _refuse_qv_gradient(q, k, v, qv) -> None:
    """``qv`` has no backward here (FA3's backward ignores it): refused when a gradient is asked."""
    if qv is not None and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, qv)):
        raise NotImplementedError(
            "qv has no backward in the reference: run the call under torch.no_grad() (or detach "
            "q, k, v and qv) to compute it without gradients"
        )


def _check_output_contiguous(out: torch.Tensor) -> None:
    """A given ``out`` has a contiguous last dimension (FA3's check; a 0-d ``out`` has none)."""
    if out.dim() == 0 or out.stride(-1) != 1:
        raise ValueError("Output tensor must have contiguous last dimension")
