"""Seeded fuzzing of ``flash_attn_with_kvcache``: random valid calls, then random damage to them.

Each call starts from a random valid call (:func:`kvcache_cases.make_case` with random options) and
gets 0 to 3 random mutations from :data:`MUTATIONS`: wrong Python types, bools and floats where ints
go, NaN / inf / huge / subnormal / float64-only scalars, out-of-range and wrong-dtype index tensors,
0-d and empty tensors, stride-0 and strided views, tensors that require grad, aliasing between
written and read tensors, FA3-normalised values (negative windows, huge chunks, ``rotary_seqlens``
without tables, ...).
Some mutations are errors, some are calls upstream accepts. The contract checked on every call:

1. a refused call raises ``ValueError`` / ``TypeError`` / ``NotImplementedError`` whose catalog
   entry (:func:`errors.lookup`, by raise location) is active, of that type, and whose regex matches
   the message in full, a message that names a parameter (two listed exceptions); nothing else may
   escape (IndexError, RuntimeError, a Triton error, ...);
2. after a refused call every tensor argument is bit for bit what it was (nothing half-written);
3. an accepted call matches the dense oracle (FA's tolerance rule with its rounding-noise atol, the
   LSE, the caches after the append), and the arguments it does not write are untouched;
4. the kernels, run on a subset of the calls, raise exactly the reference's error (type and text) or
   both accept, and a kernel call that raises (refused, or failed in a launch) leaves every tensor
   argument as it was.

``make test`` runs :data:`CALLS` reference calls, :data:`KERNEL_CALLS` of them on the kernels too
(about 1.5 minutes in the interpreter, most of it the kernel calls). A longer run::

    ATTN_REF_FUZZ_CALLS=10000 ATTN_REF_FUZZ_KERNEL_CALLS=500 ATTN_REF_FUZZ_SEED=1 \\
        .venv/bin/python -m pytest -q -s tests/test_fuzz_kvcache.py

prints the figures (calls, accepted, refused per exception type, kernel calls, violations).
"""

from __future__ import annotations

import inspect
import os
import random
import re
import time
from collections import Counter

import numpy as np
import torch

import attn_ref
import errors
import kernels
from dense_oracle import FP8, kvcache_oracle
from kvcache_cases import make_case
from tolerance import assert_close_fa, assert_lse_close, assert_one_rounding_apart, rounding_atol

CALLS = int(os.environ.get("ATTN_REF_FUZZ_CALLS", "1000"))
#: The kernels run in Triton's interpreter on the CPU tensors of the calls (no kernel calls on a
#: CUDA machine, where CPU tensors cannot be launched on): every third call.
KERNEL_CALLS = (
    0 if torch.cuda.is_available() else int(os.environ.get("ATTN_REF_FUZZ_KERNEL_CALLS", "300"))
)
SEED = int(os.environ.get("ATTN_REF_FUZZ_SEED", "0"))
CATALOGUED = (ValueError, TypeError, NotImplementedError)
PARAMETERS = list(inspect.signature(attn_ref.flash_attn_with_kvcache).parameters)
#: Read once: a long run must not see the file while someone rewrites it (``errors check`` keeps it
#: in step with the code).
CATALOG = errors.load()
#: Messages that name the quantity but no parameter: FA3's verbatim rotary text ("rotary cos/sin"),
#: and the head-count rule, which is about q's heads and the caches' heads together.
UNNAMED = {"rotary/without-new-kv", "arguments/heads-not-divisible"}
I32 = torch.int32


# --------------------------------------------------------------------------------------------------
# Calls
# --------------------------------------------------------------------------------------------------


def valid_call(rng: random.Random) -> dict:
    """A random valid call on small shapes (every feature of :func:`make_case` may be on)."""
    heads_k = rng.choice([1, 2])
    d = rng.choice([8, 16, 24, 32])
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16, FP8])
    only_qv = rng.random() < 0.1 and dtype != FP8
    window = rng.choice([(-1, -1), (-1, -1), (2, 0), (1, 3), (3, -1)])
    seqlen_new = rng.choice([None, 0, 1, 2])
    return make_case(
        batch=rng.randint(1, 3),
        seqlen_q=rng.randint(0, 4),
        seqlen_new=seqlen_new,
        capacity=rng.randint(max(1, seqlen_new or 0), 12),
        heads=heads_k * rng.choice([1, 2, 3]),
        heads_k=heads_k,
        d=d,
        dv=rng.choice([d, d, 16, 40]),
        dtype=dtype,
        page_size=rng.choice([None, None, 1, 2, 3, 4]),
        leftpad=rng.random() < 0.3,
        batch_idx=rng.random() < 0.3,
        varlen_q=rng.random() < 0.3,
        varlen_new=rng.random() < 0.3,
        rotary_dim=16 if d >= 16 and rng.random() < 0.3 else 0,
        rotary_interleaved=rng.random() < 0.5,
        rotary_seqlens=rng.random() < 0.3,
        causal=rng.random() < 0.4,
        window=window,
        chunk=rng.choice([None, None, 3, 5]),
        softcap=rng.choice([0.0, 0.0, 5.0]),
        sinks=rng.random() < 0.2,
        qv=only_qv or (rng.random() < 0.15 and dtype != FP8),
        only_qv=only_qv,
        placeholders=only_qv and rng.random() < 0.5,
        descale=rng.random() < 0.5,
        seed=rng.randrange(2**31),
    )


def _tensor_names(args):
    return [k for k, v in args.items() if isinstance(v, torch.Tensor)]


def _pick(rng, args, names):
    present = [n for n in names if isinstance(args.get(n), torch.Tensor)]
    return rng.choice(present) if present else None


def m_python_type(rng, args):
    name = rng.choice(_tensor_names(args) or ["q"])
    args[name] = rng.choice(["x", [1.0], 1.0, True, (), object()])


def m_scalar(rng, args):
    name, values = rng.choice(
        [
            (
                "softmax_scale",
                [
                    None,
                    "x",
                    True,
                    float("nan"),
                    float("inf"),
                    -float("inf"),
                    1e38,
                    1e39,
                    0.0,
                    -0.5,
                    2,
                    np.float32(0.25),
                    1e5,
                    1e-45,
                    -0.0,
                    1e-50,
                    0.1,
                    2.4e38,
                    np.float64(0.3),
                    torch.tensor(0.5),
                ],
            ),
            (
                "softcap",
                [
                    None,
                    float("nan"),
                    float("inf"),
                    -1.0,
                    0,
                    1e-50,
                    1e6,
                    1e10,
                    30.0,
                    "x",
                    True,
                    1e39,
                    1e-45,
                    -0.0,
                    0.7,
                    2.3e38,
                    2.4e38,
                    np.float32(30.0),
                ],
            ),
            (
                "window_size",
                [
                    (1,),
                    None,
                    8,
                    (1.9, -1),
                    (True, -1),
                    (10**30, -1),
                    (-2, 0),
                    [2, 0],
                    torch.tensor([2, 0]),
                    (2, 0, 5),
                    (2**62, -1),
                    (-1, 2**40),
                    torch.tensor([2.0, 0.0]),
                    (np.int64(1), 0),
                ],
            ),
            (
                "attention_chunk",
                [
                    None,
                    0,
                    -4,
                    3,
                    3.7,
                    "x",
                    2**70,
                    2**62,
                    float("inf"),
                    float("nan"),
                    torch.tensor(3),
                    True,
                    torch.tensor([2, 3]),
                ],
            ),
            ("num_splits", [0, 1, 3, 256, 257, -1, True, 2.0, 2**70, np.int64(2), None]),
            ("ver", [3, 4, "3", None, 3.0, torch.tensor([3, 3]), np.int64(3)]),
            ("max_seqlen_q", [None, 3.0, True, -1, 10**30, 0, 100, "3"]),
            (
                "causal",
                [
                    True,
                    False,
                    "False",
                    None,
                    torch.tensor([1, 0]),
                    1,
                    2,
                    0.0,
                    torch.tensor(True),
                    np.bool_(True),
                ],
            ),
            ("only_qv", [True, False, None, "x", torch.tensor([1, 1]), 0]),
            ("rotary_interleaved", [False, "yes", torch.tensor(0), 3]),
        ]
    )
    args[name] = rng.choice(values)


def m_index(rng, args):
    name = rng.choice(
        [
            "cache_seqlens",
            "cache_leftpad",
            "cache_batch_idx",
            "page_table",
            "cu_seqlens_q",
            "cu_seqlens_k_new",
            "rotary_seqlens",
        ]
    )
    x = args.get(name)
    if not isinstance(x, torch.Tensor):
        if name == "cache_seqlens":
            args[name] = rng.choice([0, 2, -1, 2**40, True, 3.0])
        elif name == "rotary_seqlens":
            args[name] = torch.tensor([rng.randint(-3, 20)] * _batch(args), dtype=I32)
        elif name == "cache_batch_idx":
            args[name] = torch.tensor(
                [rng.randint(-1, 3) for _ in range(_batch(args) + rng.choice([0, 0, 1, -1]))],
                dtype=I32,
            )
        return
    kind = rng.choice(["value", "value", "dtype", "shape", "zero_d", "float"])
    if kind == "value" and x.numel():
        y = x.clone()
        y.view(-1)[rng.randrange(y.numel())] = rng.choice([-1, -100, 2**31 - 1, 0, 1, 7, 13])
        args[name] = y
    elif kind == "dtype":
        args[name] = x.long()
    elif kind == "shape":
        args[name] = torch.cat([x.flatten(), x.flatten()[:1]]) if x.numel() else x.view(0, 1)
    elif kind == "zero_d":
        args[name] = x.flatten()[0] if x.numel() else torch.tensor(0, dtype=I32)
    else:
        args[name] = x.float()


def m_structure(rng, args):
    name = _pick(
        rng, args, ["q", "k_cache", "v_cache", "k", "v", "qv", "out", "sinks", "rotary_cos"]
    )
    if name is None:
        return
    x = args[name]
    kind = rng.choice(["zero_d", "drop_dim", "dtype", "strided", "expand", "empty", "grad", "meta"])
    if kind == "zero_d":
        args[name] = x.flatten()[0].clone() if x.numel() else torch.tensor(0.0)
    elif kind == "drop_dim" and x.dim() and x.shape[0]:
        args[name] = x[0]
    elif kind == "dtype":
        args[name] = x.to(rng.choice([torch.float64, torch.int32, torch.float16, torch.bfloat16]))
    elif kind == "strided" and x.dim():
        args[name] = (
            torch.repeat_interleave(x, 2, dim=-1)[..., ::2]
            if rng.random() < 0.5
            else torch.repeat_interleave(x, 2, dim=0)[::2]
        )
    elif kind == "expand" and x.dim() and x.shape[0]:
        args[name] = x[:1].expand(x.shape[0], *x.shape[1:])
    elif kind == "empty" and x.dim() >= 2:
        dim = rng.randrange(x.dim())
        args[name] = x.narrow(dim, 0, 0).clone()
    elif kind == "grad" and x.is_floating_point() and x.dtype != FP8:
        args[name] = x.clone().requires_grad_()
    elif kind == "meta":
        args[name] = x.to("meta")


def m_alias(rng, args):
    choices = [
        ("v_cache", "k_cache"),
        ("out", "q"),
        ("out", "v_cache"),
        ("out", "qv"),
        ("k", "v"),
        ("rotary_sin", "rotary_cos"),
    ]
    target, source = rng.choice(choices)
    if isinstance(args.get(source), torch.Tensor):
        args[target] = args[source]


def m_shared_buffer(rng, args):
    """K and V caches as views of one buffer: interleaved (distinct elements: fine even when
    appending), or V inside K (MLA's latent layout: fine only without appending)."""
    k_cache, v_cache = args.get("k_cache"), args.get("v_cache")
    if not (
        isinstance(k_cache, torch.Tensor)
        and isinstance(v_cache, torch.Tensor)
        and k_cache.dim() == 4
        and v_cache.dim() == 4
        and k_cache.shape[:3] == v_cache.shape[:3]
    ):
        return
    if rng.random() < 0.5 and k_cache.shape == v_cache.shape:
        dim = rng.choice([0, 1, 2, 3])  # never the last: the head dim stays contiguous
        buffer = torch.stack((k_cache, v_cache), dim=dim)
        args["k_cache"], args["v_cache"] = buffer.select(dim, 0), buffer.select(dim, 1)
    elif k_cache.shape[-1] >= v_cache.shape[-1]:
        args["v_cache"] = k_cache[..., : v_cache.shape[-1]]


def m_out(rng, args):
    q = args.get("q") if isinstance(args.get("q"), torch.Tensor) else args.get("qv")
    v_cache = args.get("v_cache")
    if (
        not isinstance(q, torch.Tensor)
        or not isinstance(v_cache, torch.Tensor)
        or v_cache.dim() != 4
    ):
        return
    dtype = torch.bfloat16 if q.dtype == FP8 else q.dtype
    out = torch.zeros(*q.shape[:-1], v_cache.shape[-1], dtype=dtype)
    kind = rng.choice(["plain", "plain", "broadcast", "transposed", "wrong_dtype", "grad"])
    if kind == "broadcast" and out.dim() and out.shape[0]:
        out = out[:1].expand(*out.shape)
    elif kind == "transposed" and out.dim() >= 3:
        out = out.transpose(0, 1).contiguous().transpose(0, 1)
    elif kind == "wrong_dtype":
        out = out.double()
    elif kind == "grad":
        out.requires_grad_()
    args["out"] = out


def m_rotary(rng, args):
    kind = rng.choice(
        ["short", "dim", "int", "only_sin", "only_cos", "seqlens_alone", "seqlens_is_cache"]
    )
    cos, sin = args.get("rotary_cos"), args.get("rotary_sin")
    tables = all(isinstance(x, torch.Tensor) and x.dim() == 2 for x in (cos, sin))
    if kind == "short" and tables:
        rows = rng.randint(0, cos.shape[0])
        args["rotary_cos"], args["rotary_sin"] = cos[:rows], sin[:rows]
    elif kind == "dim" and tables:
        args["rotary_cos"], args["rotary_sin"] = cos[:, :4], sin[:, :4]
    elif kind == "int" and isinstance(cos, torch.Tensor):
        args["rotary_cos"] = cos.to(I32)
    elif kind == "only_sin":
        args["rotary_sin"], args["rotary_cos"] = torch.zeros(8, 8), None
    elif kind == "only_cos":
        args["rotary_cos"], args["rotary_sin"] = torch.ones(64, 8), None
    elif kind == "seqlens_alone":
        args["rotary_cos"] = args["rotary_sin"] = None
        args["rotary_seqlens"] = torch.tensor([rng.randint(-2, 5)] * _batch(args), dtype=I32)
    elif isinstance(args.get("cache_seqlens"), torch.Tensor):
        args["rotary_seqlens"] = args["cache_seqlens"]


def m_misc(rng, args):
    kind = rng.choice(
        ["sinks", "descale", "drop_k", "drop_v", "qv_list", "descale_type", "cu_k_alone"]
    )
    if kind == "sinks":
        args["sinks"] = rng.choice(
            [torch.zeros(1), torch.zeros(3, dtype=I32), [0.0], torch.full((64,), 1.0)]
        )
    elif kind == "descale":
        args["q_descale"] = rng.choice(
            [torch.ones(1, 1), torch.ones(3, 2, dtype=torch.float64), torch.ones(7)]
        )
    elif kind == "descale_type":
        args["k_descale"] = 1.0
    elif kind == "drop_k":
        args.pop("k", None)
    elif kind == "drop_v":
        args.pop("v", None)
    elif kind == "qv_list":
        args["qv"] = [1.0]
    else:
        args["cu_seqlens_k_new"] = torch.tensor([0, 1], dtype=I32)


MUTATIONS = [
    m_python_type,
    m_scalar,
    m_scalar,
    m_scalar,
    m_index,
    m_index,
    m_structure,
    m_structure,
    m_alias,
    m_shared_buffer,
    m_out,
    m_rotary,
    m_misc,
]


def _batch(args) -> int:
    cu = args.get("cu_seqlens_q")
    if isinstance(cu, torch.Tensor) and cu.dim() == 1:
        return max(cu.shape[0] - 1, 0)
    q = args.get("q") if isinstance(args.get("q"), torch.Tensor) else args.get("qv")
    return q.shape[0] if isinstance(q, torch.Tensor) and q.dim() else 1


def random_call(rng: random.Random) -> dict:
    args = valid_call(rng)
    for _ in range(rng.choice([0, 1, 1, 1, 2, 2, 3])):
        try:
            rng.choice(MUTATIONS)(rng, args)
        except (RuntimeError, TypeError, ValueError, IndexError):
            pass  # a mutation that does not apply after an earlier one (e.g. grad on an int tensor)
    return args


# --------------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------------


def _bits(x: torch.Tensor) -> torch.Tensor:
    """A tensor's values as raw bytes (NaN-safe, dtype-exact), for bit-for-bit comparisons."""
    if x.device.type == "meta":
        return x
    return torch.empty(x.shape, dtype=x.dtype).copy_(x.detach()).view(-1).view(torch.uint8)


def snapshot(args: dict) -> dict:
    return {k: _bits(v) for k, v in args.items() if isinstance(v, torch.Tensor)}


def unchanged(args: dict, before: dict, names) -> list[str]:
    """Names among ``names`` whose tensor is not bit for bit what ``before`` recorded."""
    return [
        k
        for k in names
        if args[k].device.type != "meta" and not torch.equal(_bits(args[k]), before[k])
    ]


def copy_args(args: dict) -> dict:
    """An independent copy of a call that keeps its aliasing: tensors sharing one storage become
    views (same offsets and strides) of one copy of it."""
    storages, copies = {}, {}
    for name, x in args.items():
        if not isinstance(x, torch.Tensor) or x.device.type == "meta":
            copies[name] = x
            continue
        key = x.untyped_storage().data_ptr()
        storage = storages.setdefault(key, x.untyped_storage().clone())
        view = torch.empty(0, dtype=x.dtype).set_(storage, x.storage_offset(), x.shape, x.stride())
        copies[name] = view.requires_grad_() if x.requires_grad else view
    return copies


def outcome(fn, args: dict):
    """``("ok", result)`` or ``("error", exception)`` of ``fn(**args, return_softmax_lse=True)``."""
    try:
        return "ok", fn(**args, return_softmax_lse=True)
    except Exception as exc:  # noqa: BLE001 - any escape is what the contract checks
        return "error", exc


def refusal_problems(exc: BaseException) -> list[str]:
    if not isinstance(exc, CATALOGUED):
        return [f"uncatalogued exception type {type(exc).__name__}: {exc}"]
    entry = errors.lookup(exc, CATALOG)
    if (
        entry is None
        or entry["status"] != "active"
        or entry["exception"]["type"] != type(exc).__name__
    ):
        return [f"no active catalog entry for {type(exc).__name__}: {exc}"]
    if not re.fullmatch(entry["message"]["regex"], str(exc)):
        return [f"message does not match the regex of {entry['slug']}: {exc}"]
    if entry["slug"] not in UNNAMED and not any(
        re.search(rf"\b{p}\b", str(exc)) for p in PARAMETERS
    ):
        return [f"message names no argument ({entry['slug']}): {exc}"]
    return []


def oracle_problems(args: dict, before_args: dict, result) -> list[str]:
    """An accepted call against the oracle run on the pre-call copy ``before_args``."""
    oracle_args = {
        k: v
        for k, v in before_args.items()
        if k not in ("num_splits", "ver", "scheduler_metadata", "pack_gqa", "sm_margin", "out")
    }
    try:
        ref = kvcache_oracle(
            **{
                k: (v.detach() if isinstance(v, torch.Tensor) else v)
                for k, v in oracle_args.items()
            }
        )
        lowp = kvcache_oracle(
            **{
                k: (v.detach() if isinstance(v, torch.Tensor) else v)
                for k, v in oracle_args.items()
            },
            upcast=False,
        )
        out, lse = result[0].detach(), result[1].detach()
        scores_from = before_args.get("qv") if before_args.get("only_qv") else before_args.get("q")
        fp8 = isinstance(scores_from, torch.Tensor) and scores_from.dtype == FP8
        assert out.dtype == ref.out.dtype, (out.dtype, ref.out.dtype)
        # FA's rule with its rounding-noise atol (tiny problems: see tests/tolerance.py)
        assert_close_fa(out, ref.out, lowp.out, fp8=fp8, atol=rounding_atol(ref.out))
        assert_lse_close(lse, ref.lse)
        if isinstance(args.get("out"), torch.Tensor):
            assert result[0] is args["out"]
        assert torch.equal(_bits(args["v_cache"]), _bits(ref.v_cache)), "v_cache after the call"
        if isinstance(args.get("k_cache"), torch.Tensor):
            if before_args.get("rotary_cos") is None or before_args.get("k") is None:
                assert torch.equal(_bits(args["k_cache"]), _bits(ref.k_cache)), (
                    "k_cache after the call"
                )
            else:
                assert_one_rounding_apart(args["k_cache"].detach(), ref.k_cache)
    except AssertionError as exc:
        return [f"accepted call differs from the oracle: {exc}"]
    except Exception as exc:  # noqa: BLE001 - reported with the call, the run goes on
        return [f"the oracle failed on an accepted call: {type(exc).__name__}: {exc}"]
    return []


def check_call(args: dict, on_kernels: bool) -> tuple[str, list[str]]:
    """Run one call on the reference (and the kernels); ``(outcome, problems)``."""
    before = snapshot(args)
    pristine = copy_args(args)
    kernel_args = copy_args(args) if on_kernels else None
    kind, value = outcome(attn_ref.flash_attn_with_kvcache, args)
    problems = []
    if kind == "error":
        problems += refusal_problems(value)
        problems += [f"{n} changed by a refused call" for n in unchanged(args, before, before)]
        label = type(value).__name__
    else:
        written = {"k_cache", "v_cache", "out"}
        problems += [
            f"{n} changed but is not written"
            for n in unchanged(args, before, set(before) - written)
        ]
        problems += oracle_problems(args, pristine, value)
        label = "accepted"
    if on_kernels:
        kernel_before = snapshot(kernel_args)
        k_kind, k_value = outcome(kernels.flash_attn_with_kvcache, kernel_args)
        if k_kind == "error":  # refused, or failed in a launch: nothing written either way
            problems += [
                f"kernels: {n} changed by a failed call"
                for n in unchanged(kernel_args, kernel_before, kernel_before)
            ]
        if k_kind != kind:
            problems.append(
                f"reference {kind} ({value if kind == 'error' else ''}) but kernels {k_kind} "
                f"({k_value if k_kind == 'error' else ''})"
            )
        elif kind == "error" and (type(k_value) is not type(value) or str(k_value) != str(value)):
            problems.append(
                f"different errors: reference {type(value).__name__}: {value}; "
                f"kernels {type(k_value).__name__}: {k_value}"
            )
        elif kind == "ok":
            problems += [
                f"kernels: {p}" for p in oracle_problems(kernel_args, copy_args(pristine), k_value)
            ]
    return label, problems


def fuzz(calls: int, kernel_calls: int, seed: int) -> dict:
    rng = random.Random(seed)
    every = max(1, calls // max(kernel_calls, 1)) if kernel_calls else 0
    stats, violations = Counter(), []
    start = time.perf_counter()
    for i in range(calls):
        args = random_call(rng)
        with_kernels = bool(every) and i % every == 0 and stats["kernel_calls"] < kernel_calls
        label, problems = check_call(args, with_kernels)
        stats[label] += 1
        stats["kernel_calls"] += with_kernels
        violations += [f"call {i}: {p}" for p in problems]
    stats["seconds"] = round(time.perf_counter() - start, 1)
    return dict(stats=dict(stats), violations=violations)


def test_fuzz_contract():
    report = fuzz(CALLS, KERNEL_CALLS, SEED)
    refused = sum(v for k, v in report["stats"].items() if k.endswith("Error"))
    print(
        f"\nfuzz: seed {SEED}, {CALLS} calls, {report['stats'].get('accepted', 0)} accepted, "
        f"{refused} refused { {k: v for k, v in report['stats'].items() if k.endswith('Error')} }, "
        f"{report['stats']['kernel_calls']} also on the kernels, {len(report['violations'])} "
        "violations, "
        f"{report['stats']['seconds']} s"
    )
    assert not report["violations"], "\n".join(report["violations"][:20])
    # both sides exercised
    assert report["stats"].get("accepted", 0) > CALLS // 10 and refused > CALLS // 10
