"""``merge_attention_states`` and ``combine_attention_states`` of both implementations reject bad
states with the same errors (shared checks, :func:`attn_ref.merge.check_merge_states` and
:func:`attn_ref.merge.check_combine_states`)."""

import pytest
import torch

import attn_ref
import kernels

IMPLEMENTATIONS = {
    "attn_ref": attn_ref.merge_attention_states,
    "kernels": kernels.merge_attention_states,
}

BAD = {
    "lse_shape": (
        lambda o, l: (o, l[:, :2], o, l),
        ValueError,
        "lse_a must have shape out_a.shape[:-1] = (4, 3), got (4, 2)",
    ),
    "other_shape": (
        lambda o, l: (o, l, o[:2], l[:2]),
        ValueError,
        "out_b must have the shape of out_a (4, 3, 8), got (2, 3, 8)",
    ),
    "not_float": (
        lambda o, l: (o, l, o, l.long()),
        ValueError,
        "out_b and lse_b must be floating point on one device, got torch.float32 on cpu and "
        "torch.int64 on cpu",
    ),
    "not_tensor": (
        lambda o, l: (o, l, o.tolist(), l),
        TypeError,
        "out_b and lse_b must be torch.Tensors, got list and Tensor",
    ),
}


@pytest.mark.parametrize("merge", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS.keys())
@pytest.mark.parametrize("change, error, message", BAD.values(), ids=BAD.keys())
def test_merge_errors(merge, change, error, message):
    out, lse = torch.zeros(4, 3, 8), torch.zeros(4, 3)
    with pytest.raises(error) as info:
        merge(*change(out, lse))
    assert type(info.value) is error and str(info.value) == message


COMBINES = {
    "attn_ref": attn_ref.combine_attention_states,
    "kernels": kernels.combine_attention_states,
}

BAD_STACKS = {
    "lse_shape": (
        lambda o, l: (o, l[..., :2]),
        ValueError,
        "lse_partials must have shape out_partials.shape[:-1] = (2, 4, 3), got (2, 4, 2)",
    ),
    "not_float": (
        lambda o, l: (o, l.long()),
        ValueError,
        "out_partials and lse_partials must be floating point on one device, "
        "got torch.float32 on cpu and torch.int64 on cpu",
    ),
    "not_tensor": (
        lambda o, l: (o.tolist(), l),
        TypeError,
        "out_partials and lse_partials must be torch.Tensors, got list and Tensor",
    ),
    "no_state_axis": (
        lambda o, l: (o[0, 0, 0], l[0, 0, 0]),
        ValueError,
        "out_partials must be (n, ..., dim) with n >= 1 states, got shape (8,)",
    ),
    "no_state": (
        lambda o, l: (o[:0], l[:0]),
        ValueError,
        "out_partials must be (n, ..., dim) with n >= 1 states, got shape (0, 4, 3, 8)",
    ),
}


@pytest.mark.parametrize("combine", COMBINES.values(), ids=COMBINES.keys())
@pytest.mark.parametrize("change, error, message", BAD_STACKS.values(), ids=BAD_STACKS.keys())
def test_combine_errors(combine, change, error, message):
    out, lse = torch.zeros(2, 4, 3, 8), torch.zeros(2, 4, 3)
    with pytest.raises(error) as info:
        combine(*change(out, lse))
    assert type(info.value) is error and str(info.value) == message
