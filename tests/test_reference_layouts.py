"""Layout invariances, return values and the signature of attn_ref.flash_attn_with_kvcache.

Different layouts of the same logical problem (paged vs dense cache, packed vs separate sequences,
KV splits, performance knobs) must give the same answer. Return shapes and the ``out`` buffer are
tested over both implementations in :mod:`test_kvcache_layouts`.
"""

import inspect
from functools import reduce

import pytest
import torch

from attn_ref import flash_attn_with_kvcache, merge_attention_states
from dense_oracle import logical_cache
from kvcache_cases import clone_args, make_case, split_cases
from tolerance import assert_lse_close

# Spec table 1.1: sglang's parameter order (only_qv between pack_gqa and sm_margin, out last).
SPEC_PARAMETERS = [
    ("q", inspect.Parameter.empty), ("k_cache", inspect.Parameter.empty), ("v_cache", inspect.Parameter.empty),
    ("k", None), ("v", None), ("qv", None), ("rotary_cos", None), ("rotary_sin", None),
    ("cache_seqlens", None), ("cache_batch_idx", None), ("cache_leftpad", None), ("page_table", None),
    ("cu_seqlens_q", None), ("cu_seqlens_k_new", None), ("max_seqlen_q", None), ("rotary_seqlens", None),
    ("q_descale", None), ("k_descale", None), ("v_descale", None), ("softmax_scale", None),
    ("causal", False), ("window_size", (-1, -1)), ("attention_chunk", None), ("softcap", 0.0),
    ("rotary_interleaved", True), ("scheduler_metadata", None), ("num_splits", 0), ("pack_gqa", None),
    ("only_qv", False), ("sm_margin", 0), ("return_softmax_lse", False), ("sinks", None),
    ("score_mod", None), ("aux_tensors", None), ("ver", 3), ("out", None),
]


def run(args, **knobs):
    return flash_attn_with_kvcache(**clone_args(args), return_softmax_lse=True, **knobs)


def test_signature_matches_spec_table():
    params = inspect.signature(flash_attn_with_kvcache).parameters.values()
    assert [(p.name, p.default) for p in params] == SPEC_PARAMETERS
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


def test_positional_call_binds_only_qv_before_sm_margin():
    case = make_case(only_qv=True, qv=True, heads=2, heads_k=1, d=16, dv=32, seed=1)
    positional = [case.get(name, default) for name, default in SPEC_PARAMETERS[:28]]
    out = flash_attn_with_kvcache(*positional, True)  # 29th positional argument: only_qv
    assert torch.equal(out, flash_attn_with_kvcache(**case))


@pytest.mark.parametrize("page_size", [1, 3, 4, 16])
@pytest.mark.parametrize("append", [False, True])
def test_paged_equals_dense(page_size, append):
    paged = make_case(page_size=page_size, capacity=17, batch=3, batch_idx=True, causal=True, leftpad=True,
                      seqlen_new=2 if append else None, rotary_dim=16 if append else 0, seed=page_size)
    dense = dict(paged)
    dense.pop("page_table")
    dense["k_cache"] = logical_cache(paged["k_cache"], paged["page_table"])
    dense["v_cache"] = logical_cache(paged["v_cache"], paged["page_table"])
    out_p, lse_p = run(paged)[:2]
    out_d, lse_d = run(dense)[:2]
    assert torch.equal(out_p, out_d) and torch.equal(lse_p, lse_d)


@pytest.mark.parametrize("causal", [False, True])
def test_packing_equals_running_apart(causal):
    a = make_case(batch=1, seqlen_q=3, seqlen_new=2, capacity=10, leftpad=True, rotary_dim=16, causal=causal, seed=1)
    b = make_case(batch=1, seqlen_q=5, seqlen_new=1, capacity=10, leftpad=True, rotary_dim=16, causal=causal, seed=2)
    b["rotary_cos"], b["rotary_sin"] = a["rotary_cos"], a["rotary_sin"]
    packed = dict(a)
    packed["q"] = torch.cat((a["q"][0], b["q"][0]))
    packed["cu_seqlens_q"] = torch.tensor([0, 3, 8], dtype=torch.int32)
    packed["max_seqlen_q"] = 5
    packed["k"] = torch.cat((a["k"][0], b["k"][0]))
    packed["v"] = torch.cat((a["v"][0], b["v"][0]))
    packed["cu_seqlens_k_new"] = torch.tensor([0, 2, 3], dtype=torch.int32)
    for name in ("k_cache", "v_cache", "cache_seqlens", "cache_leftpad"):
        packed[name] = torch.cat((a[name], b[name]))
    out, lse = run(packed)[:2]
    out_a, lse_a = run(a)[:2]
    out_b, lse_b = run(b)[:2]
    torch.testing.assert_close(out, torch.cat((out_a[0], out_b[0])), rtol=0, atol=0)
    torch.testing.assert_close(lse, torch.cat((lse_a[0], lse_b[0]), dim=1), rtol=0, atol=0)


SPLIT_CASES = split_cases(keys=20)


@pytest.mark.parametrize("case", SPLIT_CASES.values(), ids=SPLIT_CASES.keys())
def test_num_splits_agree_and_partials_merge(case):
    args = make_case(dtype=torch.bfloat16, leftpad=True, seed=3, **case)
    out1, lse1, acc1, lacc1 = run(args, num_splits=1)
    out0, lse0, acc0, lacc0 = run(args, num_splits=0)
    out3, lse3, acc3, lacc3 = run(args, num_splits=3)
    assert acc1 is lacc1 is acc0 is lacc0 is None
    assert torch.equal(out0, out1) and torch.equal(lse0, lse1)
    torch.testing.assert_close(out3, out1, rtol=0, atol=torch.finfo(torch.bfloat16).eps)  # fp32 merge, then one rounding
    assert_lse_close(lse3, lse1)
    # Folding the returned partials reproduces out and lse (the sink sits in split 0 only).
    merged_out, merged_lse = reduce(lambda x, y: merge_attention_states(*x, *y), zip(acc3, lacc3))
    merged_out = merged_out.transpose(-2, -3) if args.get("cu_seqlens_q") is not None else merged_out.transpose(1, 2)
    assert torch.equal(merged_out.to(out3.dtype), out3)
    torch.testing.assert_close(merged_lse, lse3, rtol=0, atol=0)


def test_num_splits_negative_is_heuristic():
    args = make_case(seed=4)
    out, lse, acc, lacc = run(args, num_splits=-1)
    assert acc is None and lacc is None
    assert torch.equal(out, run(args)[0])


def test_fp8_output_is_bf16():
    args = make_case(dtype=torch.float8_e4m3fn, descale=True, seed=6)
    out, lse = run(args)[:2]
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32


def test_performance_knobs_change_nothing():
    args = make_case(dtype=torch.bfloat16, causal=True, seqlen_new=2, sinks=True, seed=8)
    base = run(args, num_splits=2)
    knobs = dict(scheduler_metadata=torch.zeros(7, dtype=torch.int32), pack_gqa=True, sm_margin=12,
                 score_mod=lambda *a: 1 / 0, aux_tensors=[torch.ones(1)], ver=3)  # ver=4: an error (SGL-B)
    for name, value in knobs.items():
        other = run(args, num_splits=2, **{name: value})
        assert all(torch.equal(x, y) for x, y in zip(base, other)), name
    assert all(torch.equal(x, y) for x, y in zip(base, run(args, num_splits=2, pack_gqa=False)))


def test_descale_ignored_without_fp8():
    args = make_case(dtype=torch.bfloat16, seed=9)
    scales = {name: torch.full((2, 2), 3.0) for name in ("q_descale", "k_descale", "v_descale")}
    assert torch.equal(run(args)[0], run(args, **scales)[0])


def test_int_cache_seqlens_equals_tensor():
    args = make_case(batch=2, seqlen_new=2, causal=True, seed=10)
    args["cache_seqlens"] = torch.tensor([5, 5], dtype=torch.int32)
    as_int = dict(args, cache_seqlens=5)
    assert all(torch.equal(x, y) for x, y in zip(run(args)[:2], run(as_int)[:2]))


def test_window_as_tensor_and_list():
    args = make_case(window=(2, 1), seed=11)
    base = run(args)[0]
    assert torch.equal(base, run(dict(args, window_size=[2, 1]))[0])
    assert torch.equal(base, run(dict(args, window_size=torch.tensor([2, 1])))[0])


def test_append_writes_only_the_new_slots():
    args = make_case(batch=2, seqlen_new=3, capacity=10, page_size=2, batch_idx=True, seed=12)
    after = clone_args(args)
    flash_attn_with_kvcache(**after)
    table, rows = args["page_table"].long(), args["cache_batch_idx"].long()
    changed = (after["v_cache"] != args["v_cache"]).flatten(2).any(2).nonzero().tolist()  # [page, slot]
    expected = set()
    for i in range(2):
        c = int(args["cache_seqlens"][i])
        expected |= {(int(table[rows[i], p // 2]), p % 2) for p in range(c, c + 3)}
    assert {tuple(slot) for slot in changed} == expected
    assert torch.equal(after["k_cache"] != args["k_cache"], after["v_cache"] != args["v_cache"])


def test_append_into_cache_views_and_shared_seqlens_tensor():
    """Caches that are views of larger buffers are updated in place (callers reuse them), and
    ``rotary_seqlens`` may be the very ``cache_seqlens`` tensor; no index tensor is modified."""
    args = make_case(batch=2, seqlen_new=2, capacity=10, d=32, rotary_dim=16, causal=True, seed=13)
    buffers = [torch.zeros(3, 12, 2, 32) for _ in range(2)]
    views = [buf[1:, 1:11] for buf in buffers]  # (2, 10, 2, 32), stride(-1) == 1, not contiguous
    for view, name in zip(views, ("k_cache", "v_cache")):
        view.copy_(args[name])
    seqlens = args["cache_seqlens"].clone()
    call = dict(args, k_cache=views[0], v_cache=views[1], rotary_seqlens=args["cache_seqlens"])
    out = flash_attn_with_kvcache(**call)
    expected = clone_args(args)
    assert torch.equal(out, flash_attn_with_kvcache(**expected, rotary_seqlens=expected["cache_seqlens"]))
    assert torch.equal(buffers[0][1:, 1:11], expected["k_cache"]) and torch.equal(buffers[1][1:, 1:11], expected["v_cache"])
    assert all(not buf[0].any() and not buf[:, 0].any() and not buf[:, 11].any() for buf in buffers)
    assert torch.equal(args["cache_seqlens"], seqlens)
