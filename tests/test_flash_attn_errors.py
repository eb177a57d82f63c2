"""The errors of FA3's prefill and training entry points, to the letter and in FA3's order.

Each table lists the checks of one entry point in the order they run (:mod:`attn_ref.fa3_checks`,
:func:`attn_ref.flash_attn.check_combine_args`): how to break one valid call so that exactly that
check fails, and the error it raises (FA3's words from ``mha_fwd`` / ``mha_combine`` where FA3
checks the same condition). Each break alone gives its error; with any later break on top, the
earlier error still wins, which pins the order pair by pair.
"""

from __future__ import annotations

import pytest
import torch

import attn_ref

I32 = torch.int32
F8 = torch.float8_e4m3fn


def _tensors(*shapes, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).to(dtype) for shape in shapes]


def _with(**changes):
    """A break: the call's arguments with ``changes`` applied, each a function of the argument's
    current value."""
    return lambda args: {**args, **{name: fix(args[name]) for name, fix in changes.items()}}


FP8_QV = "qv is not supported with float8_e4m3fn inputs"
FP8_GRADIENT = (
    "fp8 inputs have no backward (FA3's backward refuses fp8): run the call under torch.no_grad() "
    "(or detach q, k and v) to compute it without gradients"
)
QV_GRADIENT = (
    "qv has no backward in the reference: run the call under torch.no_grad() (or detach q, k, v "
    "and qv) to compute it without gradients"
)
SOFTCAP = "softcap must be a real number, got None: softcap=0.0 turns softcapping off"
TO_FP8 = _with(**{name: (lambda x: x.to(F8)) for name in ("q", "k", "v", "qv")})


def _three_heads(x):
    """``x (..., h_k, d)`` with 3 heads, as a view (works for every dtype)."""
    return x[..., :1, :].expand(*x.shape[:-2], 3, x.shape[-1])


# ---- flash_attn_func: q (2, 4, 4, 16), k and v (2, 6, 2, 16), qv (2, 4, 4, 16) ------------------
def func_args():
    q, k, v, qv = _tensors((2, 4, 4, 16), (2, 6, 2, 16), (2, 6, 2, 16), (2, 4, 4, 16))
    return dict(q=q, k=k, v=v, qv=qv, causal=True, softcap=0.0)


FUNC = [
    ("q-not-tensor", _with(q=lambda q: None), TypeError, "q must be a torch.Tensor, got NoneType"),
    (
        "q-dtype",
        _with(q=lambda q: q.double()),
        ValueError,
        "q must have dtype float16, bfloat16, float32 or float8_e4m3fn, got torch.float64",
    ),
    ("k-dtype", _with(k=lambda k: k.float()), ValueError, "query and key must have the same dtype"),
    (
        "v-dtype",
        _with(v=lambda v: v.float()),
        ValueError,
        "query and value must have the same dtype",
    ),
    (
        "k-device",
        _with(k=lambda k: k.to("meta")),
        ValueError,
        "k must be on the same device as q (cpu), got meta",
    ),
    (
        "v-device",
        _with(v=lambda v: v.to("meta")),
        ValueError,
        "v must be on the same device as q (cpu), got meta",
    ),
    (
        "batch",
        _with(k=lambda k: k[:1], v=lambda v: v[:1]),
        ValueError,
        "batch_size must be equal to batch_size_k",
    ),
    (
        "heads",
        _with(k=_three_heads, v=_three_heads),
        ValueError,
        "Number of heads in key/value must divide number of heads in query",
    ),
    (
        "q-shape",
        _with(q=lambda q: q.unsqueeze(1)),
        ValueError,
        "q must have shape (batch_size, seqlen_q, num_heads, head_size)",
    ),
    (
        "k-shape",
        _with(k=lambda k: k[..., :8]),
        ValueError,
        "k must have shape (batch_size_k, seqlen_k, num_heads_k, head_size)",
    ),
    (
        "v-shape",
        _with(v=lambda v: v[:, :5]),
        ValueError,
        "v must have shape (batch_size_k, seqlen_k, num_heads_k, head_size_v)",
    ),
    ("fp8-qv", TO_FP8, ValueError, FP8_QV),
    (
        "qv-dtype",
        _with(qv=lambda qv: qv.float()),
        ValueError,
        "q_v must have the same dtype as query",
    ),
    (
        "qv-device",
        _with(qv=lambda qv: qv.to("meta")),
        ValueError,
        "qv must be on the same device as q (cpu), got meta",
    ),
    (
        "qv-shape",
        _with(qv=lambda qv: qv[..., :8]),
        ValueError,
        "q_v must have shape (batch_size, seqlen_q, num_heads, head_size_v)",
    ),
    (
        "qv-gradient",
        _with(q=lambda q: q.detach().requires_grad_()),
        NotImplementedError,
        QV_GRADIENT,
    ),
    ("softcap", _with(softcap=lambda s: None), TypeError, SOFTCAP),
]


# ---- flash_attn_varlen_func: sequences of 4 + 4 queries, 6 + 6 keys, 4 heads, 2 KV heads --------
def varlen_args():
    q, k, v, qv = _tensors((8, 4, 16), (12, 2, 16), (12, 2, 16), (8, 4, 16))
    return dict(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=torch.tensor([0, 4, 8], dtype=I32),
        cu_seqlens_k=torch.tensor([0, 6, 12], dtype=I32),
        max_seqlen_q=4,
        max_seqlen_k=6,
        seqused_q=torch.tensor([4, 3], dtype=I32),
        seqused_k=torch.tensor([6, 5], dtype=I32),
        qv=qv,
        causal=True,
        softcap=0.0,
        sinks=torch.zeros(4),
    )


def _pair(name, cu_or_used, dtype_text, shape_text):
    """The device, dtype and shape breaks of one index tensor, in FA3's order for it."""
    device = (
        f"{name}-device",
        _with(**{name: lambda x: x.to("meta")}),
        ValueError,
        f"{name} must be on the same device as q (cpu), got meta",
    )
    dtype = (
        f"{name}-dtype",
        _with(**{name: lambda x: x.long()}),
        ValueError,
        f"{name} must have dtype {dtype_text}",
    )
    if cu_or_used == "cu":
        return [device, dtype]
    shape = (
        f"{name}-shape",
        _with(**{name: lambda x: x[:1]}),
        ValueError,
        f"{name} must have shape ({shape_text})",
    )
    return [dtype, device, shape]


VARLEN = [
    ("q-not-tensor", _with(q=lambda q: None), TypeError, "q must be a torch.Tensor, got NoneType"),
    (
        "cu_seqlens_k-not-tensor",
        _with(cu_seqlens_k=lambda cu: None),
        TypeError,
        "cu_seqlens_k must be a torch.Tensor, got NoneType",
    ),
    (
        "q-dtype",
        _with(q=lambda q: q.double()),
        ValueError,
        "q must have dtype float16, bfloat16, float32 or float8_e4m3fn, got torch.float64",
    ),
    ("k-dtype", _with(k=lambda k: k.float()), ValueError, "query and key must have the same dtype"),
    (
        "v-dtype",
        _with(v=lambda v: v.float()),
        ValueError,
        "query and value must have the same dtype",
    ),
    (
        "k-device",
        _with(k=lambda k: k.to("meta")),
        ValueError,
        "k must be on the same device as q (cpu), got meta",
    ),
    *_pair("cu_seqlens_q", "cu", "torch.int32", None),
    (
        "max_seqlen_q",
        _with(max_seqlen_q=lambda n: None),
        ValueError,
        "max_seqlen_q must be provided if cu_seqlens_q is provided",
    ),
    *_pair("cu_seqlens_k", "cu", "torch.int32", None),
    (
        "max_seqlen_k",
        _with(max_seqlen_k=lambda n: None),
        ValueError,
        "max_seqlen_k must be provided if cu_seqlens_k is provided",
    ),
    (
        "max_seqlen_k-type",
        _with(max_seqlen_k=lambda n: 6.0),
        TypeError,
        "max_seqlen_k must be an int in int64 range, got 6.0",
    ),
    (
        "batch",
        _with(cu_seqlens_k=lambda cu: cu[::2].contiguous()),
        ValueError,
        "batch_size must be equal to batch_size_k",
    ),
    (
        "heads",
        _with(k=_three_heads, v=_three_heads),
        ValueError,
        "Number of heads in key/value must divide number of heads in query",
    ),
    (
        "q-shape",
        _with(q=lambda q: q.unsqueeze(0)),
        ValueError,
        "q must have shape (total_q, num_heads, head_size)",
    ),
    (
        "cu_seqlens_q-shape",
        _with(cu_seqlens_q=lambda cu: cu.reshape(3, 1)),
        ValueError,
        "cu_seqlens_q must have shape (batch_size + 1)",
    ),
    (
        "k-shape",
        _with(k=lambda k: k[..., :8]),
        ValueError,
        "k must have shape (total_k, num_heads_k, head_size)",
    ),
    (
        "v-shape",
        _with(v=lambda v: v[:11]),
        ValueError,
        "v must have shape (total_k, num_heads_k, head_size_v)",
    ),
    (
        "cu_seqlens_k-shape",
        _with(cu_seqlens_k=lambda cu: cu.reshape(3, 1)),
        ValueError,
        "cu_seqlens_k must have shape (batch_size + 1)",
    ),
    *_pair("seqused_q", "used", "int32", "batch_size"),
    *_pair("seqused_k", "used", "int32", "batch_size"),
    ("fp8-qv", TO_FP8, ValueError, FP8_QV),
    (
        "qv-dtype",
        _with(qv=lambda qv: qv.float()),
        ValueError,
        "q_v must have the same dtype as query",
    ),
    (
        "qv-device",
        _with(qv=lambda qv: qv.to("meta")),
        ValueError,
        "qv must be on the same device as q (cpu), got meta",
    ),
    (
        "qv-shape",
        _with(qv=lambda qv: qv[..., :8]),
        ValueError,
        "q_v must have shape (total_q, num_heads, head_size_v)",
    ),
    (
        "sinks-dtype",
        _with(sinks=lambda s: s.long()),
        ValueError,
        "sinks must have a floating-point dtype, got torch.int64",
    ),
    (
        "sinks-device",
        _with(sinks=lambda s: s.to("meta")),
        ValueError,
        "sinks must be on the same device as q (cpu), got meta",
    ),
    ("sinks-shape", _with(sinks=lambda s: s[:3]), ValueError, "sinks must have shape (num_heads)"),
    (
        "qv-gradient",
        _with(q=lambda q: q.detach().requires_grad_()),
        NotImplementedError,
        QV_GRADIENT,
    ),
    ("softcap", _with(softcap=lambda s: None), TypeError, SOFTCAP),
    (
        "cu_seqlens_q-values",
        _with(cu_seqlens_q=lambda cu: torch.tensor([0, 9, 8], dtype=I32)),
        ValueError,
        "cu_seqlens_q must start at 0, never decrease and end at q.shape[0]=8, got [0, 9, 8]",
    ),
    (
        "seqused_k-values",
        _with(seqused_k=lambda used: torch.tensor([7, 5], dtype=I32)),
        ValueError,
        "seqused_k[0] values must lie in [0, 7), got [7]",
    ),
]


# ---- flash_attn_combine: 2 splits of (2, 3, 4, 8) ------------------------------------------------
def combine_args():
    out_partial, lse_partial = _tensors((2, 2, 3, 4, 8), (2, 2, 3, 4), dtype=torch.float32)
    return dict(out_partial=out_partial, lse_partial=lse_partial, out=None, out_dtype=None)


COMBINE = [
    (
        "out_partial-not-tensor",
        _with(out_partial=lambda o: None),
        TypeError,
        "out_partial must be a torch.Tensor, got NoneType",
    ),
    (
        "lse_partial-not-tensor",
        _with(lse_partial=lambda lse: None),
        TypeError,
        "lse_partial must be a torch.Tensor, got NoneType",
    ),
    (
        "out_partial-shape",
        _with(out_partial=lambda o: o.unsqueeze(0)),
        ValueError,
        "out_partial must have shape (num_splits, batch_size, seqlen, num_heads, head_size_og)",
    ),
    (
        "lse_partial-shape",
        _with(lse_partial=lambda lse: lse.transpose(2, 3)),
        ValueError,
        "lse_partial must have shape (num_splits, batch_size, seqlen, num_heads)",
    ),
    (
        "lse_partial-dtype",
        _with(lse_partial=lambda lse: lse.long()),
        ValueError,
        "out_partial and lse_partial must be floating point on one device, got torch.float32 on "
        "cpu and torch.int64 on cpu",
    ),
    (
        "out_dtype",
        _with(out_dtype=lambda d: "bf16"),
        ValueError,
        "Output type must be FP32, FP16 or BF16",
    ),
    (
        "out-not-tensor",
        _with(out=lambda o: [0.0]),
        TypeError,
        "out must be a torch.Tensor, got list",
    ),
    (
        "out-dtype",
        _with(out=lambda o: torch.empty(2, 3, 4, 8, dtype=torch.float16)),
        ValueError,
        "out must have dtype torch.float32, got torch.float16",
    ),
    (
        "out-strided",
        _with(out=lambda o: torch.empty(2, 3, 8, 4).transpose(2, 3)),
        ValueError,
        "Output tensor must have contiguous last dimension",
    ),
    (
        "out-shape",
        _with(out=lambda o: torch.empty(2, 3, 4, 7)),
        ValueError,
        "out must have shape (batch_size, seqlen, num_heads, head_size_og)",
    ),
    (
        "no-splits",
        _with(out_partial=lambda o: o[:0], lse_partial=lambda lse: lse[:0]),
        ValueError,
        "out_partials must be (n, ..., dim) with n >= 1 states, got shape (0, 2, 3, 4, 8)",
    ),
]

ENTRY_POINTS = {
    "func": (attn_ref.flash_attn_func, func_args, FUNC),
    "varlen": (attn_ref.flash_attn_varlen_func, varlen_args, VARLEN),
    "combine": (attn_ref.flash_attn_combine, combine_args, COMBINE),
}
CASES = [(entry, i) for entry, (_, _, table) in ENTRY_POINTS.items() for i in range(len(table))]


def _raised(entry, breaks):
    """``(type, message)`` of the error of the entry point's valid call with ``breaks`` applied in
    turn (None when the call runs)."""
    fn, make_args, _ = ENTRY_POINTS[entry]
    args = make_args()
    for brk in breaks:
        args = brk(args)
    try:
        fn(**args)
    except Exception as exc:  # the point of the test: which error comes out
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_valid_calls_run(entry):
    assert _raised(entry, []) is None


@pytest.mark.parametrize(
    "entry, index", CASES, ids=[f"{e}-{ENTRY_POINTS[e][2][i][0]}" for e, i in CASES]
)
def test_each_check_raises_its_error(entry, index):
    _, brk, exc_type, message = ENTRY_POINTS[entry][2][index]
    assert _raised(entry, [brk]) == (exc_type, message)


@pytest.mark.parametrize(
    "entry, index", CASES, ids=[f"{e}-{ENTRY_POINTS[e][2][i][0]}" for e, i in CASES]
)
def test_each_check_comes_before_the_later_ones(entry, index):
    """Check ``index`` with every later check broken too: its error still comes out."""
    table = ENTRY_POINTS[entry][2]
    name, brk, exc_type, message = table[index]
    wrong = {
        later[0]: got
        for later in table[index + 1 :]
        if (got := _raised(entry, [later[1], brk])) != (exc_type, message)
    }
    assert not wrong, (name, wrong)


def test_qkvpacked_heads():
    q, k, v = _tensors((2, 4, 4, 16), (2, 6, 2, 16), (2, 6, 2, 16))
    with pytest.raises(ValueError) as exc:
        attn_ref.flash_attn_qkvpacked_func(torch.cat((q, q), dim=2))
    assert str(exc.value) == (
        "a 4-D qkv (batch, seqlen, h + 2 * h_k, d) needs num_heads_q = h with 0 < h < 8 and "
        "8 - h even (h_k key heads, then h_k value heads), got num_heads_q=None"
    )


def _fp8_call(entry, **extra):
    """The entry point's valid call in fp8 (no qv, which fp8 does not take) with ``extra``."""
    fn, make_args, _ = ENTRY_POINTS[entry]
    args = {name: x.to(F8) for name, x in make_args().items() if name in ("q", "k", "v")}
    return lambda **more: fn(**{**make_args(), **args, "qv": None, **extra, **more})


@pytest.mark.parametrize("entry", ["func", "varlen"])
@pytest.mark.parametrize(
    "descale, message",
    [
        (torch.ones(2, 2, dtype=torch.float64), "must have dtype torch.float32, got torch.float64"),
        (torch.ones(2, 4), "must have shape (2, 2) (batch, h_k), got (2, 4)"),
        (torch.ones(2, 2, device="meta"), "must be on the same device as q (cpu), got meta"),
    ],
    ids=["dtype", "shape", "device"],
)
@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_fp8_descales_are_checked_as_the_kvcache_ones(entry, descale, message, name):
    """fp8 descales: ``(b, h_k)`` float32 on q's device (b: the batch or the number of
    sequences), in ``flash_attn_with_kvcache``'s words; not read for other dtypes (FA3)."""
    with pytest.raises(ValueError) as exc:
        _fp8_call(entry)(**{name: descale})
    assert str(exc.value) == f"{name} {message}"
    fn, make_args, _ = ENTRY_POINTS[entry]
    fn(**make_args(), **{name: descale})  # fp16: the descale is not read


@pytest.mark.parametrize("entry", ["func", "varlen"])
def test_fp8_gradient_is_refused(entry):
    """fp8 inputs are forward only: a gradient asked (grad mode on, an input requiring grad) is
    refused at the forward; under no_grad the same call runs."""
    call = _fp8_call(entry)
    fn, make_args, _ = ENTRY_POINTS[entry]
    q = make_args()["q"].to(F8).requires_grad_()
    with pytest.raises(NotImplementedError) as exc:
        call(q=q)
    assert str(exc.value) == FP8_GRADIENT
    with torch.no_grad():
        assert call(q=q).dtype == torch.bfloat16
