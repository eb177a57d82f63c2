"""Small ``@triton.jit`` numeric helpers shared by the kernels.

* :func:`round_to_bf16` - round fp32 to the nearest bf16 value (ties to even) by integer operations
  on the fp32 bits: ``bits + 0x7FFF + lsb`` then clear the low 16 bits, where ``lsb`` is bit 16 (the
  last bit bf16 keeps). The result is an fp32 holding a bf16 value, so the following ``.to(bf16)``
  is exact even in Triton's interpreter, which truncates. Inputs are finite (attention outputs, rotated
  keys), so the NaN case of a full converter is not needed.
* :func:`store_as` - cast an fp32 tile to the destination's element type and store it, rounding
  bf16 explicitly when ``ROUND_BF16`` (interpreter with a bf16 destination).
* :func:`tanh` - ``1 - 2 / (e^{2x} + 1)``: saturates to ±1 without overflow (``e^{2x} = inf`` gives 1,
  ``0`` gives -1) and needs only ``exp``, which the interpreter and every GPU target have.
"""

import triton
import triton.language as tl


@triton.jit
def round_to_bf16(x):
    """fp32 tile -> fp32 tile of the nearest bf16 values (round half to even)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def store_as(ptrs, x, mask, ROUND_BF16: tl.constexpr):
    """Store fp32 tile ``x`` at ``ptrs`` (same shape) in the pointers' element type."""
    if ROUND_BF16:
        x = round_to_bf16(x)
    tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def tanh(x):
    """Hyperbolic tangent of an fp32 tile."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
