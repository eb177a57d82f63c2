"""The API of flash_attn_with_kvcache for every implementation (``ref``: attn_ref, ``kernels``: the
Triton kernels, see :mod:`kvcache_cases`): the signature, return values and the ``out`` buffer, the
knobs that change nothing, ``num_splits`` and its partials, and degenerate calls (empty axes, no
keys, empty sequences, no query rows).

The layout invariances that concern one implementation stay with it: the reference's in
:mod:`test_reference_layouts`, the kernels' split heuristic and partials in
:mod:`test_kernels_layouts`.
"""

import inspect
from functools import reduce

import pytest
import torch

from attn_ref import merge_attention_states
from dense_oracle import assert_matches_oracle
from kvcache_cases import KERNELS, REF, base, clone_args, make_case, over, split_cases
from tolerance import assert_lse_close, assert_one_rounding_apart

BOTH = [REF, KERNELS]
INF = float("inf")
BF16_EPS = torch.finfo(torch.bfloat16).eps
# Spec table 1.1: sglang's parameter order (only_qv between pack_gqa and sm_margin, out last).
SPEC_PARAMETERS = [
    ("q", inspect.Parameter.empty),
    ("k_cache", inspect.Parameter.empty),
    ("v_cache", inspect.Parameter.empty),
    ("k", None),
    ("v", None),
    ("qv", None),
    ("rotary_cos", None),
    ("rotary_sin", None),
    ("cache_seqlens", None),
    ("cache_batch_idx", None),
    ("cache_leftpad", None),
    ("page_table", None),
    ("cu_seqlens_q", None),
    ("cu_seqlens_k_new", None),
    ("max_seqlen_q", None),
    ("rotary_seqlens", None),
    ("q_descale", None),
    ("k_descale", None),
    ("v_descale", None),
    ("softmax_scale", None),
    ("causal", False),
    ("window_size", (-1, -1)),
    ("attention_chunk", None),
    ("softcap", 0.0),
    ("rotary_interleaved", True),
    ("scheduler_metadata", None),
    ("num_splits", 0),
    ("pack_gqa", None),
    ("only_qv", False),
    ("sm_margin", 0),
    ("return_softmax_lse", False),
    ("sinks", None),
    ("score_mod", None),
    ("aux_tensors", None),
    ("ver", 3),
    ("out", None),
]


def run(impl, args, **knobs):
    return impl.fn(**clone_args(args), return_softmax_lse=True, **knobs)


@pytest.mark.parametrize("impl", over(BOTH))
def test_signature_matches_spec_table(impl):
    params = inspect.signature(impl.api).parameters.values()
    assert [(p.name, p.default) for p in params] == SPEC_PARAMETERS
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    assert inspect.signature(impl.api) == inspect.signature(REF.api)  # the annotations too


@pytest.mark.parametrize("impl", over(BOTH))
def test_positional_call_binds_only_qv_before_sm_margin(impl):
    case = impl.placed(make_case(only_qv=True, qv=True, heads=2, heads_k=1, d=16, dv=32, seed=1))
    positional = [case.get(name, default) for name, default in SPEC_PARAMETERS[:28]]
    out = impl.api(*positional, True)  # 29th positional argument: only_qv
    assert torch.equal(out, impl.api(**case))


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


@pytest.mark.parametrize(
    "impl, dtype",
    over([REF], {"fp16": torch.float16, "fp8": torch.float8_e4m3fn})
    + over([KERNELS], {"fp16": torch.float16, "bf16": torch.bfloat16}),
)
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


#: Knobs of FA3's and sglang's signature that tune or extend upstream's kernels and change nothing
#: here.
KNOBS = dict(
    scheduler_metadata=torch.zeros(7, dtype=torch.int32),
    pack_gqa=True,
    sm_margin=12,
    # ver=4: an error (SGL-B)
    score_mod=lambda *a: 1 / 0,
    aux_tensors=[torch.ones(1)],
    ver=3,
)


@pytest.mark.parametrize("impl, dtype", over(BOTH, {"bf16": torch.bfloat16, "fp16": torch.float16}))
def test_performance_knobs_change_nothing(impl, dtype):
    args = make_case(dtype=dtype, causal=True, seqlen_new=2, sinks=True, seed=8)
    plain = run(impl, args, num_splits=2)
    for name, value in [*KNOBS.items(), ("pack_gqa", False)]:  # one at a time, then all at once
        other = run(impl, args, num_splits=2, **{name: value})
        assert all(torch.equal(x, y) for x, y in zip(plain, other)), (name, value)
    other = run(impl, args, num_splits=2, **dict(KNOBS, pack_gqa=False))
    assert all(torch.equal(x, y) for x, y in zip(plain, other))


@pytest.mark.parametrize(
    "impl, case", over([REF], split_cases(keys=20)) + over([KERNELS], split_cases(keys=60))
)
def test_num_splits_agree_and_partials_merge(impl, case):
    # The kernels: 3x the keys, for several key blocks per split.
    args = make_case(dtype=torch.bfloat16, leftpad=True, seed=3, **case)
    out1, lse1, acc1, lacc1 = run(impl, args, num_splits=1)
    assert acc1 is None and lacc1 is None
    heuristic = run(impl, args, num_splits=0)
    negative = run(impl, args, num_splits=-1)  # any num_splits <= 0 is the heuristic
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(heuristic, negative))
    if impl is REF:  # the reference's heuristic is one split
        assert heuristic[2] is None and heuristic[3] is None
        assert torch.equal(heuristic[0], out1) and torch.equal(heuristic[1], lse1)
    out3, lse3, acc3, lacc3 = run(impl, args, num_splits=3)
    # fp32 merge, then one rounding (the kernels' tiles: two)
    for out, lse in (heuristic[:2], (out3, lse3)):
        torch.testing.assert_close(out, out1, rtol=0, atol=(1 if impl is REF else 2) * BF16_EPS)
        assert_lse_close(lse, lse1)
    # Folding the returned partials reproduces out and lse (the sink sits in split 0 only); the
    # reference merges with merge_attention_states itself, so bit for bit.
    merged_out, merged_lse = reduce(lambda x, y: merge_attention_states(*x, *y), zip(acc3, lacc3))
    merged_out = (
        merged_out.transpose(-2, -3)
        if args.get("cu_seqlens_q") is not None
        else merged_out.transpose(1, 2)
    )
    if impl is REF:
        assert torch.equal(merged_out.to(out3.dtype), out3) and torch.equal(merged_lse, lse3)
    else:
        # the kernels merge in their own fp32 order
        assert_one_rounding_apart(merged_out.to(out3.dtype), out3)
        assert_lse_close(merged_lse, lse3)


EMPTY_AXES = {
    # FA3 computes these (an empty output, or all-zero scores = uniform attention); so do both here
    "zero_query_heads": dict(q=torch.randn(2, 2, 0, 16)),
    "zero_head_dim_explicit_scale": dict(
        q=torch.randn(2, 2, 4, 0),
        k_cache=torch.randn(2, 8, 2, 0),
        k=torch.randn(2, 2, 2, 0),
        softmax_scale=0.5,
    ),
    "zero_value_head_dim": dict(v_cache=torch.randn(2, 8, 2, 0), v=torch.randn(2, 2, 2, 0)),
}


@pytest.mark.parametrize("impl, change", over(BOTH, EMPTY_AXES))
def test_empty_axes_are_computed(impl, change):
    assert_matches_oracle(impl.fn, dict(base(), **change), num_splits=3)


def emptied_caches(args):
    """``args`` with zero-length views of its caches (a cache sliced to no tokens) and no cached
    keys."""
    return dict(
        args,
        k_cache=args["k_cache"][:, :0],
        v_cache=args["v_cache"][:, :0],
        cache_seqlens=torch.zeros_like(args["cache_seqlens"]),
    )


ZERO_LENGTH_KV = {
    "capacity_0": lambda sinks: make_case(capacity=0, sinks=sinks, seed=1),
    "empty_append": lambda sinks: dict(
        make_case(capacity=0, sinks=sinks, seed=1),
        k=torch.zeros(2, 0, 2, 16),
        v=torch.zeros(2, 0, 2, 16),
    ),
    "sliced_caches": lambda sinks: emptied_caches(make_case(sinks=sinks, seed=8)),
}
SPLITS = {"1_split": 1, "3_splits": 3}


@pytest.mark.parametrize(
    "impl, kv, sinks, num_splits",
    over(BOTH, ZERO_LENGTH_KV, {"no_sinks": False, "sinks": True}, SPLITS),
)
def test_zero_length_kv_gives_zero_and_plus_inf(impl, kv, sinks, num_splits):
    # FA3 skips its kernel: out 0, lse +inf (sinks or not); the partials are empty splits.
    out, lse, acc, lacc = run(impl, kv(sinks), num_splits=num_splits)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, torch.full_like(lse, INF))
    if num_splits == 1:
        assert acc is None and lacc is None
    else:
        assert torch.equal(acc, torch.zeros(num_splits, *lse.shape, out.shape[-1]))
        assert torch.equal(lacc, torch.full((num_splits, *lse.shape), -INF))


@pytest.mark.parametrize("impl", over(BOTH))
def test_paged_cache_without_pages_is_not_zero_length_kv(impl):
    # FA3's empty-KV test is batch * k_cache.shape[1] + new == 0; a paged k_cache has shape[1] = P
    # >= 1, so a page table with no pages runs the kernel: rows with no key give lse -inf, not +inf.
    args = make_case(seed=8)
    args.update(
        page_table=torch.zeros(2, 0, dtype=torch.int32),
        k_cache=torch.randn(3, 4, 2, 16),
        v_cache=torch.randn(3, 4, 2, 16),
        cache_seqlens=torch.zeros(2, dtype=torch.int32),
    )
    out, lse = run(impl, args)[:2]
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, torch.full_like(lse, -INF))


@pytest.mark.parametrize(
    "impl, page_size, num_splits", over(BOTH, {"dense": None, "paged": 4}, SPLITS)
)
def test_zero_cache_seqlens_rows_are_empty_and_sinks_count(impl, page_size, num_splits):
    args = make_case(capacity=8, page_size=page_size, seed=2)  # b=2, sq=3, h=4
    args["cache_seqlens"] = torch.zeros(2, dtype=torch.int32)
    out, lse = run(impl, args, num_splits=num_splits)[:2]
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, torch.full_like(lse, -INF))
    args["sinks"] = torch.arange(4, dtype=torch.bfloat16)  # an empty row's LSE is its sink logit
    sink_lse = torch.arange(4.0)[None, :, None].expand(2, 4, 3)
    assert torch.equal(run(impl, args, num_splits=num_splits)[1], sink_lse)
    # one empty sequence beside a full one
    args["cache_seqlens"] = torch.tensor([0, 5], dtype=torch.int32)
    out, lse = assert_matches_oracle(impl.fn, args, num_splits=num_splits)[:2]
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(lse[0], sink_lse[0])


def without_query_rows(args):
    """``args`` (packed queries) with every sequence's queries cut to none; max_seqlen_q
    unchanged."""
    return dict(args, q=args["q"][:0], cu_seqlens_q=torch.zeros_like(args["cu_seqlens_q"]))


@pytest.mark.parametrize("impl", over(BOTH))
def test_no_query_rows(impl):
    # Packed total_q = 0, with max_seqlen_q 0 and 3; the partials of two splits are empty too.
    for args in (
        make_case(varlen_q=True, seqlen_q=0, seed=3),
        without_query_rows(make_case(varlen_q=True, seed=9)),
    ):
        out, lse, acc, lacc = run(impl, args, num_splits=2)
        assert out.shape == (0, 4, 16) and lse.shape == (4, 0)
        assert acc.shape == (2, 4, 0, 16) and lacc.shape == (2, 4, 0)
    # seqlen_q = 0 with k/v to append: empty results, and the append still happens.
    args = make_case(seqlen_q=0, seqlen_new=2, seed=3)
    out, lse = assert_matches_oracle(impl.fn, args)[:2]
    assert out.shape == (2, 0, 4, 16) and lse.shape == (2, 4, 0)
    after = clone_args(args)
    impl.fn(**after)
    assert not torch.equal(after["v_cache"], args["v_cache"])


@pytest.mark.parametrize("impl", over(BOTH))
def test_inputs_that_require_grad(impl):
    # Read-only inputs may require grad (nothing is differentiated); a cache that requires grad may
    # be appended to under torch.no_grad(), where PyTorch allows in-place writes into it.
    plain = impl.fn(**base(), return_softmax_lse=True)
    args = base()
    args["q"].requires_grad_()
    args["k"].requires_grad_()
    reading = impl.fn(**args, return_softmax_lse=True)
    assert (
        not reading[0].requires_grad
        and torch.equal(reading[0], plain[0])
        and torch.equal(reading[1], plain[1])
    )
    args = base()
    args["k_cache"].requires_grad_()
    with torch.no_grad():
        writing = impl.fn(**args, return_softmax_lse=True)
    expected = base()
    impl.fn(**expected)
    assert torch.equal(writing[0], plain[0]) and torch.equal(args["k_cache"], expected["k_cache"])
