"""The prefill section's error checks: invalid calls of the prefill functions that upstream (FA3's
``mha_fwd`` and ``mha_combine`` checks, its Python asserts) refuses, as data and checks.

Each case of :data:`INVALID_CALLS` changes one thing in a valid call of its function
(:func:`valid_call`, built in the run's dtype so that the change is the only thing wrong) and names
the reference's exception type and message (``{dtype}``: the run's dtype). Every change is one a
computation could get past (an int64 ``cu_seqlens_q``, a ``max_seqlen_q`` that is not read, an
``out_dtype`` of float64...), so the refusal has to come from a check made before computing.

:func:`check_refused` wants an exception (any: upstream raises C++ ``RuntimeError``\\ s and
asserts of its own wording) and every input as it was (``out``, when given, unwritten), as
:func:`errors_contract.check_rejected` does for ``flash_attn_with_kvcache``;
:func:`check_message` wants the reference's exception type (a subclass counts) and exact message
as well, as :func:`errors_contract.check_error` does (the capability ``prefill_errors``).
"""

from __future__ import annotations

import torch

from .call import Outcome, cpu_copy
from .verdict import Verdict, failed, passed

I32 = torch.int32


def valid_call(function: str, dtype: torch.dtype, device: str = "cpu") -> dict:
    """A valid call of ``function``: ``flash_attn_func`` b=2, s_q=4, s_k=6, h=4, h_k=2, d=16;
    ``flash_attn_varlen_func`` the same heads, sequences of 3 and 5 queries, 5 and 7 keys;
    ``flash_attn_qkvpacked_func`` a 5-D ``qkv`` b=2, s=5, h=4, d=16; ``flash_attn_combine`` 3
    fp32 splits of b=2, s=3, h=2, d=16 in FA3's LSE layout."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=dtype):
        return torch.randn(*shape, generator=gen).to(dtype)

    calls = {
        "flash_attn_func": lambda: dict(
            q=randn(2, 4, 4, 16), k=randn(2, 6, 2, 16), v=randn(2, 6, 2, 16)
        ),
        "flash_attn_varlen_func": lambda: dict(
            q=randn(8, 4, 16),
            k=randn(12, 2, 16),
            v=randn(12, 2, 16),
            cu_seqlens_q=torch.tensor([0, 3, 8], dtype=I32),
            cu_seqlens_k=torch.tensor([0, 5, 12], dtype=I32),
            max_seqlen_q=5,
            max_seqlen_k=7,
        ),
        "flash_attn_qkvpacked_func": lambda: dict(qkv=randn(2, 5, 3, 4, 16)),
        "flash_attn_combine": lambda: dict(
            out_partial=randn(3, 2, 3, 2, 16, dtype=torch.float32),
            lse_partial=randn(3, 2, 2, 3, dtype=torch.float32).transpose(-1, -2),
        ),
    }
    args = calls[function]()
    return {
        key: val.to(device) if isinstance(val, torch.Tensor) else val for key, val in args.items()
    }


def _packed_heads(args: dict, heads: int) -> dict:
    """The 5-D ``qkv`` as a 4-D one of ``heads`` heads (its first ``heads`` of ``3 h``)."""
    qkv = args["qkv"]
    return dict(args, qkv=qkv.flatten(2, 3)[:, :, :heads].contiguous())


#: ``case: (function, change, exception type, message)``; the change maps a valid call's arguments
#: to the invalid call's, the message is the reference's (``{dtype}``: the run's dtype).
INVALID_CALLS = {
    "k_dtype": (
        "flash_attn_func",
        lambda a: dict(a, k=a["k"].double()),
        ValueError,
        "query and key must have the same dtype",
    ),
    "heads_not_dividing": (
        "flash_attn_func",
        lambda a: dict(a, q=a["q"][:, :, :3]),
        ValueError,
        "Number of heads in key/value must divide number of heads in query",
    ),
    "v_seqlen": (
        "flash_attn_func",
        lambda a: dict(a, v=a["v"][:, :5]),
        ValueError,
        "v must have shape (batch_size_k, seqlen_k, num_heads_k, head_size_v)",
    ),
    "q_3d": (
        "flash_attn_func",
        lambda a: dict(a, q=a["q"][0]),
        ValueError,
        "batch_size must be equal to batch_size_k",
    ),
    "cu_seqlens_q_int64": (
        "flash_attn_varlen_func",
        lambda a: dict(a, cu_seqlens_q=a["cu_seqlens_q"].long()),
        ValueError,
        "cu_seqlens_q must have dtype torch.int32",
    ),
    "cu_seqlens_k_batch": (
        "flash_attn_varlen_func",
        lambda a: dict(a, cu_seqlens_k=a["cu_seqlens_k"][[0, 2]]),
        ValueError,
        "batch_size must be equal to batch_size_k",
    ),
    "seqused_k_int64": (
        "flash_attn_varlen_func",
        lambda a: dict(a, seqused_k=torch.tensor([5, 7], device=a["q"].device)),
        ValueError,
        "seqused_k must have dtype int32",
    ),
    "max_seqlen_q_none": (
        "flash_attn_varlen_func",
        lambda a: dict(a, max_seqlen_q=None),
        ValueError,
        "max_seqlen_q must be provided if cu_seqlens_q is provided",
    ),
    "qkv_4d_without_num_heads_q": (
        "flash_attn_qkvpacked_func",
        lambda a: _packed_heads(a, 12),
        ValueError,
        "a 4-D qkv (batch, seqlen, h + 2 * h_k, d) needs num_heads_q = h with 0 < h < 12 and "
        "12 - h even (h_k key heads, then h_k value heads), got num_heads_q=None",
    ),
    "qkv_4d_odd_split": (
        "flash_attn_qkvpacked_func",
        lambda a: dict(_packed_heads(a, 7), num_heads_q=4),
        ValueError,
        "a 4-D qkv (batch, seqlen, h + 2 * h_k, d) needs num_heads_q = h with 0 < h < 7 and "
        "7 - h even (h_k key heads, then h_k value heads), got num_heads_q=4",
    ),
    "qkv_kv_packed": (
        "flash_attn_qkvpacked_func",
        lambda a: dict(a, qkv=a["qkv"][:, :, :2]),
        ValueError,
        "qkv must have shape (2, 5, 3, 4, 16) (batch, seqlen, 3, h, d), got (2, 5, 2, 4, 16)",
    ),
    "out_dtype_float64": (
        "flash_attn_combine",
        lambda a: dict(a, out_dtype=torch.float64),
        ValueError,
        "Output type must be FP32, FP16 or BF16",
    ),
    "lse_partial_shape": (
        "flash_attn_combine",
        lambda a: dict(a, lse_partial=a["lse_partial"][..., :1]),
        ValueError,
        "lse_partial must have shape (num_splits, batch_size, seqlen, num_heads)",
    ),
    "out_shape": (
        "flash_attn_combine",
        lambda a: dict(a, out=torch.zeros(2, 3, 2, 8, device=a["out_partial"].device)),
        ValueError,
        "out must have shape (batch_size, seqlen, num_heads, head_size_og)",
    ),
}


def cases_of(function: str) -> tuple[str, ...]:
    """The names of the cases of ``function``, in table order."""
    return tuple(case for case, entry in INVALID_CALLS.items() if entry[0] == function)


def invalid_call(case: str, dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> dict:
    """The arguments of ``case``: its change applied to :func:`valid_call` of its function."""
    function, change, _, _ = INVALID_CALLS[case]
    return change(valid_call(function, dtype, device))


def check_refused(before: dict, after: dict, outcome: Outcome, case: str) -> Verdict:
    """``outcome`` is an exception (any), and no input was written."""
    if not isinstance(outcome, BaseException):
        returned = type(outcome).__name__
        return failed(f"accepted a call upstream refuses ({case}): returned {returned}")
    return _untouched(before, after) or passed(f"raised {type(outcome).__name__}: {outcome}")


def check_message(
    before: dict, after: dict, outcome: Outcome, case: str, dtype: torch.dtype
) -> Verdict:
    """``outcome`` is the reference's exception with the reference's message, and no input was
    written."""
    _, _, error, message = INVALID_CALLS[case]
    wanted = f"{error.__name__}: {message.format(dtype=dtype)}"
    if not isinstance(outcome, BaseException):
        return failed(f"returned normally; expected {wanted}")
    if not isinstance(outcome, error) or str(outcome) != message.format(dtype=dtype):
        return failed(f"raised {type(outcome).__name__}: {outcome}; expected {wanted}")
    return _untouched(before, after) or passed(f"raised {wanted}")


def _untouched(before: dict, after: dict) -> Verdict | None:
    for name, old in before.items():
        if isinstance(old, torch.Tensor) and not torch.equal(cpu_copy(after[name]), old):
            return failed(f"raised as expected, but {name} was written by the failed call")
    return None
