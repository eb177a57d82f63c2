"""The small checks of one argument each, shared by the checks of ``flash_attn_with_kvcache``.

:mod:`attn_ref.validation` (the static checks) and :mod:`attn_ref.value_checks` call them; each
raises one catalogued error, with the argument's name in its message. ``_require_*`` check a
tensor's type, rank, shape, dtype and device, or the range of index values; the others read an
option's value as FA3 does: ints in int64 range (:func:`_int64`, :func:`_require_int`), bools
(:func:`_flag`), reals used in float32 (:func:`_require_real`, :func:`_require_float32_finite`,
:func:`_require_base2_finite`, :func:`_float32`), and sglang's default ``softmax_scale``
(:func:`_default_scale`). The mask options are read by :class:`attn_ref.masks.AttentionMask`.
"""

from __future__ import annotations

import math
import numbers
import operator
import struct
from typing import Optional, Sequence

import torch

from .call import FLOAT32_MAX, INT64_MAX, SUPPORTED_DTYPES

#: log2(e): FA3 folds it into the logit factor for its base-2 softmax (``exp2``).
LOG2E = math.log2(math.e)


def _require_tensor(name: str, x: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def _head_dim(name: str, x: torch.Tensor) -> int:
    """``x.shape[-1]`` (the head dim); a 0-d tensor has none."""
    if x.dim() == 0:
        raise ValueError(f"{name} must have a last (head) dimension, got a 0-d tensor")
    return x.shape[-1]


def _require_contiguous_last_dim(name: str, x: torch.Tensor) -> None:
    # Same text as sglang's ``assert k_cache.stride(-1) == 1, "..."`` (and the v_cache one).
    _head_dim(name, x)
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must have contiguous last dimension")


def _require_ndim(name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}")


def _require_shape(name: str, x: torch.Tensor, shape: Sequence[int], layout: str) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} {layout}, got {tuple(x.shape)}")


def _require_dtype(name: str, x: torch.Tensor, dtype: torch.dtype) -> None:
    if x.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {x.dtype}")


def _require_supported_dtype(q: torch.Tensor) -> None:
    """q's dtype is one the package computes: fp16, bf16, fp32 or fp8 e4m3
    (:data:`~attn_ref.call.SUPPORTED_DTYPES`)."""
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"q must have dtype float16, bfloat16, float32 or float8_e4m3fn, got {q.dtype}"
        )


def _check_descales(
    q_descale, k_descale, v_descale, dtype: torch.dtype, batch: int, num_heads_k: int, device
) -> tuple:
    """FA3's fp8 descale factors: each ``(batch, h_k)`` float32 on q's ``device`` or None (factor
    1), read only when the inputs' ``dtype`` is fp8 (FA3 ignores them otherwise). ``batch`` is the
    batch size, or the number of sequences of packed inputs. Returns the three as the call reads
    them (None for other dtypes)."""
    if dtype != torch.float8_e4m3fn:
        return None, None, None
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if x is not None:
            _require_tensor(name, x)
            _require_device(name, x, device)
            _require_dtype(name, x, torch.float32)
            _require_shape(name, x, (batch, num_heads_k), "(batch, h_k)")
    return q_descale, k_descale, v_descale


def _refuse_fp8_qv(dtype: torch.dtype) -> None:
    """``qv`` (MLA) is not taken with fp8 inputs (FA3's ``q_v`` is fp16 / bf16 only)."""
    if dtype == torch.float8_e4m3fn:
        raise ValueError("qv is not supported with float8_e4m3fn inputs")


def _require_float(name: str, x: torch.Tensor) -> None:
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name} must have a floating-point dtype, got {x.dtype}")


def _require_device(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{name} must be on the same device as q ({device}), got {x.device}")


def _require_cu_seqlens(
    name: str, cu: torch.Tensor, total: int, total_name: str, read_values: bool
) -> None:
    """Check an int32 ``(b + 1,)`` offsets tensor: starts at 0, never decreases, ends at ``total``.

    The values are read (a value check, run here because they define the batch structure) only if
    ``read_values``, or if there are fewer than two entries (a call that fails: at most one
    value)."""
    _require_dtype(name, cu, torch.int32)
    _require_ndim(name, cu, 1, "(batch + 1,) offsets")
    if not read_values and cu.shape[0] >= 2:
        return
    offsets = cu.tolist()
    monotone = all(a <= b for a, b in zip(offsets, offsets[1:]))
    if len(offsets) < 2 or offsets[0] != 0 or not monotone or offsets[-1] != total:
        raise ValueError(
            f"{name} must start at 0, never decrease and end at {total_name}={total}, got {offsets}"
        )


def _require_heads_divide(num_heads: int, num_heads_k: int) -> None:
    """GQA: each key/value head serves ``num_heads / num_heads_k`` query heads."""
    if num_heads_k == 0 or num_heads % num_heads_k != 0:
        raise ValueError(
            f"the number of key/value heads ({num_heads_k}) must divide the number of query "
            f"heads ({num_heads})"
        )


def _require_index_range(name: str, values: list[int], low: int, high: int) -> None:
    """Every value must lie in ``[low, high)``."""
    bad = [x for x in values if not low <= x < high]
    if bad:
        raise ValueError(f"{name} values must lie in [{low}, {high}), got {bad[:8]}")


def _require_int32_vector(name: str, x, batch: int, device: torch.device) -> None:
    """An optional ``(b,)`` int32 tensor on q's device (its values go to :func:`batch_table`)."""
    if x is None:
        return
    _require_tensor(name, x)
    _require_device(name, x, device)
    _require_dtype(name, x, torch.int32)
    _require_shape(name, x, (batch,), "(batch,)")


def _int64(x) -> Optional[int]:
    """``x`` as an int if it is one (Python or numpy int, integer 1-element tensor) within int64, as
    FA3's int64 arguments need, else None. Bools and floats are not ints here."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
        return None
    try:
        value = operator.index(x)
    except TypeError:
        return None
    return value if -INT64_MAX - 1 <= value <= INT64_MAX else None


def _flag(name: str, x, none_is_false: bool = False) -> bool:
    """A bool argument: a bool (Python or NumPy), an int 0 / 1, or a 1-element bool or integer
    tensor holding 0 / 1; ``None`` too where sglang only tests the value's truth (``only_qv``)."""
    if x is None and none_is_false:
        return False
    if isinstance(x, torch.Tensor):
        scalar = (
            x.numel() == 1
            and x.device.type != "meta"
            and not (x.dtype.is_floating_point or x.is_complex())
        )
        value = x.item() if scalar else None
    elif isinstance(x, numbers.Integral) or type(x).__name__ in ("bool_", "bool"):
        value = int(x)
    else:
        value = None
    if value not in (0, 1):
        raise TypeError(f"{name} must be a bool, got {x!r}")
    return bool(value)


def _require_real(name: str, x) -> float:
    """A real Python / numpy number (not a bool) as a float."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


def _require_float32_finite(name: str, x: float) -> None:
    """FA3 computes with ``name`` as a float32: NaN, inf and values beyond its range are garbage
    there."""
    if not (math.isfinite(x) and abs(x) <= FLOAT32_MAX):
        raise ValueError(f"{name} must be finite in float32 (|{name}| <= 3.4e38), got {x!r}")


def _require_base2_finite(name: str, x: float) -> None:
    """FA3 runs the softmax in base 2: it computes with ``name · log2(e)`` (the logit factor,
    ``softcap`` when on, else ``softmax_scale``) as a float32, which overflows to inf beyond
    :data:`~attn_ref.call.FLOAT32_MAX` ``/ log2(e)`` (then the logits are inf or NaN there). ``x``
    is checked as the float32 value FA3 gets."""
    if abs(_float32(x)) * LOG2E > FLOAT32_MAX:
        raise ValueError(
            f"{name} · log2(e) must be finite in float32 (|{name}| <= 2.3587e38), got {x!r}"
        )


def _float32(x: float) -> float:
    """``x`` (finite, within float32's range) rounded to float32, the precision FA3's kernels get it
    in."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _default_scale(what: str, dims: int) -> float:
    """sglang's default ``softmax_scale = dims ** -0.5``, undefined for a zero head dim."""
    if dims == 0:
        raise ValueError(
            f"softmax_scale=None means {what} ** -0.5, which is undefined for a head dim "
            f"of 0; pass softmax_scale"
        )
    return dims ** (-0.5)


def _require_max_seqlen(name: str, x, cu_name: str) -> int:
    """The host-side longest length that comes with packed offsets ``cu_name``: given (FA3's
    ``mha_fwd`` check, in its words), an int (:func:`_require_int`)."""
    if x is None:
        raise ValueError(f"{name} must be provided if {cu_name} is provided")
    return _require_int(name, x)


def _require_int(name: str, x) -> int:
    """An int argument (Python / numpy int or integer 1-element tensor; not a bool)."""
    value = _int64(x)
    if value is None:
        raise TypeError(f"{name} must be an int in int64 range, got {x!r}")
    return value
