"""Compiling planned launches for a GPU without one: the ``ASTSource`` signature of a launch.

Shared by :mod:`test_kernel_compile` (the forward, append and merge kernels) and
:mod:`test_backward_kernels` (the backward kernels).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn

#: Triton's pointer type of each tensor dtype.
POINTER_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", FP8: "fp8e4nv", torch.int32: "i32"}


def launch_signature(launch) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` of a planned launch for ``ASTSource``, specialised as
    Triton's launcher does: 16-byte aligned pointers and ints divisible by 16 (other than the
    ``do_not_specialize`` ones) are marked ``tt.divisibility = 16``, which enables vectorised loads."""
    args = launch.runtime_args()
    unspecialised = {p.name for p in launch.kernel.params if p.do_not_specialize}
    signature, attrs = {}, {}
    for index, name in enumerate(launch.kernel.arg_names):
        value = args.get(name)
        if name in launch.constexprs:
            signature[name] = "constexpr"
            continue
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + POINTER_TYPES[value.dtype]
            aligned = value.data_ptr() % 16 == 0
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            aligned = value % 16 == 0 and name not in unspecialised
        else:
            signature[name], aligned = "fp32", False
        if aligned:
            attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, dict(launch.constexprs), attrs
