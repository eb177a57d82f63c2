"""kernels.flash_attn_with_kvcache without the value checks reads no tensor value on the host.

That is what makes the call capturable in a CUDA graph (:mod:`kernels.host_checks`). On the CPU a
"host read" is any reading of tensor values into Python: while the call validates and plans, every
such entry point of ``torch.Tensor`` (``item``, ``tolist``, ``__bool__``, ``__int__``, ...), the
torch functions that return host values (``torch.equal``, ...) and those whose result shape depends
on the data (``unique``, ``nonzero``: a sync on a GPU) raise :class:`HostRead`. The launches are
recorded instead of run (the interpreter itself reads tensors, as a GPU kernel reads device memory)
and run after the patch is undone. The results must be bit-identical to the same call with the
checks on, over a grid of features. On a GPU the same tests run on CUDA tensors.
"""

import contextlib

import pytest
import torch

import kernels
from kernels.host_checks import ENV_VAR
from kernels.launch import Launch
from kvcache_cases import clone_args, make_case

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def case(**options) -> dict:
    """A valid call (:func:`kvcache_cases.make_case`) on :data:`DEVICE`."""
    args = make_case(**options)
    return {name: x.to(DEVICE) if isinstance(x, torch.Tensor) else x for name, x in args.items()}


class HostRead(AssertionError):
    """A tensor value was read on the host while the value checks were off."""


def _refuse(name):
    def refuse(*args, **kwargs):
        raise HostRead(f"{name} read a tensor value on the host")

    return refuse


def _to(original):
    # a copy to the host; dtype-only / same-device conversions are fine
    def to(self, *args, **kwargs):
        target = kwargs.get(
            "device", args[0] if args and not isinstance(args[0], torch.dtype) else None
        )
        if isinstance(target, torch.Tensor):
            target = target.device
        if target is not None and torch.device(target).type == "cpu":
            raise HostRead("Tensor.to(cpu) copied a tensor to the host")
        return original(self, *args, **kwargs)

    return to


def _getitem(original):
    def getitem(self, index):  # a boolean mask index has a data-dependent shape
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in parts):
            raise HostRead("indexing with a boolean mask read a tensor value on the host")
        return original(self, index)

    return getitem


TENSOR_READS = (
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__index__",
    "__float__",
    "__complex__",
    "numpy",
    "__array__",
    "cpu",
    "__repr__",
    "__format__",
    "unique",
    "unique_consecutive",
    "nonzero",
    "masked_select",
    "equal",
    "allclose",
)
TORCH_READS = (
    "equal",
    "allclose",
    "is_nonzero",
    "unique",
    "unique_consecutive",
    "nonzero",
    "masked_select",
)


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    """Within the block every host read fails the test, and ``Launch.run`` only records; yields the
    recorded launches (run them after the block)."""
    recorded = []
    with monkeypatch.context() as patch:
        for name in TENSOR_READS:
            patch.setattr(torch.Tensor, name, _refuse(f"Tensor.{name}"))
        for name in TORCH_READS:
            patch.setattr(torch, name, _refuse(f"torch.{name}"))
        patch.setattr(torch.Tensor, "to", _to(torch.Tensor.to))
        patch.setattr(torch.Tensor, "__getitem__", _getitem(torch.Tensor.__getitem__))
        patch.setattr(Launch, "run", lambda self: recorded.append(self))
        yield recorded


def unchecked_call(monkeypatch, args):
    """The call with ``ATTN_REF_HOST_CHECKS=0`` and no host read allowed; returns its results after
    running the recorded launches."""
    with monkeypatch.context() as env:
        env.setenv(ENV_VAR, "0")
        with no_host_reads(monkeypatch) as launches:
            result = kernels.flash_attn_with_kvcache(**args)
    for launch in launches:
        launch.run()
    return result


GRID = {
    "contiguous_decode": dict(seqlen_q=1, seqlen_new=1),
    "paged_gqa_causal": dict(heads=6, heads_k=2, page_size=4, seqlen_new=2, causal=True),
    "varlen_q_batch_idx": dict(varlen_q=True, batch_idx=True, seqlen_new=2, window=(2, 1)),
    "leftpad_rotary": dict(leftpad=True, seqlen_new=3, rotary_dim=16, causal=True),
    "packed_new_rotary_seqlens": dict(
        varlen_new=True,
        seqlen_new=3,
        rotary_dim=16,
        rotary_seqlens=True,
        rotary_interleaved=False,
        page_size=4,
    ),
    "no_append_window_chunk": dict(window=(3, -1), chunk=4, leftpad=True, batch_idx=True),
    "full_cache_mqa_bf16": dict(full_cache=True, heads=5, heads_k=1, dtype=torch.bfloat16),
}


@pytest.mark.parametrize("num_splits", [1, 3, 0], ids=["n1", "n3", "heuristic"])
@pytest.mark.parametrize("name", list(GRID))
def test_unchecked_call_reads_nothing_and_matches(monkeypatch, name, num_splits):
    args = case(batch=3, capacity=16, d=16, **GRID[name], seed=len(name))
    checked_args, unchecked_args = clone_args(args), clone_args(args)
    expected = kernels.flash_attn_with_kvcache(
        **checked_args, num_splits=num_splits, return_softmax_lse=True
    )
    got = unchecked_call(
        monkeypatch, dict(unchecked_args, num_splits=num_splits, return_softmax_lse=True)
    )
    for a, b in zip(expected, got):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    for cache in ("k_cache", "v_cache"):
        if isinstance(args.get(cache), torch.Tensor):
            assert torch.equal(checked_args[cache], unchecked_args[cache])


def test_the_patch_catches_reads(monkeypatch):
    """The test can fail: the checks-on call reads index tensors, and the patch sees it."""
    args = case(batch=2, seqlen_new=1, seed=1)
    with pytest.raises(HostRead), no_host_reads(monkeypatch):
        kernels.flash_attn_with_kvcache(**args)


def test_switches_skip_only_the_value_checks(monkeypatch):
    """``no_host_checks()`` and ``ATTN_REF_HOST_CHECKS=0`` skip the value checks (a cache overflow
    is not caught), never the static ones (a wrong dtype still is); on by default."""
    args = case(batch=2, seqlen_new=1, capacity=8, seed=2)
    overflow = dict(args, cache_seqlens=torch.tensor([3, 8], dtype=torch.int32, device=DEVICE))
    wrong_dtype = dict(args, cache_seqlens=torch.tensor([3, 4], device=DEVICE))
    with pytest.raises(ValueError, match="exceeds the cache capacity"):
        kernels.flash_attn_with_kvcache(**clone_args(overflow))
    with monkeypatch.context() as env:
        env.setenv(ENV_VAR, "0")
        with no_host_reads(monkeypatch):
            kernels.flash_attn_with_kvcache(**clone_args(overflow))  # not checked, not run
    with kernels.no_host_checks(), no_host_reads(monkeypatch):
        kernels.flash_attn_with_kvcache(**clone_args(overflow))
        with pytest.raises(ValueError, match="cache_seqlens must have dtype torch.int32"):
            kernels.flash_attn_with_kvcache(**clone_args(wrong_dtype))
    with pytest.raises(ValueError, match="exceeds the cache capacity"):  # back on after the block
        kernels.flash_attn_with_kvcache(**clone_args(overflow))


def test_capture_turns_the_value_checks_off(monkeypatch):
    """``torch.cuda.is_current_stream_capturing()`` decides for CUDA tensors (asked only for
    those)."""
    from kernels.host_checks import value_checks_enabled

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not value_checks_enabled(torch.device("cuda"))
    assert value_checks_enabled(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert value_checks_enabled(torch.device("cuda"))
