"""FA3's ``flash_attn_func``, ``flash_attn_varlen_func`` and ``flash_attn_qkvpacked_func`` on the
reference (:mod:`attn_ref.flash_attn`), in the style of FlashAttention's own ``test_flash_attn``
and ``test_flash_attn_varlen``.

* The forward against the dense float64 formula (:func:`attn_ref.dense.attention`) by FA's
  tolerance rule (the error of the tested dtype against that of the dense formula computed in the
  low dtype), the LSE tightly; FA's seqlen grid, sampled for a CPU: ``(1, 1)``, ``(1, 3)``,
  ``(113, 203)``, ``(1023, 1024)``...; causal, sliding window, chunk, softcap, MHA / GQA / MQA.
* The gradients of q, k and v (and of the LSE's use) against float64 autograd of the dense formula.
* Varlen: FA's random padding masks turned into ``cu_seqlens``, ``seqused_q`` / ``seqused_k``,
  sglang's ``sinks`` (with their gradient) and ``return_softmax_lse``.
* fp8 inputs (forward only, bf16 ``out``, GQA, with and without descales, an empty sequence):
  :func:`flash_attn_cases.check_fp8`, FA's fp8 rule against the dense attention of the
  dequantized inputs.
* The deterministic repeat; bounded memory (the errors: ``tests/test_flash_attn_errors.py``).
"""

from __future__ import annotations

import pytest
import torch

import attn_ref
from attn_ref import dense
from flash_attn_cases import (
    HEADS,
    I32,
    OPTIONS,
    check_fp8,
    cu_seqlens,
    expected,
    padding_lengths,
    random_problem,
)
from tolerance import assert_close_fa, assert_lse_close

#: ``(seqlen_q, seqlen_k)``: FA's grid, sampled so that the module runs in well under a minute.
SEQLENS = [(1, 1), (1, 3), (3, 1), (64, 128), (113, 203), (128, 217), (239, 1), (1023, 1024)]


def _cases():
    """(seqlens, heads, options, dtype): every seqlen pair, cycling through the other factors."""
    names, heads, dtypes = list(OPTIONS), list(HEADS), [torch.bfloat16, torch.float16]
    cases = []
    for i, seqlens in enumerate(SEQLENS):
        for j in range(2 if seqlens[0] < 1000 else 1):
            n = 2 * i + j
            cases.append((seqlens, heads[n % 3], names[n % len(names)], dtypes[n % 2]))
    return cases


@pytest.mark.parametrize(
    "seqlens, heads, option, dtype",
    _cases(),
    ids=lambda x: x if isinstance(x, str) else str(x).replace("torch.", "").replace(" ", ""),
)
def test_flash_attn_func_output_and_gradients(seqlens, heads, option, dtype):
    sq, sk = seqlens
    h, h_k = HEADS[heads]
    b, d = (1, 32) if sq > 1000 else (2, 48)
    q, k, v, dout = random_problem(b, sq, sk, h, h_k, d, d, dtype, seed=sq * 7 + sk)
    dlse = torch.randn(b, h, sq, generator=torch.Generator().manual_seed(sk))
    options = OPTIONS[option]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = attn_ref.flash_attn_func(*leaves, **options, return_attn_probs=True)
    assert out.dtype == dtype and out.shape == (b, sq, h, d)
    assert lse.dtype == torch.float32 and lse.shape == (b, h, sq)
    grads = torch.autograd.grad(
        (out.float() * dout.float()).sum() + (lse.nan_to_num(0, 0, 0) * dlse).sum(), leaves
    )
    out64, lse64, grads64, out_low, grads_low = expected(q, k, v, dout, dlse, **options)
    assert_close_fa(out, out64, out_low)
    assert_lse_close(lse, lse64.float())
    for name, grad, grad64, grad_low in zip("qkv", grads, grads64, grads_low):
        assert grad.dtype == dtype, name
        assert_close_fa(grad, grad64, grad_low)


@pytest.mark.parametrize("seqused", [False, True])
@pytest.mark.parametrize(
    "seqlens, option, heads, zero_lengths",
    [
        ((1, 1), "causal", "mha", False),
        ((5, 9), "full", "gqa", True),
        ((113, 203), "causal-window", "gqa", False),
        ((96, 64), "causal", "mqa", False),
        ((128, 128), "softcap", "mha", True),
        ((60, 90), "chunk", "gqa", False),
    ],
)
def test_flash_attn_varlen_func(seqlens, option, heads, zero_lengths, seqused):
    """Random padding turned into ``cu_seqlens`` (and some sequences used only in part): each
    sequence's rows and gradients as the dense formula of that sequence alone; unused rows get
    ``out = 0``, ``lse = -inf`` and, as unused keys, zero gradients."""
    sq, sk = seqlens
    h, h_k = HEADS[heads]
    b, d, dtype = 3, 32, torch.bfloat16
    gen = torch.Generator().manual_seed(sq + 3 * sk + seqused)
    lengths_q = padding_lengths(b, sq, gen, zero_lengths)
    lengths_k = padding_lengths(b, sk, gen, zero_lengths)
    used_q = [torch.randint(0, n + 1, (), generator=gen).item() for n in lengths_q]
    used_k = [torch.randint(0, n + 1, (), generator=gen).item() for n in lengths_k]
    if not seqused:
        used_q, used_k = lengths_q, lengths_k
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q, k, v, dout = (
        torch.randn(n, heads_, d, generator=gen).to(dtype)
        for n, heads_ in ((total_q, h), (total_k, h_k), (total_k, h_k), (total_q, h))
    )
    sinks = torch.randn(h, generator=gen) if option == "full" else None
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.clone().requires_grad_()
    extra = (torch.tensor(used_q, dtype=I32), torch.tensor(used_k, dtype=I32)) if seqused else ()
    out, lse, *rest = attn_ref.flash_attn_varlen_func(
        *leaves,
        cu_seqlens(lengths_q),
        cu_seqlens(lengths_k),
        max(lengths_q),
        max(lengths_k),
        *extra,
        **OPTIONS[option],
        sinks=sink_leaf,
        return_softmax_lse=True,
    )
    assert rest == [None, None] and out.shape == (total_q, h, d) and lse.shape == (h, total_q)
    dlse = torch.randn(h, total_q, generator=gen)
    inputs = leaves + ([] if sinks is None else [sink_leaf])
    loss = (out.float() * dout.float()).sum() + (lse.nan_to_num(0, 0, 0) * dlse).sum()
    grads = torch.autograd.grad(loss, inputs)
    starts_q, starts_k = cu_seqlens(lengths_q).tolist(), cu_seqlens(lengths_k).tolist()
    dsinks64 = torch.zeros(h, dtype=torch.float64)
    for i in range(b):
        rows = slice(starts_q[i], starts_q[i] + used_q[i])
        keys = slice(starts_k[i], starts_k[i] + used_k[i])
        unused = slice(starts_q[i] + used_q[i], starts_q[i + 1])
        assert not out[unused].any() and (lse[:, unused] == -float("inf")).all()
        assert not grads[0][unused].any()
        unused_keys = slice(starts_k[i] + used_k[i], starts_k[i + 1])
        assert not grads[1][unused_keys].any()
        if used_q[i] == 0:
            continue
        seq = [x[None, r] for x, r in ((q, rows), (k, keys), (v, keys))]
        seq64 = [x.double().requires_grad_() for x in seq]
        sink64 = None if sinks is None else sinks.double().requires_grad_()
        out64, lse64 = dense.attention(*seq64, sinks=sink64, **OPTIONS[option])
        out_low, _ = dense.attention(*seq, sinks=sinks, upcast=False, **OPTIONS[option])
        assert_close_fa(out[rows], out64[0], out_low[0])
        assert_lse_close(lse[:, rows], lse64[0].float())
        loss64 = (out64[0] * dout[rows].double()).sum()
        loss64 = loss64 + (lse64[0].nan_to_num(0, 0, 0) * dlse[:, rows].double()).sum()
        g64 = torch.autograd.grad(loss64, seq64 + ([] if sinks is None else [sink64]))
        for grad, r, grad64 in zip(grads, (rows, keys, keys), g64):
            torch.testing.assert_close(grad[r].double(), grad64[0], atol=3e-2, rtol=3e-2)
        if sinks is not None:
            dsinks64 += g64[3]
    if sinks is not None:
        # D = dO · out uses the saved out, rounded to bf16 (as FA's backward)
        torch.testing.assert_close(grads[3].double(), dsinks64, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("layout", ["5-D", "4-D GQA"])
def test_flash_attn_qkvpacked_func(layout):
    """The same output and gradients as ``flash_attn_func`` on the three parts."""
    gen = torch.Generator().manual_seed(5)
    if layout == "5-D":
        qkv = torch.randn(2, 33, 3, 4, 32, generator=gen, dtype=torch.float16)
        parts, packed = qkv.unbind(2), dict()
    else:
        qkv = torch.randn(2, 33, 4 + 2 * 2, 32, generator=gen, dtype=torch.float16)
        parts, packed = qkv.split([4, 2, 2], dim=2), dict(num_heads_q=4)
    leaf = qkv.clone().requires_grad_()
    out, lse = attn_ref.flash_attn_qkvpacked_func(
        leaf, causal=True, softcap=3.0, return_attn_probs=True, **packed
    )
    (out.float().square().sum() + lse.sum()).backward()
    part_leaves = [x.clone().requires_grad_() for x in parts]
    out_p, lse_p = attn_ref.flash_attn_func(
        *part_leaves, causal=True, softcap=3.0, return_attn_probs=True
    )
    (out_p.float().square().sum() + lse_p.sum()).backward()
    assert torch.equal(out, out_p) and torch.equal(lse, lse_p)
    dim = 2 if layout == "5-D" else None
    expected = (
        torch.stack([x.grad for x in part_leaves], dim)
        if dim
        else torch.cat([x.grad for x in part_leaves], 2)
    )
    assert torch.equal(leaf.grad, expected)


def test_qv_forward_and_no_gradient():
    """``qv`` adds ``qv·v`` to the scores (forward); asking for a gradient through it is refused at
    the forward."""
    q, k, v, qv = random_problem(2, 7, 9, 4, 2, 32, 16, torch.float32, seed=1)
    out = attn_ref.flash_attn_func(q, k, v, causal=True, qv=qv)
    out64, _ = dense.attention(q.double(), k.double(), v.double(), qv=qv.double(), causal=True)
    torch.testing.assert_close(out.double(), out64, atol=1e-5, rtol=1e-5)
    with pytest.raises(NotImplementedError) as exc:
        attn_ref.flash_attn_func(q.requires_grad_(), k, v, qv=qv)
    assert str(exc.value) == (
        "qv has no backward in the reference: run the call under torch.no_grad() (or detach q, k, "
        "v and qv) to compute it without gradients"
    )
    with torch.no_grad():
        assert torch.equal(attn_ref.flash_attn_func(q, k, v, causal=True, qv=qv), out)


def test_performance_switches_change_nothing_and_backward_is_deterministic():
    """``num_splits``, ``pack_gqa``, ``sm_margin``, ``deterministic`` give the same bits; two
    backward passes give bitwise-equal gradients."""
    q, k, v, dout = random_problem(2, 70, 90, 4, 2, 32, 32, torch.bfloat16, seed=2)

    def run(**switches):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = attn_ref.flash_attn_func(*leaves, causal=True, window_size=(30, 5), **switches)
        return (out, *torch.autograd.grad(out, leaves, dout))

    first = run(deterministic=True)
    for again in (
        run(deterministic=True),
        run(num_splits=3, pack_gqa=True, sm_margin=8),
    ):
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_memory_stays_bounded(monkeypatch):
    """With a tiny score budget the forward and backward tile finely and give the same results."""
    q, k, v, dout = random_problem(2, 50, 70, 4, 2, 16, 16, torch.float32, seed=3)

    def run():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = attn_ref.flash_attn_func(
            *leaves, causal=True, softcap=2.0, return_attn_probs=True
        )
        return (out, lse, *torch.autograd.grad(out, leaves, dout))

    expected = run()
    for module in (attn_ref.attention, attn_ref.backward):
        monkeypatch.setattr(module, "MAX_SCORE_ELEMENTS", 4 * 70 * 2)  # 2 rows per tile
    for got, want in zip(run(), expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_row_with_no_key_and_zero_length_sequences():
    """Causal with ``s_q > s_k``: the first rows see no key (out 0, lse -inf, zero gradients); a
    varlen batch with empty sequences."""
    q, k, v, dout = random_problem(1, 5, 2, 2, 1, 16, 16, torch.float16, seed=4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = attn_ref.flash_attn_func(*leaves, causal=True, return_attn_probs=True)
    assert out[0, :3].abs().max() == 0 and (lse[0, :, :3] == -float("inf")).all()
    dq, _, _ = torch.autograd.grad(out, leaves, dout)
    assert dq[0, :3].abs().max() == 0 and dq.isfinite().all()
    cu = torch.tensor([0, 0, 4, 4], dtype=I32)
    packed = [
        x.clone().requires_grad_() for x in (q[0, :4], k[0].repeat(2, 1, 1), v[0].repeat(2, 1, 1))
    ]
    cu_k = torch.tensor([0, 1, 3, 4], dtype=I32)
    out = attn_ref.flash_attn_varlen_func(*packed, cu, cu_k, 4, 2)
    assert out.shape == (4, 2, 16) and out.isfinite().all()
    out.sum().backward()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("descales", [False, True], ids=["no-descale", "descale"])
@pytest.mark.parametrize("batched", [True, False], ids=["func", "varlen"])
def test_fp8_forward(batched, descales, causal):
    """fp8 inputs (GQA; varlen with an empty sequence and one with no key), dequantized by the
    ``(b, h_k)`` descales as ``flash_attn_with_kvcache`` does: bf16 ``out`` by FA's fp8 rule
    against the float64 dense attention of the dequantized inputs; the LSE tightly."""
    check_fp8(attn_ref, batched, descales, causal)
