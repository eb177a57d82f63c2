"""CPU suite: ``attn_ref.flash_attn_with_kvcache`` against torch SDPA on the same problems.

For each problem (:mod:`benchmarks.problems`):

1. build the shuffled paged cache, and for SDPA the dense K/V gathered from it with the KV heads
   repeated for their query heads (GQA expanded) plus the explicit boolean mask; SDPA's inputs are
   prepared ahead of time and not timed;
2. call each once (warm-up) and record the largest difference from the reference's output;
3. time them interleaved, ``attn_ref, sdpa, attn_ref, sdpa, ...``, so a change of load on the
   machine hits both alike, and keep the median of each (``time.perf_counter``);
4. measure each call's peak resident memory on top of its inputs (:mod:`benchmarks.memory`).

The time ratio reference / SDPA of the same run is the figure of merit (target: at most 2 for
decode at every context).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

import attn_ref

from .memory import METHOD as MEMORY
from .memory import peak_extra_bytes
from .problems import Problem, decode, dense_kv, make_inputs, prefill, sdpa_mask

BASELINE = "sdpa"
#: Calls slower than this (seconds) get 5 timed repetitions instead of 7.
SLOW_CALL_S = 2.0
TIMING = ("median of 7 interleaved time.perf_counter calls (5 when the reference's warm-up call took over "
          f"{SLOW_CALL_S:g} s; quick mode: 3), after one warm-up call each")
#: Largest reference / SDPA time ratio allowed on decode.
DECODE_RATIO_TARGET = 2.0


def problems(quick: bool) -> list[Problem]:
    """Decode: b=8, 32/8 heads, d=128, page 64, contexts 1k..32k. Prefill: b=1, causal, 512..4k."""
    if quick:
        return [decode(8, 256), decode(8, 512), prefill(1, 128), prefill(1, 256)]
    contexts = (1024, 2048, 4096, 8192, 16384, 32768)
    return [decode(8, c) for c in contexts] + [prefill(1, s) for s in (512, 1024, 2048, 4096)]


def run(quick: bool) -> Iterator[dict]:
    """The case records, one at a time (a run stopped early keeps those already yielded)."""
    for problem in problems(quick):
        yield measure(problem, quick)


def measure(problem: Problem, quick: bool) -> dict:
    """One case record: per-provider median time, throughput, ratio to SDPA and peak memory."""
    inputs = make_inputs(problem, "cpu")
    k, v = dense_kv(inputs, problem.seqlen_k, expand_gqa=True)  # (b, h, sk, d) each
    q = inputs.q.transpose(1, 2)  # (b, h, sq, d)
    mask = sdpa_mask(problem, "cpu")  # (sq, sk) bool, broadcast over batch and heads
    calls: dict[str, Callable[[], torch.Tensor]] = {
        "attn_ref": lambda: attn_ref.flash_attn_with_kvcache(**inputs.kwargs()),  # (b, sq, h, d)
        BASELINE: lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2),
    }
    input_bytes = {"attn_ref": inputs.nbytes(), BASELINE: q.nbytes + k.nbytes + v.nbytes + mask.nbytes}
    start = time.perf_counter()
    reference = calls["attn_ref"]().float()
    slow = time.perf_counter() - start > SLOW_CALL_S
    diffs = {"attn_ref": 0.0, BASELINE: (calls[BASELINE]().float() - reference).abs().max().item()}
    del reference
    times = interleaved_times(calls, 3 if quick else 5 if slow else 7)
    baseline_time = statistics.median(times[BASELINE])
    providers = {}
    for name, fn in calls.items():
        t = statistics.median(times[name])
        providers[name] = {
            "time_s": t,
            "times_s": times[name],
            "bytes_per_s": problem.bytes_moved() / t,
            "flop_per_s": problem.flops() / t,
            "time_ratio_vs_baseline": t / baseline_time,
            "input_bytes": input_bytes[name],
            "peak_extra_bytes": peak_extra_bytes(fn),
            "max_abs_diff_vs_attn_ref": diffs[name],
        }
    return {
        "suite": problem.suite,
        "label": problem.label,
        "shape": problem.shape(),
        "bytes": problem.bytes_moved(),
        "flops": problem.flops(),
        "baseline": BASELINE,
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
    """The CPU targets: reference within 2x of SDPA on every decode case; a 32k context that runs."""
    decode_cases = [c for c in cases if c["suite"] == "decode"]
    found = []
    for case in decode_cases:
        ratio = case["providers"]["attn_ref"]["time_ratio_vs_baseline"]
        found.append({
            "name": f"decode {case['label']}: attn_ref time / SDPA time <= {DECODE_RATIO_TARGET}",
            "value": ratio,
            "met": ratio <= DECODE_RATIO_TARGET,
        })
    long = [c for c in decode_cases if c["shape"]["seqlen_k"] >= 32768]
    if long:
        peak = max(c["providers"]["attn_ref"]["input_bytes"] + (c["providers"]["attn_ref"]["peak_extra_bytes"] or 0)
                   for c in long)
        found.append({"name": "decode with a 32k context runs in memory (inputs + peak extra, bytes)",
                      "value": peak, "met": True})
    return found
