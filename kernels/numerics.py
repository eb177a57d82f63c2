"""Small ``@triton.jit`` numeric helpers shared by the kernels.

* ``LOG2E``, ``LN2`` - the base change of the online softmax (``exp2`` in the loop, natural-log
  LSE out).
* :func:`round_to_bf16` - round fp32 to the nearest bf16 value (ties to even) by integer
  operations on the fp32 bits: ``bits + 0x7FFF + lsb`` then clear the low 16 bits, where ``lsb`` is
  bit 16 (the last bit bf16 keeps). The result is an fp32 holding a bf16 value, so the following
  ``.to(bf16)`` is exact even in Triton's interpreter, which truncates. Inputs are finite (attention
  outputs, rotated keys), so the NaN case of a full converter is not needed.
* :func:`round_to_fp8e4m3` - round fp32 to the nearest fp8 e4m3 value (ties to even): with ``e`` the
  binary exponent of ``x``, e4m3 keeps 3 fraction bits, so its spacing there is
  ``2^max(e - 3, -9)`` (-9: the subnormal spacing); ``x / spacing`` is rounded to an integer by the
  fp32 "magic number" ``1.5 · 2^23`` (add, subtract: round half to even) and scaled back. Needed
  because the interpreter's fp32 -> fp8 conversion rounds wrongly when rounding up crosses a power
  of two (1.99 becomes 1.0). Values beyond e4m3's range (448) are not handled.
* :func:`split_parts` - ``x = hi + mid + lo`` with each part exact in a 16-bit dtype, so a matmul of
  an fp32 tile against 16-bit data keeps ~fp32 accuracy on 16-bit tensor cores (2 or 3 matmuls).
* :func:`store_as` - cast an fp32 tile to the destination's element type and store it, rounding
  explicitly first when ``ROUND_TO`` says so (interpreter with a bf16 or fp8 destination).
* :func:`tanh` - accurate to a few fp32 ulps everywhere, with only ``exp`` (which the interpreter
  and every GPU target have). For ``|x| >= 1/4``: ``(1 - e^{-2|x|}) / (1 + e^{-2|x|})`` with the
  sign of ``x`` (never overflows: the exponent is <= 0; ``|x| = inf`` gives 1). Below that, the
  difference ``1 - e^{-2|x|}`` would cancel (a large softcap makes every argument tiny: ``softcap =
  1e6`` put the logits 0.03 off), so the odd Taylor series ``x - x³/3 + 2x⁵/15 - 17x⁷/315 +
  62x⁹/2835`` is used, whose first omitted term is below ``1e-8 |x|`` there.
"""

import triton
import triton.language as tl

# log2(e): e^x = 2^(x·LOG2E), the kernels' softmax works in base 2
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): back from base 2 to the natural-log LSE


@triton.jit
def round_to_bf16(x):
    """fp32 tile -> fp32 tile of the nearest bf16 values (round half to even)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def round_to_fp8e4m3(x):
    """fp32 tile -> fp32 tile of the nearest fp8 e4m3 values (round half to even)."""
    exponent = ((x.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    spacing_exponent = tl.maximum(exponent - 3, -9)
    spacing = ((spacing_exponent + 127) << 23).to(tl.float32, bitcast=True)  # 2^spacing_exponent
    steps = (x / spacing + 12582912.0) - 12582912.0  # round half to even (|x / spacing| < 2^22)
    return steps * spacing


@triton.jit
def store_as(ptrs, x, mask, ROUND_TO: tl.constexpr):
    """Store fp32 tile ``x`` at ``ptrs`` (same shape) in the pointers' element type.

    ``ROUND_TO``: ``"bf16"`` / ``"fp8e4m3"`` round explicitly first (interpreter), ``"none"`` not.
    """
    if ROUND_TO == "bf16":
        x = round_to_bf16(x)
    if ROUND_TO == "fp8e4m3":
        x = round_to_fp8e4m3(x)
    tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def split_parts(x, DTYPE: tl.constexpr, PARTS: tl.constexpr):
    """``(hi, mid, lo)`` in ``DTYPE`` with ``hi + mid + lo ≈ x`` (fp32 tile); unused parts are 0."""
    hi = x.to(DTYPE)
    rest = x - hi.to(tl.float32)
    mid = rest.to(DTYPE)
    lo = (rest - mid.to(tl.float32)).to(DTYPE)
    if PARTS < 3:
        lo = tl.zeros_like(lo)
    if PARTS < 2:
        mid = tl.zeros_like(mid)
    return hi, mid, lo


@triton.jit
def tanh(x):
    """Hyperbolic tangent of an fp32 tile (see the module docstring)."""
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    large = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = a * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0
                                                 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0)))))
    t = tl.where(a < 0.25, small, large)
    return tl.where(x < 0.0, -t, t)
