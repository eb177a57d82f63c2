"""Every kernel variant the launchers run compiles for CUDA sm_90 and sm_80, without a GPU.

The variants are real calls (:func:`kvcache_cases.make_case`) planned by
:func:`kernels.kvcache.plan_kvcache`, the function ``flash_attn_with_kvcache`` itself runs: the
exact kernels, tiles, warps, stages and compile-time switches of a GPU launch (the backup of the
appended slots, append, attention, split combine), plus the standalone merge and the forward
launches of FA3's prefill entry points (:data:`FLASH_ATTN_VARIANTS`, planned by
:func:`kernels.flash_attn.plan_packed_attention`, the function ``flash_attn_func`` and
``flash_attn_varlen_func`` run; their backward launches are compiled by
:mod:`test_backward_kernels`). Each is handed to ``triton.compile(ASTSource(...),
target=GPUTarget("cuda", arch, 32))``, which produces PTX and a cubin on a CPU machine.

Compiling needs real ``@triton.jit`` functions, but the test session imports :mod:`kernels` in
interpreter mode, so the compilation runs in a subprocess without ``TRITON_INTERPRET`` (this file
is also its script). fp8 variants are compiled for sm_90 only (e4m3 needs sm_89+). A call without
the value checks (under CUDA graph capture, :mod:`kernels.host_checks`) plans the very same launches
(:func:`test_calls_without_value_checks_plan_the_same_launches`), so these variants cover it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compile_launches import launch_signature

FP8 = torch.float8_e4m3fn
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

#: name -> (make_case arguments, extra call arguments). Together they switch on every constexpr
#: branch of the kernels: dtypes, paged/contiguous, decode/prefill tiles, masks, softcap, qv,
#: only_qv, rotary (both layouts, fixed and moving positions), sinks, descale, splits.
VARIANTS = {
    "decode_bf16_gqa_paged64_split": (
        dict(
            dtype=BF16,
            heads=32,
            heads_k=8,
            d=128,
            seqlen_q=1,
            seqlen_new=1,
            capacity=512,
            page_size=64,
        ),
        dict(num_splits=4),
    ),
    "decode_fp16_mha_contiguous": (
        dict(dtype=FP16, heads=8, heads_k=8, d=128, seqlen_q=1, capacity=256),
        dict(num_splits=1),
    ),
    "prefill_bf16_gqa_causal_paged": (
        dict(
            dtype=BF16,
            heads=32,
            heads_k=8,
            d=128,
            seqlen_q=256,
            seqlen_new=256,
            capacity=1024,
            page_size=64,
            causal=True,
        ),
        dict(num_splits=1),
    ),
    "prefill_fp16_window_chunk_softcap_sinks": (
        dict(
            dtype=FP16,
            heads=6,
            heads_k=2,
            d=64,
            seqlen_q=64,
            seqlen_new=8,
            capacity=256,
            window=(40, 3),
            chunk=32,
            softcap=5.0,
            sinks=True,
            leftpad=True,
            batch_idx=True,
        ),
        dict(num_splits=2),
    ),
    "fp32_varlen_ieee": (
        dict(
            dtype=FP32,
            heads=4,
            heads_k=2,
            d=64,
            seqlen_q=9,
            seqlen_new=3,
            varlen_q=True,
            varlen_new=True,
            capacity=64,
            causal=True,
        ),
        dict(num_splits=1),
    ),
    "mqa_odd_heads_d256": (
        dict(dtype=BF16, heads=5, heads_k=1, d=256, seqlen_q=32, capacity=128, causal=True),
        dict(num_splits=1),
    ),
    "qv_mla_bf16": (
        dict(
            dtype=BF16,
            heads=16,
            heads_k=1,
            d=64,
            dv=512,
            qv=True,
            seqlen_q=1,
            capacity=256,
            page_size=64,
        ),
        dict(num_splits=3),
    ),
    "only_qv_fp16": (
        dict(dtype=FP16, heads=16, heads_k=1, d=64, dv=256, only_qv=True, seqlen_q=2, capacity=128),
        dict(num_splits=1),
    ),
    "rotary_gptj_causal_bf16": (
        dict(
            dtype=BF16,
            heads=8,
            heads_k=2,
            d=128,
            rotary_dim=64,
            seqlen_q=4,
            seqlen_new=4,
            capacity=128,
            causal=True,
            page_size=16,
        ),
        dict(num_splits=1),
    ),
    "rotary_neox_fixed_fp16": (
        dict(
            dtype=FP16,
            heads=8,
            heads_k=2,
            d=64,
            rotary_dim=64,
            rotary_interleaved=False,
            seqlen_q=1,
            seqlen_new=1,
            capacity=128,
        ),
        dict(num_splits=1),
    ),
    "fp8_descale_rotary_split": (
        dict(
            dtype=FP8,
            heads=32,
            heads_k=8,
            d=128,
            rotary_dim=128,
            seqlen_q=1,
            seqlen_new=1,
            capacity=256,
            page_size=64,
            descale=True,
        ),
        dict(num_splits=2),
    ),
    "fp8_prefill_causal": (
        dict(
            dtype=FP8,
            heads=32,
            heads_k=8,
            d=128,
            seqlen_q=128,
            capacity=256,
            causal=True,
            descale=True,
        ),
        dict(num_splits=1),
    ),
}
#: name -> the keywords of :func:`_flash_attn_launches`: the forward launch of FA3's prefill entry
#: points (``kernels.flash_attn``: packed q, the packed K/V read as one cache row from each
#: sequence's left padding), batched and varlen, with masks, softcap, sinks and qv.
FLASH_ATTN_VARIANTS = {
    "flash_attn_func_bf16_gqa_causal": dict(
        dtype=BF16,
        heads=8,
        heads_k=2,
        d=128,
        lengths_q=[256, 256],
        lengths_k=[256, 256],
        causal=True,
    ),
    "flash_attn_varlen_fp16_window_softcap_sinks_qv": dict(
        dtype=FP16,
        heads=6,
        heads_k=2,
        d=64,
        dv=128,
        qv=True,
        lengths_q=[100, 0, 37],
        lengths_k=[120, 5, 37],
        window=(32, 0),
        softcap=5.0,
        sinks=True,
    ),
}
ARCHS = [90, 80]


def _variant_launches(case: dict, knobs: dict, value_checks: bool = True):
    """The launches ``kernels.flash_attn_with_kvcache`` runs (or, on a failure, restores the cache
    with) for one call, plus a standalone merge."""
    from attn_ref.validation import check_kvcache_args
    from kernels.kvcache import plan_kvcache
    from kernels.merge import plan_merge
    from kvcache_cases import make_case

    args = make_case(**case)
    if args.get("cache_seqlens") is not None and args.get("k") is None:
        # long contexts
        args["cache_seqlens"] = torch.full_like(args["cache_seqlens"], case["capacity"])
    plan = plan_kvcache(check_kvcache_args(**args, **knobs, value_checks=value_checks))
    # the backup of the appended slots (its restore is the same variant), append, attention, combine
    launches = [*(plan.backup or ()), *plan.launches]
    out = plan.results[0]
    # merge_attention_states: two fp32 states (A0, A1, A2, dim)
    states = torch.zeros(2, 1, 1, 15, 64)
    lses = torch.zeros(2, 1, 1, 15)
    merged, merged_lse = torch.empty(1, 1, 15, 64, dtype=out.dtype), torch.empty(1, 1, 15)
    launches.append(plan_merge(states[0], lses[0], states[1:], lses[1:], merged, merged_lse))
    return launches


def _flash_attn_launches(
    dtype,
    heads,
    heads_k,
    d,
    lengths_q,
    lengths_k,
    dv=None,
    qv=False,
    sinks=False,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
):
    """The forward launches ``kernels.flash_attn_varlen_func`` runs for sequences of
    ``lengths_q`` rows and ``lengths_k`` keys (``flash_attn_func``'s, when they are all equal)."""
    from attn_ref.flash_attn import resolve_varlen_call
    from kernels.flash_attn import plan_packed_attention, sequence_table

    dv = dv or d
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = torch.zeros(total_q, heads, d, dtype=dtype)
    k, v = (
        torch.zeros(total_k, heads_k, d, dtype=dtype),
        torch.zeros(total_k, heads_k, dv, dtype=dtype),
    )
    cu_q, cu_k = (
        torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
        for lengths in (lengths_q, lengths_k)
    )
    call = resolve_varlen_call(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max(lengths_q),
        max(lengths_k),
        None,
        None,
        None,
        causal,
        torch.zeros(total_q, heads, dv, dtype=dtype) if qv else None,
        None,
        None,
        None,
        window,
        0,
        softcap,
        torch.zeros(heads) if sinks else None,
    )
    table, max_seqlens = sequence_table(call.sequences, q.device)
    launches, _ = plan_packed_attention(
        call.q,
        call.k,
        call.v,
        call.qv,
        call.sinks,
        table,
        max_seqlens,
        call.softmax_scale,
        call.mask,
        call.softcap,
        (call.q_descale, call.k_descale, call.v_descale),
    )
    return launches


def compile_all(arch: int) -> dict[str, str]:
    """Compile every variant for ``cuda`` ``arch``; returns ``{variant/kernel: "ok" or the
    error}``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results, seen = {}, set()
    planned = [
        (name, launch)
        for name, (case, knobs) in VARIANTS.items()
        if arch >= 89 or case["dtype"] != FP8
        for launch in _variant_launches(case, knobs)
    ]
    planned += [
        (name, launch)
        for name, keywords in FLASH_ATTN_VARIANTS.items()
        for launch in _flash_attn_launches(**keywords)
    ]
    for name, launch in planned:
        signature, constexprs, attrs = launch_signature(launch)
        key = (
            launch.kernel.__name__,
            json.dumps(signature, sort_keys=True),
            repr(sorted(constexprs.items(), key=repr)),
        )
        if key in seen:
            continue
        seen.add(key)
        label = f"{name}/{launch.kernel.__name__}"
        try:
            source = ASTSource(
                fn=launch.kernel, signature=signature, constexprs=constexprs, attrs=attrs
            )
            compiled = triton.compile(
                source,
                target=GPUTarget("cuda", arch, 32),
                options=dict(num_warps=launch.num_warps, num_stages=launch.num_stages),
            )
            assert compiled.asm.get("cubin"), "no cubin produced"
            results[label] = "ok"
        except Exception as error:  # reported per variant by the test below
            results[label] = f"{type(error).__name__}: {error}"[:2000]
    return results


@pytest.mark.parametrize("arch", ARCHS, ids=[f"sm_{a}" for a in ARCHS])
def test_every_kernel_variant_compiles(arch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    tests_dir = Path(__file__).parent
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tests_dir), str(tests_dir.parent), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, __file__, str(arch)], env=env, capture_output=True, text=True, timeout=500
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {label: error for label, error in results.items() if error != "ok"}
    assert not failed, "\n\n".join(f"{label}: {error}" for label, error in failed.items())
    kernels_compiled = {label.split("/")[1] for label in results}
    assert kernels_compiled == {
        "_append_kv_entry_kernel",
        "_split_states_kernel",
        "_merge_states_kernel",
    }, results


def test_calls_without_value_checks_plan_the_same_launches():
    """Kernels, grids, warps, stages, constexprs and runtime arguments (tensor dtypes and 16-byte
    alignment, every int and float) are those of the checked call."""

    def argument(x):
        if isinstance(x, tuple):  # an argument group
            return tuple(argument(y) for y in x)
        return (x.dtype, x.data_ptr() % 16 == 0) if isinstance(x, torch.Tensor) else x

    def planned(case, knobs, value_checks):
        return [
            (
                launch.kernel.__name__,
                launch.grid,
                launch.num_warps,
                launch.num_stages,
                launch.constexprs,
                {name: argument(x) for name, x in launch.runtime_args().items()},
            )
            for launch in _variant_launches(case, knobs, value_checks)
        ]

    for name, (case, knobs) in VARIANTS.items():
        assert planned(case, knobs, False) == planned(case, knobs, True), name


if __name__ == "__main__":
    print(json.dumps(compile_all(int(sys.argv[1]))))
