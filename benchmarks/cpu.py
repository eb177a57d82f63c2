"""CPU suite: ``attn_ref.flash_attn_with_kvcache`` against torch SDPA at its best on the same
problems, and a training step of ``attn_ref.flash_attn_func`` against SDPA's.

For each problem (:mod:`benchmarks.problems`, fp32: the reference's own math, and SDPA's fastest
dtype on this CPU):

1. build the shuffled paged cache, and for SDPA the call a user would pick (:func:`baselines`), its
   inputs prepared ahead of time and not timed: q in SDPA's ``(b, h, sq, d)`` layout, contiguous;
   K/V gathered from the pages into dense ``(b, h_k, sk, d)`` tensors, the KV heads *not* repeated
   (``enable_gqa=True`` maps the query heads); no mask where the problem needs none (decode),
   ``is_causal=True`` for causal prefill, and for ragged lengths both ways a user has: one call with
   a padding mask, and one call per sequence on its own keys;
2. call each once (warm-up) and record the largest difference from the reference's output;
3. time them interleaved, ``attn_ref, sdpa, attn_ref, sdpa, ...``, so a change of load on the
   machine hits all alike, and keep the median of each (``time.perf_counter``);
4. measure each call's peak resident memory on top of its inputs (:mod:`benchmarks.memory`).

The training suite (:mod:`benchmarks.training`) times the same way one step's attention, forward
and backward: ``attn_ref.flash_attn_func`` and ``torch.autograd.grad`` of its output, against
``F.scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)`` and the same
``torch.autograd.grad``, every leaf made before the timer.

The baseline of a case is its fastest SDPA call; the time ratio reference / baseline of the same run
is the figure of merit (target: at most 2 at every decode, prefill and training case).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

import attn_ref

from . import training
from .memory import METHOD, peak_extra_bytes
from .problems import KVCacheInputs, Problem, decode, dense_kv, make_inputs, prefill, sdpa_mask
from .training import TrainingProblem

DTYPE = "float32"
#: Calls slower than this (seconds) get 5 timed repetitions instead of 7.
SLOW_CALL_S = 2.0
TIMING = (
    "median of 7 interleaved time.perf_counter calls (5 when the reference's warm-up call took "
    f"over {SLOW_CALL_S:g} s; quick mode: 3), after one warm-up call each"
)
#: How the suite measures memory (benchmarks.run records it).
MEMORY = METHOD
#: Largest reference / baseline time ratio allowed, on every decode, prefill and training case.
RATIO_TARGET = 2.0
#: The suites that have the ratio target.
RATIO_SUITES = ("decode", "prefill", "training")


def problems(quick: bool) -> list[Problem]:
    """Decode: b=8, 32/8 heads, d=128, page 64, contexts 1k..32k, and ragged lengths up to 8k.
    Prefill: b=1, causal, 512..4k. All fp32."""
    if quick:
        return [
            decode(8, 256, DTYPE),
            decode(8, 512, DTYPE, ragged=True),
            prefill(1, 128, DTYPE),
            prefill(1, 256, DTYPE),
        ]
    contexts = (1024, 2048, 4096, 8192, 16384, 32768)
    return (
        [decode(8, c, DTYPE) for c in contexts]
        + [decode(8, 8192, DTYPE, ragged=True)]
        + [prefill(1, s, DTYPE) for s in (512, 1024, 2048, 4096)]
    )


def training_problems(quick: bool) -> list[TrainingProblem]:
    """Training: b=1, causal, 32/8 heads, d=128, fp32, 2k and 4k tokens."""
    return [TrainingProblem(s, DTYPE) for s in ((128,) if quick else (2048, 4096))]


def run(quick: bool) -> Iterator[dict]:
    """The case records, one at a time (a run stopped early keeps those already yielded)."""
    for problem in problems(quick):
        yield measure(problem, quick)
    for problem in training_problems(quick):
        yield measure_training(problem, quick)


def baselines(
    problem: Problem, inputs: KVCacheInputs
) -> dict[str, tuple[Callable[[], torch.Tensor], str, int]]:
    """The SDPA calls of the problem, by name: ``(call () -> (b, sq, h, d), its exact call, input
    bytes)``, every input made here, before any timer starts."""
    q = inputs.q.transpose(1, 2).contiguous()  # (b, h, sq, d)
    k, v = dense_kv(inputs, problem.seqlen_k, expand_gqa=False)  # (b, h_k, sk, d) each
    if not problem.ragged:
        call = (
            f"F.scaled_dot_product_attention(q, k, v, is_causal={problem.causal}, enable_gqa=True) "
            " # q (b, h, sq, d), K/V (b, h_k, sk, d) contiguous"
        )
        return {
            "sdpa": (
                lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=problem.causal, enable_gqa=True
                ).transpose(1, 2),
                call,
                q.nbytes + k.nbytes + v.nbytes,
            )
        }
    mask = sdpa_mask(problem, "cpu")  # (b, 1, sq, sk) bool: each sequence's keys
    lengths = problem.seqlens_k()
    per_sequence = [
        (q[i : i + 1], k[i : i + 1, :, :n].contiguous(), v[i : i + 1, :, :n].contiguous())
        for i, n in enumerate(lengths)
    ]  # (1, h, sq, d), (1, h_k, n_i, d) each
    return {
        "sdpa_masked": (
            lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=True
            ).transpose(1, 2),
            "F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  "
            "# K/V padded to the longest sequence, mask (b, 1, sq, sk) bool",
            q.nbytes + k.nbytes + v.nbytes + mask.nbytes,
        ),
        "sdpa_per_sequence": (
            lambda: torch.cat(
                [
                    F.scaled_dot_product_attention(
                        qi, ki, vi, is_causal=problem.causal, enable_gqa=True
                    )
                    for qi, ki, vi in per_sequence
                ]
            ).transpose(1, 2),
            f"torch.cat([F.scaled_dot_product_attention(q_i, k_i, v_i, is_causal={problem.causal}, "
            "enable_gqa=True) for q_i, k_i, v_i in per_sequence])  # K/V of each sequence's own "
            "length",
            sum(t.nbytes for seq in per_sequence for t in seq),
        ),
    }


def measure(problem: Problem, quick: bool) -> dict:
    """One case record: per-provider median time, throughput, ratio to the baseline and peak
    memory."""
    inputs = make_inputs(problem, "cpu")
    sdpa = baselines(problem, inputs)
    calls: dict[str, Callable[[], torch.Tensor]] = {
        "attn_ref": lambda: attn_ref.flash_attn_with_kvcache(**inputs.kwargs()),  # (b, sq, h, d)
        **{name: fn for name, (fn, _, _) in sdpa.items()},
    }
    described = {
        "attn_ref": "attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, page_table=page_table, "
        f"cache_seqlens=cache_seqlens, causal={problem.causal})"
    }
    described |= {name: call for name, (_, call, _) in sdpa.items()}
    input_bytes = {
        "attn_ref": inputs.nbytes(),
        **{name: size for name, (_, _, size) in sdpa.items()},
    }
    start = time.perf_counter()
    reference = calls["attn_ref"]().float()
    slow = time.perf_counter() - start > SLOW_CALL_S
    diffs = {
        "attn_ref": 0.0,
        **{
            name: (fn().float() - reference).abs().max().item() for name, (fn, _, _) in sdpa.items()
        },
    }
    del reference
    return _case(problem, calls, described, input_bytes, diffs, 3 if quick else 5 if slow else 7)


def measure_training(problem: TrainingProblem, quick: bool) -> dict:
    """One training case record: ``attn_ref.flash_attn_func`` forward and backward against SDPA's
    (:mod:`benchmarks.training`), measured as :func:`measure` measures a call."""
    inputs = training.make_inputs(problem, "cpu")
    sdpa, sdpa_call = training.sdpa_step(inputs, problem.causal)
    calls = {
        "attn_ref": training.flash_attn_step(attn_ref.flash_attn_func, inputs, problem.causal),
        "sdpa": sdpa,
    }
    described = {
        "attn_ref": f"out = attn_ref.flash_attn_func(q, k, v, causal={problem.causal}); "
        "torch.autograd.grad(out, (q, k, v), dout)  # leaves (b, s, h, d), K/V (b, s, h_k, d)",
        "sdpa": sdpa_call,
    }
    start = time.perf_counter()
    reference = calls["attn_ref"]()
    slow = time.perf_counter() - start > SLOW_CALL_S
    diffs = {"attn_ref": 0.0, "sdpa": training.max_difference(sdpa(), reference)}
    del reference
    input_bytes = {name: inputs.nbytes() for name in calls}
    return _case(problem, calls, described, input_bytes, diffs, 3 if quick else 5 if slow else 7)


def _case(problem, calls, described, input_bytes, diffs, reps) -> dict:
    """The record of one case: ``calls`` (``attn_ref`` and SDPA's, by name) timed interleaved
    ``reps`` times, each one's median, throughput, ratio to the fastest SDPA call and peak memory
    (``problem``: a :class:`~benchmarks.problems.Problem` or a
    :class:`~benchmarks.training.TrainingProblem`)."""
    times = interleaved_times(calls, reps)
    medians = {name: statistics.median(t) for name, t in times.items()}
    baseline = min((name for name in calls if name != "attn_ref"), key=medians.get)
    providers = {}
    for name, fn in calls.items():
        t = medians[name]
        providers[name] = {
            "time_s": t,
            "times_s": times[name],
            "bytes_per_s": problem.bytes_moved() / t,
            "flop_per_s": problem.flops() / t,
            "time_ratio_vs_baseline": t / medians[baseline],
            "input_bytes": input_bytes[name],
            "peak_extra_bytes": peak_extra_bytes(fn),
            "max_abs_diff_vs_attn_ref": diffs[name],
            "call": described[name],
        }
    return {
        "suite": problem.suite,
        "label": problem.label,
        "shape": problem.shape(),
        "bytes": problem.bytes_moved(),
        "flops": problem.flops(),
        "baseline": baseline,
        "providers": providers,
        "loadavg_1min_after": os.getloadavg()[0],  # other processes on the machine skew the timings
    }


def interleaved_times(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """``reps`` wall-clock seconds per call, the calls taking turns."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def targets(cases: list[dict]) -> list[dict]:
    """The CPU targets: reference within 2x of the fastest SDPA call on every decode, prefill and
    training case; a 32k context that runs."""
    found = []
    for case in cases:
        if case["suite"] not in RATIO_SUITES:
            continue
        ratio = case["providers"]["attn_ref"]["time_ratio_vs_baseline"]
        found.append(
            {
                "name": f"{case['suite']} {case['label']}: attn_ref time / "
                f"{case.get('baseline', 'sdpa')} time <= {RATIO_TARGET}",
                "value": ratio,
                "met": ratio <= RATIO_TARGET,
            }
        )
    long = [c for c in cases if c["suite"] == "decode" and c["shape"]["seqlen_k"] >= 32768]
    if long:
        peak = max(
            c["providers"]["attn_ref"]["input_bytes"]
            + (c["providers"]["attn_ref"]["peak_extra_bytes"] or 0)
            for c in long
        )
        found.append(
            {
                "name": "decode with a 32k context runs in memory (inputs + peak extra, bytes)",
                "value": peak,
                "met": True,
            }
        )
    return found
