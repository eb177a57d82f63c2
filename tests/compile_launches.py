"""Compiling planned launches for a GPU without one: the ``ASTSource`` signature of a launch.

Shared by :mod:`test_kernel_compile` (the forward, append and merge kernels) and
:mod:`test_backward_kernels` (the backward kernels).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn

#: Triton's pointer type of each tensor dtype.
POINTER_TYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    FP8: "fp8e4nv",
    torch.int32: "i32",
}


def launch_signature(launch) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` of a planned launch for ``ASTSource``, specialised as
    Triton's launcher does: 16-byte aligned pointers and ints divisible by 16 are marked
    ``tt.divisibility = 16`` (vectorised loads) and ints equal to 1 become constants, except the
    ``do_not_specialize`` parameters. An argument group (tuple) gets a tuple of types, its elements
    are always specialised (Triton's rule) and their attributes and constants are keyed by path
    ``(index, element, ...)``."""
    args = launch.runtime_args()
    unspecialised = {p.name for p in launch.kernel.params if p.do_not_specialize}
    signature, constexprs, attrs = {}, dict(launch.constexprs), {}
    for index, name in enumerate(launch.kernel.arg_names):
        if name in launch.constexprs:
            signature[name] = "constexpr"
        else:
            specialise = name not in unspecialised
            signature[name] = _argument_type(args[name], (index,), specialise, constexprs, attrs)
    return signature, constexprs, attrs


def _argument_type(value, path: tuple, specialise: bool, constexprs: dict, attrs: dict):
    """The signature type of the runtime argument ``value`` at ``path``; records its divisibility in
    ``attrs`` and, for a specialised int 1, its value in ``constexprs``."""
    if isinstance(value, tuple):
        types = [
            _argument_type(x, (*path, i), True, constexprs, attrs) for i, x in enumerate(value)
        ]
        return type(value)(*types) if hasattr(value, "_fields") else tuple(types)
    if isinstance(value, torch.Tensor):
        if value.data_ptr() % 16 == 0:
            attrs[path] = [["tt.divisibility", 16]]
        return "*" + POINTER_TYPES[value.dtype]
    if isinstance(value, int):
        if specialise and value == 1:
            constexprs[path] = 1
            return "constexpr"
        if specialise and value % 16 == 0:
            attrs[path] = [["tt.divisibility", 16]]
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    return "fp32"
