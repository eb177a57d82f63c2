"""How the kernels are launched: one :class:`Launch` record per kernel call, on a GPU or in the
interpreter.

Every launcher in this package first *plans* a call (kernel, grid, runtime arguments, compile-time
constants, warps, stages) as a :class:`Launch`, then runs it. The same plan is what
``tests/test_kernel_compile.py`` hands to ``triton.compile`` for sm_90 / sm_80, so the variants that
CI compiles are exactly the ones the launchers run.

Interpreter mode (``TRITON_INTERPRET=1``, set before this package is imported) runs the kernels with
numpy on the CPU. Its bf16 arithmetic is wrong and its fp32 -> bf16 / fp8 conversions round wrongly,
so
:func:`compute_dtype` upcasts bf16 (and fp8) tiles to fp32 right after loading and
:func:`explicit_rounding` makes stores round to nearest even first (:mod:`kernels.numerics`). On a
GPU neither happens.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import triton.language as tl

from .backend import interpreter_requested, require_backend

# : True when Triton runs kernels through its numpy interpreter (decided at import time, as Triton
# does).
INTERPRETING = interpreter_requested(os.environ)

#: Streaming multiprocessors assumed by the split heuristic in the interpreter: a tiny "device", so
# : that ``num_splits=0`` exercises splitting on small CPU test shapes without launching many
# programs.
INTERPRETER_SMS = 4

_TL_DTYPES = {
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float32: tl.float32,
    torch.float8_e4m3fn: tl.float8e4nv,
}


@dataclass
class Launch:
    """A planned kernel call: ``kernel[grid](**args, **constexprs, num_warps=..., num_stages=...)``.

    ``args`` are the runtime arguments (tensors, ints, floats, or argument groups: tuples and
    NamedTuples of them) in the kernel's parameter order; ``constexprs`` the compile-time ones (a
    value or a NamedTuple group such as :class:`Tile`). Tensors may be ``None`` only where the
    kernel never reads them (a constexpr switch is off); :meth:`run` replaces them by a one-element
    dummy, inside groups too.

    Triton specialises every int inside a tuple argument (divisibility by 16, ``== 1``) whatever
    ``do_not_specialize`` says (3.6 and 3.9: that list only reaches whole parameters), so a group
    holds only values the kernel lets Triton specialise; an unspecialised value stays a parameter
    of its own. A kernel reads a compile-time group's fields as ``TILE.BLOCK_M``; Triton 3.6 hands
    such a field over as a plain Python value, which ``tl.zeros`` rejects as a shape and a jit call
    rejects when it is a string, so there the kernel names it first (``BLOCK_M: tl.constexpr =
    TILE.BLOCK_M``).
    """

    kernel: Any
    grid: tuple[int, ...]
    args: dict[str, Any]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    dummy_device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def runtime_args(self) -> dict[str, Any]:
        """``args`` with every ``None`` replaced by a dummy int32 tensor (never dereferenced;
        ``empty`` launches no fill kernel, so a CUDA graph of a call holds only the real
        launches), allocated only when there is a ``None``."""
        if all(x is not None for x in _leaves(self.args.values())):
            return dict(self.args)
        dummy = torch.empty(1, dtype=torch.int32, device=self.dummy_device)
        return {k: _filled(v, dummy) for k, v in self.args.items()}

    def run(self) -> None:
        if min(self.grid) == 0:
            return
        require_backend(_leaves(self.args.values()), INTERPRETING)
        self.kernel[self.grid](
            **self.runtime_args(), **self.constexprs,
            num_warps=self.num_warps, num_stages=self.num_stages,
        )


class Tile(NamedTuple):
    """The block sizes of a kernel's tile, one compile-time group (``TILE``; the kernels read
    ``TILE.BLOCK_M``...): ``BLOCK_M`` query rows (packed entries in the forward), ``BLOCK_N`` keys,
    ``BLOCK_D`` / ``BLOCK_DV`` channels (powers of 2 covering ``d`` / ``d_v``)."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_D: int
    BLOCK_DV: int


def _leaves(values: Iterable) -> Iterator:
    """``values`` with every argument group (tuple) replaced by its elements, recursively."""
    for value in values:
        if isinstance(value, tuple):
            yield from _leaves(value)
        else:
            yield value


def _filled(value, dummy):
    """``value`` with ``dummy`` for ``None``, also inside argument groups (NamedTuples kept)."""
    if value is None:
        return dummy
    if isinstance(value, tuple):
        items = [_filled(x, dummy) for x in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def tl_dtype(dtype: torch.dtype):
    """The Triton dtype of a torch dtype the kernels accept."""
    return _TL_DTYPES[dtype]


def compute_dtype(dtype: torch.dtype):
    """Dtype that loaded q/k/v/qv tiles are converted to before the matmuls.

    * fp16 / fp32: unchanged (fp32 matmuls use ``input_precision="ieee"``, see
      :func:`dot_precision`);
    * bf16: unchanged on a GPU, fp32 in the interpreter (whose bf16 arithmetic is wrong);
    * fp8 e4m3: bf16 on a GPU (exact widening; the matmuls then run on bf16 tensor cores and the
      softmax weights keep bf16 precision), fp32 in the interpreter.
    """
    if INTERPRETING and dtype in (torch.bfloat16, torch.float8_e4m3fn):
        return tl.float32
    if dtype == torch.float8_e4m3fn:
        return tl.bfloat16
    return tl_dtype(dtype)


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of ``tl.dot``: exact fp32 ("ieee") when the tiles are fp32, else "tf32"
    (a no-op for 16-bit operands)."""
    return "ieee" if compute_dtype(dtype) == tl.float32 else "tf32"


def explicit_rounding(dtype: torch.dtype) -> str:
    """``ROUND_TO`` of :func:`kernels.numerics.store_as` for stores of ``dtype``: the interpreter's
    bf16 and fp8 conversions round wrongly, so there the kernels round explicitly first."""
    if INTERPRETING and dtype == torch.bfloat16:
        return "bf16"
    if INTERPRETING and dtype == torch.float8_e4m3fn:
        return "fp8e4m3"
    return "none"


def rotated_q_parts(dtype: torch.dtype) -> int:
    """How many 16-bit parts a rotated (fp32) q tile is split into for the q·K matmul
    (:func:`kernels.numerics.split_parts`): 1 for fp32 tiles, 2 for fp16 (11 + 11 bits), 3 for
    bf16 (3 x 8 bits), so the scores keep fp32 accuracy as in the fp32 reference."""
    tile = compute_dtype(dtype)
    return 1 if tile == tl.float32 else 2 if tile == tl.float16 else 3


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (:data:`INTERPRETER_SMS` when interpreting on a
    CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SMS


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())

