"""Random, valid ``flash_attn_with_kvcache`` inputs for tests (reference, oracle and kernels alike).

:func:`make_case` (the keyword arguments of one call, every per-sequence length drawn at random in
its legal range) and :func:`clone_args` come from :mod:`attn_ref.conformance.calls`, the factory the
benchmarks build their problems with and the conformance suite its probes; the tests import them
from here.

:data:`REF` and :data:`KERNELS` are the implementations a test takes as its parameter
(:class:`Implementation`: the function, its device, its shape multiplier); :func:`over` builds the
parameter lists; :func:`split_cases` is the table of split-KV calls, sized per implementation.
:func:`base` is the small valid call the error and layout tests change one argument of
(:func:`rotary` adds rotary tables).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import attn_ref
import kernels
from attn_ref.conformance.calls import clone_args, make_case  # noqa: F401 (case factory)
from attn_ref.conformance.error_cases import base, rotary  # noqa: F401 (a valid call)

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
#: fp8 e4m3 conversions need sm_89+ on a GPU (the interpreter has them).
HAS_FP8 = not ON_GPU or torch.cuda.get_device_capability() >= (8, 9)
FP8_SKIP = "fp8 e4m3 needs sm_89+ (this GPU has no fp8 conversion instructions)"


def split_cases(keys: int) -> dict:
    """Calls to split over the keys, by id: ``keys`` is the cache capacity of the long ones (the
    kernels take 3x the reference's, for several key blocks per split); ``short_keys`` leaves some
    of three splits without a key."""
    return {
        "decode": dict(seqlen_q=1, capacity=2 * keys, seqlen_new=1),
        "causal_sinks": dict(seqlen_q=4, capacity=keys, causal=True, sinks=True),
        "window_varlen": dict(seqlen_q=4, capacity=keys, window=(3, 0), varlen_q=True, batch=3),
        "short_keys": dict(seqlen_q=2, capacity=3, sinks=True, batch=3),
    }


@dataclass(frozen=True)
class Implementation:
    """A ``flash_attn_with_kvcache`` under test: ``api`` is the package's function, run on
    ``device``; ``scale`` multiplies a case's ``capacity`` and ``seqlen_q`` (bigger grids and more
    key blocks where the kernels run compiled on a GPU)."""

    name: str
    api: Callable
    device: torch.device = torch.device("cpu")
    scale: int = 1

    def sized(self, case: dict) -> dict:
        """``case`` (keyword arguments of :func:`make_case`) with this implementation's sizes."""
        return {
            key: val * self.scale if key in ("capacity", "seqlen_q") else val
            for key, val in case.items()
        }

    def placed(self, args: dict) -> dict:
        """``args`` with its tensors on :attr:`device` (the same tensors where they are already)."""
        return {
            key: val.to(self.device) if isinstance(val, torch.Tensor) else val
            for key, val in args.items()
        }

    def fn(self, **args):
        """:attr:`api` on :attr:`device`; caches written back into ``args``' tensors, results
        returned on the CPU (so the CPU oracle can check every implementation)."""
        moved = self.placed(args)
        result = self.api(**moved)
        for name in ("k_cache", "v_cache"):
            if isinstance(args.get(name), torch.Tensor) and moved[name] is not args[name]:
                args[name].copy_(moved[name].cpu())
        if isinstance(result, tuple):
            return tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in result)
        return result.cpu()


REF = Implementation("ref", attn_ref.flash_attn_with_kvcache)
#: Compiled on a GPU with 8x the shapes; Triton's interpreter on the CPU otherwise.
KERNELS = Implementation(
    "kernels", kernels.flash_attn_with_kvcache, DEVICE, scale=8 if ON_GPU else 1
)
run_kernels = KERNELS.fn


def over(impls: list[Implementation], *axes: dict) -> list:
    """``pytest.param(impl, *values)`` for every implementation crossed with every combination of
    ``axes`` (each a dict from id to value), with ids like ``ref-fp16-none``; fp8 cases of an
    implementation on a GPU without fp8 are skipped."""
    params = []
    for impl in impls:
        for combo in itertools.product(*(axis.items() for axis in axes)):
            values = [val for _, val in combo]
            no_fp8 = (
                impl.device.type == "cuda"
                and not HAS_FP8
                and any(val is torch.float8_e4m3fn for val in values)
            )
            params.append(
                pytest.param(
                    impl,
                    *values,
                    id="-".join([impl.name, *(key for key, _ in combo)]),
                    marks=[pytest.mark.skip(reason=FP8_SKIP)] if no_fp8 else [],
                )
            )
    return params
