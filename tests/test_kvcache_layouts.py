"""Return values, the ``out`` buffer and degenerate axes of flash_attn_with_kvcache, for every
implementation (``ref``: attn_ref, ``kernels``: the Triton kernels, see :mod:`kvcache_cases`).

The layout invariances that concern one implementation stay with it: the reference's in
:mod:`test_reference_layouts`, the kernels' split heuristic and partials in :mod:`test_kernels_layouts`.
"""

import pytest
import torch

from dense_oracle import assert_matches_oracle
from kvcache_cases import KERNELS, REF, clone_args, make_case, over
from test_reference_errors import base

BOTH = [REF, KERNELS]


def run(impl, args, **knobs):
    return impl.fn(**clone_args(args), return_softmax_lse=True, **knobs)


@pytest.mark.parametrize("impl, varlen", over(BOTH, {"False": False, "True": True}))
def test_return_shapes(impl, varlen):
    b, sq, h, dv = 3, 2, 4, 24
    args = make_case(batch=b, seqlen_q=sq, heads=h, heads_k=2, dv=dv, varlen_q=varlen, seed=5)
    total_q = args["q"].shape[0]
    out_only = impl.fn(**clone_args(args))
    assert isinstance(out_only, torch.Tensor)
    assert torch.equal(out_only, run(impl, args)[0])
    rows = (total_q,) if varlen else (b, sq)
    lse_rows = (h, total_q) if varlen else (b, h, sq)
    for n in (1, 5):
        result = run(impl, args, num_splits=n)
        assert isinstance(result, tuple) and len(result) == 4
        out, lse, acc, lacc = result
        assert out.shape == (*rows, h, dv) and out.dtype == args["q"].dtype
        assert lse.shape == lse_rows and lse.dtype == torch.float32
        if n == 1:  # no split: no partials
            assert acc is None and lacc is None
        else:
            assert acc.dtype == lacc.dtype == torch.float32
            assert acc.shape == (n, *lse_rows, dv) and lacc.shape == (n, *lse_rows)


@pytest.mark.parametrize("impl, dtype", over([REF], {"fp16": torch.float16, "fp8": torch.float8_e4m3fn})
                         + over([KERNELS], {"fp16": torch.float16, "bf16": torch.bfloat16}))
def test_out_is_written_and_returned(impl, dtype):
    # On the implementation's device: the returned tensor is the caller's buffer itself.
    args = impl.placed(make_case(dtype=dtype, seqlen_new=1, seed=7))
    expected = impl.api(**clone_args(args), return_softmax_lse=True)[0]
    buffer = torch.full_like(expected, 7.0)
    result = impl.api(**clone_args(args), out=buffer, return_softmax_lse=True)
    assert result[0] is buffer and torch.equal(buffer, expected)
    buffer.fill_(7.0)
    assert impl.api(**clone_args(args), out=buffer) is buffer
    assert torch.equal(buffer, expected)


EMPTY_AXES = {
    # FA3 computes these (an empty output, or all-zero scores = uniform attention); so do both here
    "zero_query_heads": dict(q=torch.randn(2, 2, 0, 16)),
    "zero_head_dim_explicit_scale": dict(q=torch.randn(2, 2, 4, 0), k_cache=torch.randn(2, 8, 2, 0),
                                         k=torch.randn(2, 2, 2, 0), softmax_scale=0.5),
    "zero_value_head_dim": dict(v_cache=torch.randn(2, 8, 2, 0), v=torch.randn(2, 2, 2, 0)),
}


@pytest.mark.parametrize("impl, change", over(BOTH, EMPTY_AXES))
def test_empty_axes_are_computed(impl, change):
    assert_matches_oracle(impl.fn, dict(base(), **change), num_splits=3)


@pytest.mark.parametrize("impl", BOTH, ids=lambda impl: impl.name)
def test_inputs_that_require_grad(impl):
    # Read-only inputs may require grad (nothing is differentiated); a cache that requires grad may
    # be appended to under torch.no_grad(), where PyTorch allows in-place writes into it.
    plain = impl.fn(**base(), return_softmax_lse=True)
    args = base()
    args["q"].requires_grad_()
    args["k"].requires_grad_()
    reading = impl.fn(**args, return_softmax_lse=True)
    assert not reading[0].requires_grad and torch.equal(reading[0], plain[0]) and torch.equal(reading[1], plain[1])
    args = base()
    args["k_cache"].requires_grad_()
    with torch.no_grad():
        writing = impl.fn(**args, return_softmax_lse=True)
    expected = base()
    impl.fn(**expected)
    assert torch.equal(writing[0], plain[0]) and torch.equal(args["k_cache"], expected["k_cache"])
