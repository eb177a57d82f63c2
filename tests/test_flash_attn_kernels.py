"""FA3's ``flash_attn_func``, ``flash_attn_varlen_func`` and ``flash_attn_qkvpacked_func`` on the
Triton kernels (:mod:`kernels.flash_attn`), under the interpreter on CPU, in the style of
:mod:`test_flash_attn_reference`.

Each call runs on both implementations with the same leaves. The kernels' output, LSE and
gradients (q, k, v, sinks) are held to FA's rule against float64 autograd of the dense formula
(:func:`attn_ref.dense.attention`, baseline: the same formula in the inputs' dtype), the LSE
tightly; and to the reference: the LSE within fp32 noise, fp32 calls' outputs and gradients too,
16-bit ones by FA's rule with the reference as the oracle. Sampled grid (small shapes, the
interpreter is slow):

* ``flash_attn_func``: :data:`FUNC_CASES`, every mask family, softcap, MHA / GQA / MQA,
  ``s_q > s_k`` (rows that see no key), fp16 / bf16 / fp32, ``d_v != d``.
* ``flash_attn_varlen_func``: :data:`VARLEN_CASES`, FA's random padding as ``cu_seqlens``,
  ``seqused_q`` / ``seqused_k``, zero-length sequences, sglang's ``sinks`` (and their gradient);
  unused rows give ``out = 0``, ``lse = -inf`` and, with unused keys, zero gradients; a call
  with no key at all.
* ``flash_attn_qkvpacked_func``: 5-D and 4-D GQA ``qkv``, the same bits as ``flash_attn_func`` on
  the parts.
* fp8 inputs (forward only, bf16 ``out``): :func:`flash_attn_cases.check_fp8` against the dense
  attention of the dequantized inputs, the LSE also against the reference's.
* ``qv`` (forward only), the deterministic repeat (bitwise) and the result-neutral switches, the
  reference's errors.
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

kernels = pytest.importorskip("kernels")

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
IMPLEMENTATIONS = {"reference": attn_ref, "kernels": kernels}


def _run(api, leaves, dout, dlse, call):
    """``(out, lse, grads)`` of ``call(api, *leaves)`` (``(out, lse)``) for the loss ``Σ out·dout +
    Σ lse·dlse`` (``-inf`` LSEs left out), the gradients of ``leaves``."""
    leaves = [x.clone().requires_grad_() for x in leaves]
    out, lse = call(api, *leaves)
    loss = (out.float() * dout.float()).sum() + (lse.nan_to_num(0, 0, 0) * dlse).sum()
    return out, lse, torch.autograd.grad(loss, leaves)


def _assert_matches_reference(got, ref, out_low, grads_low):
    """The kernels' ``(out, lse, grads)`` against the reference's ``ref``: the LSE within fp32
    noise; for fp32 inputs the output and gradients too, for 16-bit ones FA's rule with the
    reference as the oracle and ``out_low``, ``grads_low`` (the dense formula in the inputs'
    dtype) as the baseline (the kernels round ``P`` and ``dS`` to the inputs' dtype for their
    matmuls, as FA does: more than one rounding from the reference's fp32 math, and so is the
    sinks' gradient, through ``D = dO · out``)."""
    (out, lse, grads), (out_ref, lse_ref, grads_ref) = got, ref
    assert_lse_close(lse, lse_ref)
    for x, x_ref, x_low in zip((out, *grads), (out_ref, *grads_ref), (out_low, *grads_low)):
        assert x.dtype == x_ref.dtype and x.shape == x_ref.shape
        if out.dtype == F32:
            torch.testing.assert_close(x, x_ref, atol=1e-5, rtol=1e-5)
        else:
            assert_close_fa(x, x_ref, x_low)


#: ``(seqlens, heads, option, dtype, (d, d_v))``
FUNC_CASES = [
    ((1, 1), "mha", "full", BF16, (32, 32)),
    ((1, 3), "gqa", "causal", F16, (32, 32)),
    ((3, 1), "mqa", "causal", F32, (32, 32)),
    ((33, 65), "gqa", "window", BF16, (40, 40)),
    ((65, 33), "mha", "causal-window", F16, (32, 32)),
    ((70, 90), "mqa", "chunk", F32, (32, 16)),
    ((113, 203), "gqa", "softcap", F16, (32, 32)),
    ((96, 96), "mha", "causal", BF16, (16, 32)),
]


@pytest.mark.parametrize(
    "seqlens, heads, option, dtype, dims",
    FUNC_CASES,
    ids=[f"{s[0]}x{s[1]}-{hd}-{o}-{str(t)[6:]}" for s, hd, o, t, _ in FUNC_CASES],
)
def test_flash_attn_func_output_and_gradients(seqlens, heads, option, dtype, dims):
    sq, sk = seqlens
    (h, h_k), (d, dv), b = HEADS[heads], dims, 1 if sq > 100 else 2
    q, k, v, dout = random_problem(b, sq, sk, h, h_k, d, dv, dtype, seed=sq * 7 + sk)
    dlse = torch.randn(b, h, sq, generator=torch.Generator().manual_seed(sk))
    options = OPTIONS[option]

    def call(api, q, k, v):
        return api.flash_attn_func(q, k, v, **options, return_attn_probs=True)

    out, lse, grads = got = _run(kernels, (q, k, v), dout, dlse, call)
    assert out.dtype == dtype and out.shape == (b, sq, h, dv)
    assert lse.dtype == F32 and lse.shape == (b, h, sq)
    out64, lse64, grads64, out_low, grads_low = expected(q, k, v, dout, dlse, **options)
    assert_close_fa(out, out64, out_low)
    assert_lse_close(lse, lse64.float())
    for name, grad, grad64, grad_low in zip("qkv", grads, grads64, grads_low):
        assert grad.dtype == dtype, name
        assert_close_fa(grad, grad64, grad_low)
    _assert_matches_reference(got, _run(attn_ref, (q, k, v), dout, dlse, call), out_low, grads_low)


#: ``(seqlens, option, heads, dtype, zero_lengths, seqused, sinks)``
VARLEN_CASES = [
    ((5, 9), "full", "gqa", F16, True, False, True),
    ((40, 70), "causal", "mha", BF16, False, True, True),
    ((70, 40), "causal-window", "gqa", F32, True, True, False),
    ((60, 90), "chunk", "mqa", F16, False, False, False),
    ((33, 33), "softcap", "gqa", BF16, True, True, True),
]


@pytest.mark.parametrize(
    "seqlens, option, heads, dtype, zero_lengths, seqused, sinks",
    VARLEN_CASES,
    ids=[
        f"{s[0]}x{s[1]}-{o}-{hd}-{str(t)[6:]}" + "-zero" * z + "-seqused" * u + "-sinks" * k
        for s, o, hd, t, z, u, k in VARLEN_CASES
    ],
)
def test_flash_attn_varlen_func(seqlens, option, heads, dtype, zero_lengths, seqused, sinks):
    """Random padding turned into ``cu_seqlens`` (and some sequences used only in part): each
    sequence's rows and gradients as the dense formula of that sequence alone, by FA's rule over
    the whole packed tensors; unused rows get ``out = 0``, ``lse = -inf`` and, as unused keys,
    zero gradients."""
    sq, sk = seqlens
    (h, h_k), b, d = HEADS[heads], 3, 32
    gen = torch.Generator().manual_seed(sq + 3 * sk + seqused)
    lengths_q = padding_lengths(b, sq, gen, zero_lengths)
    lengths_k = padding_lengths(b, sk, gen, zero_lengths)
    used_q, used_k = lengths_q, lengths_k
    if seqused:
        used_q = [torch.randint(0, n + 1, (), generator=gen).item() for n in lengths_q]
        used_k = [torch.randint(0, n + 1, (), generator=gen).item() for n in lengths_k]
    rows_keys = ((sum(lengths_q), h), (sum(lengths_k), h_k), (sum(lengths_k), h_k))
    q, k, v, dout = (
        torch.randn(n, heads_, d, generator=gen).to(dtype)
        for n, heads_ in rows_keys + (rows_keys[0],)
    )
    dlse = torch.randn(h, sum(lengths_q), generator=gen)
    leaves = (q, k, v) + ((torch.randn(h, generator=gen),) if sinks else ())
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    used = (torch.tensor(used_q, dtype=I32), torch.tensor(used_k, dtype=I32)) if seqused else ()

    def call(api, q, k, v, sinks=None):
        out, lse, *rest = api.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max(lengths_q),
            max(lengths_k),
            *used,
            **OPTIONS[option],
            sinks=sinks,
            return_softmax_lse=True,
        )
        assert rest == [None, None]
        return out, lse

    out, lse, grads = got = _run(kernels, leaves, dout, dlse, call)
    assert out.shape == (sum(lengths_q), h, d) and lse.shape == (h, sum(lengths_q))
    want = _expected_varlen(
        leaves, dout, dlse, cu_q.tolist(), cu_k.tolist(), used_q, used_k, OPTIONS[option]
    )
    _assert_packed_close((out, lse, grads), want)
    _assert_matches_reference(got, _run(attn_ref, leaves, dout, dlse, call), *want[3:])


def _expected_varlen(leaves, dout, dlse, starts_q, starts_k, used_q, used_k, options):
    """What the packed call must give: ``(out64, lse64, grads64, out_low, grads_low)`` as
    :func:`flash_attn_cases.expected`, each sequence's rows and keys from its own dense problem,
    zero (``lse``: ``-inf``) elsewhere; ``leaves``: ``(q, k, v)``, or ``(q, k, v, sinks)``."""
    q, k, v, *sinks = leaves
    out64 = torch.zeros(*q.shape[:2], v.shape[-1], dtype=torch.float64)
    out_low = torch.zeros(out64.shape, dtype=q.dtype)
    lse64 = torch.full(dlse.shape, float("-inf"), dtype=torch.float64)
    grads64 = [torch.zeros(x.shape, dtype=torch.float64) for x in leaves]
    grads_low = [torch.zeros_like(x) for x in leaves]
    for i, (rows_used, keys_used) in enumerate(zip(used_q, used_k)):
        rows = slice(starts_q[i], starts_q[i] + rows_used)
        keys = slice(starts_k[i], starts_k[i] + keys_used)
        parts = [x[None, r] for x, r in ((q, rows), (k, keys), (v, keys))] + sinks
        for upcast, out_to, grads_to in ((True, out64, grads64), (False, out_low, grads_low)):
            inputs = [x.double() if upcast else x.clone() for x in parts]
            inputs = [x.requires_grad_() for x in inputs]
            out, lse = dense.attention(
                *inputs[:3], sinks=(inputs[3:] or [None])[0], upcast=upcast, **options
            )
            loss = (out[0].double() * dout[rows].double()).sum()
            loss = loss + (lse[0].double().nan_to_num(0, 0, 0) * dlse[:, rows].double()).sum()
            seq_grads = torch.autograd.grad(loss, inputs)
            out_to[rows] = out[0].to(out_to.dtype)
            if upcast:
                lse64[:, rows] = lse[0]
            for grad_to, grad, r in zip(grads_to, seq_grads, (rows, keys, keys, slice(None))):
                grad_to[r] += grad[0] if grad.dim() > 1 else grad
    return out64, lse64, grads64, out_low, grads_low


def _assert_packed_close(got, want):
    """The packed call's ``(out, lse, grads)`` against :func:`_expected_varlen`'s: FA's rule
    (``-inf`` LSEs and zeros where the sequences leave rows or keys unused, exactly)."""
    (out, lse, grads), (out64, lse64, grads64, out_low, grads_low) = got, want
    assert_close_fa(out, out64, out_low)
    assert_lse_close(lse, lse64.float())
    unused_rows = lse64[0].isinf()
    assert not out[unused_rows].any()
    for name, grad, grad64, grad_low in zip(
        ("dq", "dk", "dv", "dsinks"), grads, grads64, grads_low
    ):
        assert grad.dtype == grad_low.dtype, name
        assert_close_fa(grad, grad64, grad_low)
        assert not grad[grad64 == 0].any() or name == "dsinks", name


@pytest.mark.parametrize("layout", ["5-D", "4-D GQA"])
def test_flash_attn_qkvpacked_func(layout):
    """The same bits as ``flash_attn_func`` on the three parts; the output and the gradient of
    ``qkv`` by FA's rule against float64 and against the reference."""
    gen = torch.Generator().manual_seed(5)
    if layout == "5-D":
        qkv = torch.randn(2, 33, 3, 4, 32, generator=gen, dtype=F16)
        parts, packed = qkv.unbind(2), dict()
    else:
        qkv = torch.randn(2, 33, 4 + 2 * 2, 32, generator=gen, dtype=F16)
        parts, packed = qkv.split([4, 2, 2], dim=2), dict(num_heads_q=4)
    options = dict(causal=True, softcap=3.0, return_attn_probs=True)
    results = {}
    for name, api in IMPLEMENTATIONS.items():
        leaf = qkv.clone().requires_grad_()
        out, lse = api.flash_attn_qkvpacked_func(leaf, **options, **packed)
        (out.float().square().sum() + lse.sum()).backward()
        results[name] = out, lse, leaf.grad
    part_leaves = [x.clone().requires_grad_() for x in parts]
    out_p, lse_p = kernels.flash_attn_func(*part_leaves, **options)
    (out_p.float().square().sum() + lse_p.sum()).backward()
    out, lse, grad = results["kernels"]
    assert torch.equal(out, out_p) and torch.equal(lse, lse_p)
    glue = (lambda xs: torch.stack(xs, 2)) if layout == "5-D" else (lambda xs: torch.cat(xs, 2))
    assert torch.equal(grad, glue([x.grad for x in part_leaves]))
    expected_state = {}
    for upcast in (True, False):  # float64 autograd of the dense formula; FA's fp16 baseline
        leaves = [x.double() if upcast else x.clone() for x in parts]
        leaves = [x.requires_grad_() for x in leaves]
        out_d, lse_d = dense.attention(*leaves, causal=True, softcap=3.0, upcast=upcast)
        (out_d.float().square().sum() + lse_d.sum()).backward()
        expected_state[upcast] = out_d, glue([x.grad for x in leaves])
    (out64, grad64), (out_low, grad_low) = expected_state[True], expected_state[False]
    assert_close_fa(out, out64, out_low)
    assert_close_fa(grad, grad64, grad_low)
    out_ref, lse_ref, grad_ref = results["reference"]
    assert_lse_close(lse, lse_ref)
    assert_close_fa(out, out_ref, out_low)
    assert_close_fa(grad, grad_ref, grad_low)


def test_qv_forward_and_no_gradient():
    """``qv`` adds ``qv·v`` to the scores (forward); asking for a gradient through it is refused at
    the forward with the reference's error."""
    q, k, v, qv = random_problem(2, 7, 9, 4, 2, 32, 16, F32, seed=1)
    out = kernels.flash_attn_func(q, k, v, causal=True, qv=qv)
    out64, _ = dense.attention(q.double(), k.double(), v.double(), qv=qv.double(), causal=True)
    torch.testing.assert_close(out.double(), out64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, attn_ref.flash_attn_func(q, k, v, causal=True, qv=qv))
    errors = []
    for api in IMPLEMENTATIONS.values():
        with pytest.raises(NotImplementedError) as exc:
            api.flash_attn_func(q.clone().requires_grad_(), k, v, qv=qv)
        errors.append(str(exc.value))
    assert errors[0] == errors[1]


def test_performance_switches_change_nothing_and_backward_is_deterministic():
    """``num_splits``, ``pack_gqa``, ``sm_margin``, ``deterministic`` give the same bits; two
    backward passes give bitwise-equal gradients (no atomics), varlen with sinks too."""
    q, k, v, dout = random_problem(2, 40, 50, 4, 2, 16, 16, BF16, seed=2)

    def run(**switches):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = kernels.flash_attn_func(*leaves, causal=True, window_size=(20, 5), **switches)
        return (out, *torch.autograd.grad(out, leaves, dout))

    first = run(deterministic=True)
    for again in (run(deterministic=True), run(num_splits=3, pack_gqa=True, sm_margin=8)):
        assert all(torch.equal(a, b) for a, b in zip(first, again))

    cu_q, cu_k = cu_seqlens([15, 0, 25]), cu_seqlens([20, 20, 10])
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(3))

    def run_varlen():
        leaves = [x.clone().requires_grad_() for x in (q[0], k[0], v[0], sinks)]
        out = kernels.flash_attn_varlen_func(
            *leaves[:3], cu_q, cu_k, 25, 20, causal=True, deterministic=True, sinks=leaves[3]
        )
        return (out, *torch.autograd.grad(out, leaves, dout[0]))

    first = run_varlen()
    assert all(torch.equal(a, b) for a, b in zip(first, run_varlen()))


def test_rows_and_calls_with_no_key():
    """Causal with ``s_q > s_k``: the first rows see no key (out 0, lse -inf, zero gradients);
    varlen sequences with no row, with no key, and a call with no key at all (sinks alone: out 0,
    lse the sink), as the reference."""
    q, k, v, dout = random_problem(1, 5, 3, 2, 1, 16, 16, F32, seed=4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = kernels.flash_attn_func(*leaves, causal=True, return_attn_probs=True)
    assert out[0, :2].abs().max() == 0 and (lse[0, :, :2] == -float("inf")).all()
    dq, _, _ = torch.autograd.grad(out, leaves, dout)
    assert dq[0, :2].abs().max() == 0 and dq.isfinite().all()
    sinks = torch.randn(2, generator=torch.Generator().manual_seed(4))
    for keys in ([0, 1, 2], [0, 0, 0]):  # some sequences without keys; no key at all
        cu_q, cu_k = cu_seqlens([0, 4, 1]), cu_seqlens(keys)
        inputs = (q[0], k[0, : sum(keys)], v[0, : sum(keys)], sinks)
        results = []
        for api in IMPLEMENTATIONS.values():
            leaves = [x.clone().requires_grad_() for x in inputs]
            out, lse = api.flash_attn_varlen_func(
                *leaves[:3], cu_q, cu_k, 4, max(keys), sinks=leaves[3], return_attn_probs=True
            )
            results.append((out, lse, *torch.autograd.grad(out.sum() + lse.sum(), leaves)))
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        if sum(keys) == 0:
            assert not results[0][0].any() and torch.equal(
                results[0][1], sinks[:, None].expand(2, 5)
            )


@pytest.mark.parametrize(
    "call",
    [
        lambda api, q, k, v: api.flash_attn_func(q.double(), k.double(), v.double()),
        lambda api, q, k, v: api.flash_attn_func(q, k[:, :, :1].expand(2, 6, 3, 16), v),
        lambda api, q, k, v: api.flash_attn_func(
            *(x.to(torch.float8_e4m3fn) for x in (q, k, v)), k_descale=torch.ones(2, 4)
        ),
        lambda api, q, k, v: api.flash_attn_varlen_func(
            q.flatten(0, 1),
            k.flatten(0, 1),
            v.flatten(0, 1),
            cu_seqlens([4, 3]),
            cu_seqlens([6, 6]),
            4,
            6,
        ),
        lambda api, q, k, v: api.flash_attn_varlen_func(
            q.flatten(0, 1),
            k.flatten(0, 1),
            v.flatten(0, 1),
            cu_seqlens([4, 4]),
            cu_seqlens([6, 6]),
            4,
            6,
            seqused_k=torch.tensor([6, 7], dtype=I32),
        ),
        lambda api, q, k, v: api.flash_attn_qkvpacked_func(torch.cat((q, q), dim=2)),
    ],
    ids=["dtype", "v-shape", "fp8", "cu_seqlens", "seqused", "qkv-heads"],
)
def test_errors_are_the_references(call):
    """The checks are the reference's (shared): the same exception type and message."""
    q, k, v, _ = random_problem(2, 4, 6, 4, 2, 16, 16, F16, seed=6)
    raised = []
    for api in IMPLEMENTATIONS.values():
        with pytest.raises((ValueError, TypeError, NotImplementedError)) as exc:
            call(api, q, k, v)
        raised.append((type(exc.value), str(exc.value)))
    assert raised[0] == raised[1]


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(softmax_scale=1e-45), None),  # subnormal in float32: the interpreter's fp64 trap
        (dict(softmax_scale=0.1 + 1e-12, softcap=3.0 + 1e-12), None),  # float64-only values
        (dict(softmax_scale=-0.0), None),
        (dict(softcap=-2.0), None),  # <= 0 is off, as FA3 reads it
        (dict(softcap=2.4e38), "softcap · log2(e) must be finite in float32"),
        (dict(softmax_scale=3.5e38), "softmax_scale must be finite in float32"),
    ],
)
def test_scalars_are_the_float32_values_fa3_uses(options, error):
    """Scalars through both implementations, forward and backward: FA3's float32 values give the
    same results (the reference's fp32 math and the kernels), or both raise the same error."""
    q, k, v, _ = random_problem(1, 5, 7, 4, 2, 16, 16, F32, seed=3)
    outcomes = {}
    for name, api in IMPLEMENTATIONS.items():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        try:
            out = api.flash_attn_func(*leaves, causal=True, **options)
        except ValueError as exc:
            outcomes[name] = str(exc)
            continue
        out.sum().backward()
        outcomes[name] = (out.detach(), *(x.grad for x in leaves))
    ref, got = outcomes["reference"], outcomes["kernels"]
    if error is not None:
        assert isinstance(ref, str) and ref.startswith(error) and got == ref
        return
    for x, x_ref in zip(got, ref):
        assert x.isfinite().all()
        torch.testing.assert_close(x, x_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("descales", [False, True], ids=["no-descale", "descale"])
@pytest.mark.parametrize("batched", [True, False], ids=["func", "varlen"])
def test_fp8_forward(batched, descales, causal):
    """fp8 inputs (GQA; varlen with an empty sequence and one with no key): the forward kernel
    dequantizes sequence ``i`` by row ``i`` of the ``(b, h_k)`` descales, as for
    ``flash_attn_with_kvcache``; bf16 ``out`` by FA's fp8 rule against the float64 dense attention
    of the dequantized inputs, the LSE tightly (also against the reference's)."""
    _, lse = check_fp8(kernels, batched, descales, causal)
    _, lse_ref = check_fp8(attn_ref, batched, descales, causal)
    assert_lse_close(lse, lse_ref)
