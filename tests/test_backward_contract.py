"""The contract between the forward and ``attention_backward``, in both implementations.

* What ``flash_attn_with_kvcache(..., return_softmax_lse=True)`` returns feeds the backward as it
  is: ``out, lse, *_ = flash_attn_with_kvcache(q, k_cache, v_cache, causal=True,
  return_softmax_lse=True)``, then ``attention_backward(dout, q, k_cache, v_cache, out, lse, scale,
  AttentionMask(causal=True))`` gives the float64 autograd gradients (FlashAttention's rule), with
  and without an LSE gradient, also when ``s_q == h`` (where a transposed LSE would have the right
  shape).
* The arguments are checked first: a transposed LSE ``(b, s_q, h)``, and a wrong type, shape, dtype
  or device of each argument, or a mask that is not an ``AttentionMask`` (the old ``causal`` bool),
  raise the catalogued error, the same text from both implementations.
"""

from __future__ import annotations

import pytest
import torch

import attn_ref
import errors
import kernels
from attn_ref.masks import CAUSAL
from backward_cases import expected_gradients, random_problem
from tolerance import assert_close_fa

IMPLEMENTATIONS = [attn_ref, kernels]

SHAPES = [  # (B, Sq, Sk, H, Hkv, D)
    (2, 3, 7, 4, 2, 16),
    (1, 4, 9, 4, 2, 16),  # s_q == h
    (1, 4, 4, 4, 4, 32),  # s_q == h == h_k, s_q == s_k
]


@pytest.mark.parametrize("with_dlse", [False, True], ids=["no-dlse", "dlse"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda m: m.__name__)
def test_the_forwards_outputs_feed_the_backward(impl, shape, dtype, with_dlse):
    q, k_cache, v_cache, dout, dlse = random_problem(shape, dtype, sum(shape))
    scale = q.shape[-1] ** -0.5
    out, lse, *_ = impl.flash_attn_with_kvcache(
        q, k_cache, v_cache, softmax_scale=scale, causal=True, return_softmax_lse=True
    )
    b, sq, _, h, _, _ = shape
    assert lse.shape == (b, h, sq)
    grads = impl.attention_backward(
        dout, q, k_cache, v_cache, out, lse, scale, CAUSAL, dlse=dlse if with_dlse else None
    )
    dlse = dlse if with_dlse else torch.zeros_like(dlse)  # no LSE gradient: loss Σ out·dout
    ref, lowp = expected_gradients(q, k_cache, v_cache, dout, dlse, scale, causal=True)
    for grad, grad_ref, grad_lowp in zip(grads, ref, lowp):
        assert grad.dtype == dtype
        assert_close_fa(grad, grad_ref, grad_lowp)


def valid_arguments() -> dict:
    """A valid call's tensors: ``b=1, s_q=3, s_k=5, h=4, h_k=2, d=8, d_v=6`` fp32 (``s_q != h``)."""
    gen = torch.Generator().manual_seed(0)
    shapes = dict(
        dout=(1, 3, 4, 6),
        q=(1, 3, 4, 8),
        k=(1, 5, 2, 8),
        v=(1, 5, 2, 6),
        out=(1, 3, 4, 6),
        lse=(1, 4, 3),
        dlse=(1, 4, 3),
    )
    return {name: torch.randn(*shape, generator=gen) for name, shape in shapes.items()}


def backward(impl, args: dict, **options):
    """``impl.attention_backward`` of the tensors ``args`` (scale 0.5)."""
    tensors = (args[name] for name in ("dout", "q", "k", "v", "out", "lse"))
    return impl.attention_backward(*tensors, 0.5, dlse=args["dlse"], **options)


def _with(**changes):
    return lambda args: dict(args, **{name: change(args[name]) for name, change in changes.items()})


#: (id, change of the valid arguments, error type, exact message)
BAD_ARGUMENTS = [
    (
        "lse-transposed",
        _with(lse=lambda x: x.transpose(1, 2)),
        ValueError,
        "lse must have shape (1, 4, 3) ((b, h, s_q), as the forward returns it), got (1, 3, 4)",
    ),
    (
        "dlse-transposed",
        _with(dlse=lambda x: x.transpose(1, 2)),
        ValueError,
        "dlse must have shape (1, 4, 3) (the shape of lse), got (1, 3, 4)",
    ),
    (
        "lse-per-batch-row",
        _with(lse=lambda x: x[:, 0]),
        ValueError,
        "lse must have shape (1, 4, 3) ((b, h, s_q), as the forward returns it), got (1, 3)",
    ),
    ("lse-none", _with(lse=lambda x: None), TypeError, "lse must be a torch.Tensor, got NoneType"),
    (
        "dout-list",
        _with(dout=lambda x: x.tolist()),
        TypeError,
        "dout must be a torch.Tensor, got list",
    ),
    (
        "q-3d",
        _with(q=lambda x: x[0]),
        ValueError,
        "q must be 4-D (b, s_q, h, d), got shape (3, 4, 8)",
    ),
    (
        "k-3d",
        _with(k=lambda x: x[0]),
        ValueError,
        "k must be 4-D (b, s_k, h_k, d), got shape (5, 2, 8)",
    ),
    (
        "k-head-dim",
        _with(k=lambda x: x[..., :4]),
        ValueError,
        "k must have shape (1, 5, 2, 8) (b, s_k, h_k, d), got (1, 5, 2, 4)",
    ),
    (
        "v-keys",
        _with(v=lambda x: x[:, :4]),
        ValueError,
        "v must have shape (1, 5, 2, 6) (b, s_k, h_k, d_v), got (1, 4, 2, 6)",
    ),
    (
        "kv-heads",
        _with(
            k=lambda x: x.repeat(1, 1, 2, 1)[:, :, :3], v=lambda x: x.repeat(1, 1, 2, 1)[:, :, :3]
        ),
        ValueError,
        "the number of key/value heads (3) must divide the number of query heads (4)",
    ),
    (
        "out-value-dim",
        _with(out=lambda x: x[..., :5]),
        ValueError,
        "out must have shape (1, 3, 4, 6) (b, s_q, h, d_v), got (1, 3, 4, 5)",
    ),
    (
        "dout-rows",
        _with(dout=lambda x: x[:, :2]),
        ValueError,
        "dout must have shape (1, 3, 4, 6) (the shape of out), got (1, 2, 4, 6)",
    ),
    (
        "q-int",
        _with(q=lambda x: x.long()),
        ValueError,
        "q must have a floating-point dtype, got torch.int64",
    ),
    (
        "lse-int",
        _with(lse=lambda x: x.int()),
        ValueError,
        "lse must have a floating-point dtype, got torch.int32",
    ),
    (
        "dlse-bool",
        _with(dlse=lambda x: x > 0),
        ValueError,
        "dlse must have a floating-point dtype, got torch.bool",
    ),
    (
        "k-dtype",
        _with(k=lambda x: x.double()),
        ValueError,
        "k must have dtype torch.float32, got torch.float64",
    ),
    (
        "v-dtype",
        _with(v=lambda x: x.half()),
        ValueError,
        "v must have dtype torch.float32, got torch.float16",
    ),
    (
        "out-device",
        _with(out=lambda x: x.to("meta")),
        ValueError,
        "out must be on the same device as q (cpu), got meta",
    ),
    (
        "lse-device",
        _with(lse=lambda x: x.to("meta")),
        ValueError,
        "lse must be on the same device as q (cpu), got meta",
    ),
    (
        "dlse-device",
        _with(dlse=lambda x: x.to("meta")),
        ValueError,
        "dlse must be on the same device as q (cpu), got meta",
    ),
]


@pytest.mark.parametrize(
    "change, error, message",
    [case[1:] for case in BAD_ARGUMENTS],
    ids=[case[0] for case in BAD_ARGUMENTS],
)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda m: m.__name__)
def test_bad_arguments_raise_the_catalogued_error(impl, change, error, message):
    with pytest.raises(error) as info:
        backward(impl, change(valid_arguments()), mask=CAUSAL)
    assert type(info.value) is error
    assert str(info.value) == message
    assert errors.lookup(info.value) is not None


#: Masks spelled another way than an AttentionMask: the old positional ``causal``, FA's options.
NOT_MASKS = [(True, "bool"), (dict(causal=True), "dict"), ((4, 0), "tuple")]


@pytest.mark.parametrize("mask, type_name", NOT_MASKS, ids=[name for _, name in NOT_MASKS])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda m: m.__name__)
def test_a_mask_that_is_not_an_attention_mask_is_refused(impl, mask, type_name):
    with pytest.raises(TypeError) as info:
        backward(impl, valid_arguments(), mask=mask)
    assert str(info.value) == (
        f"mask must be an attn_ref.AttentionMask (e.g. AttentionMask(causal=True)), got {type_name}"
    )
    assert errors.lookup(info.value)["slug"] == "backward/mask-not-an-attention-mask"
