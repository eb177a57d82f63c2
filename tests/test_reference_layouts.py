"""Layout invariances of attn_ref.flash_attn_with_kvcache.

Different layouts of the same logical problem (paged vs dense cache, packed vs separate sequences,
an int or a tensor, caches that are views) must give the same answer. The signature, return shapes,
the ``out`` buffer, the performance knobs and ``num_splits`` are tested over both implementations in
:mod:`test_kvcache_layouts`.
"""

import pytest
import torch

from attn_ref import flash_attn_with_kvcache
from dense_oracle import logical_cache
from kvcache_cases import clone_args, make_case


def run(args, **knobs):
    return flash_attn_with_kvcache(**clone_args(args), return_softmax_lse=True, **knobs)


@pytest.mark.parametrize("page_size", [1, 3, 4, 16])
@pytest.mark.parametrize("append", [False, True])
def test_paged_equals_dense(page_size, append):
    paged = make_case(
        page_size=page_size,
        capacity=17,
        batch=3,
        batch_idx=True,
        causal=True,
        leftpad=True,
        seqlen_new=2 if append else None,
        rotary_dim=16 if append else 0,
        seed=page_size,
    )
    dense = dict(paged)
    dense.pop("page_table")
    dense["k_cache"] = logical_cache(paged["k_cache"], paged["page_table"])
    dense["v_cache"] = logical_cache(paged["v_cache"], paged["page_table"])
    out_p, lse_p = run(paged)[:2]
    out_d, lse_d = run(dense)[:2]
    assert torch.equal(out_p, out_d) and torch.equal(lse_p, lse_d)


@pytest.mark.parametrize("causal", [False, True])
def test_packing_equals_running_apart(causal):
    a = make_case(
        batch=1,
        seqlen_q=3,
        seqlen_new=2,
        capacity=10,
        leftpad=True,
        rotary_dim=16,
        causal=causal,
        seed=1,
    )
    b = make_case(
        batch=1,
        seqlen_q=5,
        seqlen_new=1,
        capacity=10,
        leftpad=True,
        rotary_dim=16,
        causal=causal,
        seed=2,
    )
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


def test_fp8_output_is_bf16():
    args = make_case(dtype=torch.float8_e4m3fn, descale=True, seed=6)
    out, lse = run(args)[:2]
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32


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
    # [page, slot]
    changed = (after["v_cache"] != args["v_cache"]).flatten(2).any(2).nonzero().tolist()
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
    assert torch.equal(
        out, flash_attn_with_kvcache(**expected, rotary_seqlens=expected["cache_seqlens"])
    )
    assert torch.equal(buffers[0][1:, 1:11], expected["k_cache"]) and torch.equal(
        buffers[1][1:, 1:11], expected["v_cache"]
    )
    assert all(not buf[0].any() and not buf[:, 0].any() and not buf[:, 11].any() for buf in buffers)
    assert torch.equal(args["cache_seqlens"], seqlens)
