"""Float scalars reach both implementations as the float32 values FA3 computes with.

The call record (:func:`attn_ref.validation.check_kvcache_args`) rounds ``softmax_scale`` and
``softcap`` to float32 once; the reference computes with those values and the kernels get them as
float32 (the interpreter too, where a subnormal Python float would otherwise become fp64). Edge
values (subnormal, huge, negative zero, float64-only, numpy and 0-d tensor scalars) go through both
implementations: both accept and match the oracle, or both raise the same catalogued error.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

import attn_ref
import errors
import kernels
from attn_ref.validation import check_kvcache_args
from dense_oracle import assert_matches_oracle
from kvcache_cases import REF, make_case, run_kernels

FLOAT32_MAX = float(np.finfo(np.float32).max)


def float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


#: name -> (softmax_scale, softcap, case changes, what both implementations do: "ok" or the error).
SCALARS = {
    "scale_subnormal": (1e-45, 0.0, {}, "ok"),
    "scale_float64_only_tiny": (1e-50, 0.0, {}, "ok"),  # 0 in float32
    "scale_negative_zero": (-0.0, 0.0, {}, "ok"),
    "scale_not_float32_exact": (0.1, 0.0, {}, "ok"),
    "scale_large": (1e5, 0.0, {}, "ok"),
    "scale_huge_zero_q": (2.3e38, 0.0, {"zero_q": True}, "ok"),
    "scale_huge_refused_by_the_data": (1e38, 0.0, {}, ValueError),
    "scale_base2_overflow": (2.4e38, 0.0, {"zero_q": True}, ValueError),
    "scale_float32_max": (FLOAT32_MAX, 0.0, {}, ValueError),
    "scale_float64_only_huge": (3.5e38, 0.0, {}, ValueError),
    "scale_numpy_float32": (np.float32(0.3), 0.0, {}, "ok"),
    "scale_numpy_float64": (np.float64(-0.3), 0.0, {}, "ok"),
    "scale_0d_tensor": (torch.tensor(0.3), 0.0, {}, TypeError),
    "softcap_subnormal": (0.25, 1e-45, {}, "ok"),
    "softcap_float64_only_tiny_is_off": (0.25, 1e-50, {}, "ok"),
    "softcap_negative_zero_is_off": (0.25, -0.0, {}, "ok"),
    "softcap_not_float32_exact": (0.3, 0.7, {}, "ok"),
    "softcap_huge": (0.25, 2.3e38, {}, "ok"),
    "softcap_base2_overflow": (0.25, 2.4e38, {}, ValueError),
    "softcap_with_the_largest_scale": (FLOAT32_MAX, 5.0, {}, "ok"),
    "softcap_numpy": (0.25, np.float32(5.0), {}, "ok"),
    "softcap_0d_tensor": (0.25, torch.tensor(5.0), {}, TypeError),
}


def case_args(scale, softcap, changes: dict) -> dict:
    args = make_case(batch=1, seqlen_q=2, seqlen_new=1, capacity=6, causal=True, sinks=True)
    if changes.get("zero_q"):
        args["q"] = torch.zeros_like(args["q"])
    return dict(args, softmax_scale=scale, softcap=softcap)


def outcome(fn, args: dict):
    """``(None, error)`` of a refused call, else ``(result, None)`` once it matched the oracle."""
    try:
        return assert_matches_oracle(fn, args), None
    except (ValueError, TypeError) as exc:
        return None, exc


@pytest.mark.parametrize("scale, softcap, changes, expected", SCALARS.values(), ids=SCALARS.keys())
def test_edge_scalars_give_the_same_results_or_the_same_catalogued_error(
    scale, softcap, changes, expected
):
    args = case_args(scale, softcap, changes)
    _, ref_error = outcome(REF.fn, args)
    _, kernel_error = outcome(run_kernels, args)  # both matched the oracle, or both refused:
    assert type(ref_error) is type(kernel_error) and str(ref_error) == str(kernel_error)
    assert (type(ref_error) if ref_error else "ok") == expected, ref_error
    if ref_error is not None:
        entry = errors.lookup(ref_error)
        assert entry is not None and entry["status"] == "active", ref_error


@pytest.mark.parametrize(
    "scale, softcap",
    [(1e-45, 0.0), (-0.0, 0.0), (0.1, 0.7), (np.float64(1 / 3), 1e-45), (1e-50, 1e-50)],
)
def test_the_call_record_holds_the_float32_values(scale, softcap):
    call = check_kvcache_args(**case_args(scale, softcap, {}))
    assert type(call.softmax_scale) is float and type(call.softcap) is float
    assert math.copysign(1, call.softmax_scale) == math.copysign(1, scale)
    assert call.softmax_scale == float32(float(scale))
    assert call.softcap == (float32(softcap) if softcap > 0 else 0.0)


def test_a_subnormal_scale_appends_and_attends_as_the_reference():
    """Issue 37's call: the kernels raised an interpreter error after the append had run."""
    bf = torch.bfloat16

    def call(fn):
        torch.manual_seed(0)
        kc, vc = torch.randn(1, 8, 1, 32, dtype=bf), torch.randn(1, 8, 1, 32, dtype=bf)
        q = torch.randn(1, 1, 1, 32, dtype=bf)
        k, v = torch.randn(1, 2, 1, 32, dtype=bf), torch.randn(1, 2, 1, 32, dtype=bf)
        out, lse, *_ = fn(
            q, kc, vc, k, v,
            cache_seqlens=torch.tensor([5], dtype=torch.int32),
            cache_leftpad=torch.tensor([3], dtype=torch.int32),
            window_size=(1, 4), sinks=torch.randn(1), num_splits=0, return_softmax_lse=True,
            softmax_scale=1e-45,
        )  # fmt: skip
        return out, lse, kc, vc

    reference = call(attn_ref.flash_attn_with_kvcache)
    result = call(kernels.flash_attn_with_kvcache)
    assert torch.isfinite(reference[0]).all()
    for got, want in zip(result, reference):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
