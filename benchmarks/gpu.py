"""GPU suite: ``kernels`` against torch SDPA (flash backend) and FlashAttention, on a CUDA device.

Figures (counts in :mod:`benchmarks.problems`; TB = 1e12):

* **decode**: achieved bandwidth ``bytes / time`` in TB/s and in % of the device-to-device copy
  bandwidth measured in the same run (:func:`ceilings`); target >= 70 % for ``b * seqlen_k >= 64k``.
* **prefill**: ``flops / time`` in TFLOP/s; target >= 0.8x SDPA's flash backend at 8k causal.
* **combine**: ``kernels.merge_attention_states`` bandwidth, next to the PyTorch reference
  ``attn_ref.merge_attention_states`` run eagerly on the same GPU.
* **graph**: one decode step (a new token appended per sequence, then attention) at batch 1/8/64 and
  1k/8k context: the public call captured in a CUDA graph and replayed (``kernels``; first checked:
  three replays with new tokens and moved ``cache_seqlens`` match eager calls exactly), against
  the eager call with its value checks (``kernels_api``, the baseline) and without
  (``kernels_unchecked``, inside ``kernels.no_host_checks()``).

Providers see the same logical problem. ``kernels`` is the public call
``kernels.flash_attn_with_kvcache`` captured in a CUDA graph, as a serving engine runs it (under
capture its value checks, which read index tensors on the host, are off:
:mod:`kernels.host_checks`); ``kernels_api`` the same call made eagerly with the value checks on
(device-to-host syncs, host work timed). Both, and FA3 (same API), read the shuffled paged cache;
SDPA reads K/V gathered into dense ``(b, h_k, sk, d)`` tensors ahead of time (``enable_gqa=True``;
dense ``(b, h, sk, d)`` copies with the KV heads repeated if that backend refuses GQA; each
provider's ``setup`` says which), with ``is_causal`` for prefill (``sq == sk``, so top-left and
bottom-right alignment coincide); FlashAttention 2, whose paged cache needs pages of a multiple of
256 tokens, reads the dense cache.

Timing (:func:`cuda_time`): after a warm-up call (compilation, autotuning), the call is captured in
a CUDA graph and ``triton.testing.do_bench(graph.replay, return_mode="median")`` times it;
``do_bench`` zeroes a 256 MB buffer before every replay, so every call starts with a cold L2. A call
that cannot be captured (it synchronises with the host) is timed eagerly by ``do_bench``, host work
included, and says so in its ``method``.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F

import attn_ref
from attn_ref import paged_to_dense

from .problems import Problem, decode, dense_kv, make_inputs, prefill

#: do_bench budgets in milliseconds (warm-up, repetitions).
WARMUP_MS, REP_MS = 25, 100
TIMING = (
    "CUDA graph replay timed by triton.testing.do_bench(return_mode='median', warmup=25 ms, "
    "rep=100 ms), L2 zeroed before each replay; calls that cannot be captured: do_bench of the "
    "eager call"
)
BASELINE = "sdpa_flash"
DECODE_BANDWIDTH_TARGET = 70.0  # % of the measured copy bandwidth
PREFILL_SPEED_TARGET = 0.8  # kernels throughput / SDPA flash throughput at 8k causal
#: Vendor datasheet HBM bandwidth, shown next to the measured copy bandwidth (H200 SXM: 4.8 TB/s).
DATASHEET_HBM_BYTES_PER_S = {"H200": 4.8e12}

#: Providers timed eagerly (host work included): ``kernels_api`` synchronises with the host (its
#: value checks), so a CUDA graph cannot capture it; ``kernels_unchecked`` is the eager call without
#: them.
EAGER_PROVIDERS = {"kernels_api", "kernels_unchecked"}
#: Replays of a captured decode step checked against eager calls before the graph suite times it.
REPLAY_CHECKS = 3

Timer = Callable[[Callable[[], object], bool], dict]  # (call, capture in a CUDA graph?) -> timing


# --- problems -------------------------------------------------------------------------------------


def problems(quick: bool) -> list[Problem]:
    """bf16, GQA 32/8, d=128, page 64. Decode at batch x context >= 64k tokens (and one launch-bound
    case); prefill up to 16k causal, 8k being the target."""
    if quick:
        return [decode(4, 4096), prefill(1, 2048)]
    targets_first = [decode(8, 8192), decode(4, 32768), prefill(1, 8192)]  # measured first: a time
    # limit that stops the run keeps them
    others = [decode(16, 8192), decode(1, 65536), decode(8, 1024)]
    return targets_first + others + [prefill(1, 2048), prefill(1, 4096), prefill(1, 16384)]


def graph_problems(quick: bool) -> list[Problem]:
    """Decode steps of the graph suite: batch 1 / 8 / 64 at 1k and 8k context."""
    if quick:
        return [decode(8, 1024)]
    return [decode(batch, context) for context in (1024, 8192) for batch in (1, 8, 64)]


def combine_shapes(quick: bool) -> list[tuple[int, int, int]]:
    """``(rows, heads, dv)`` of the merged attention states (fp32 out, fp32 lse)."""
    return [(1024, 32, 128)] if quick else [(8192, 32, 128), (65536, 32, 128)]


# --- timing ---------------------------------------------------------------------------------------


def cuda_time(fn: Callable[[], object], capture: bool = True) -> dict:
    """Median time of ``fn()`` on the GPU, cold L2 (see the module docstring)."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    graph = _capture(fn) if capture else None
    if graph is not None:
        ms = triton.testing.do_bench(
            graph.replay, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"
        )
        return {"time_s": ms * 1e-3, "method": "cuda graph + do_bench median, cold L2"}
    ms = triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
    return {
        "time_s": ms * 1e-3,
        "method": "eager call (not graph-capturable): do_bench median, host work included, cold L2",
    }


def cuda_graph_replay(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph: its replay (raises if the capture is refused)."""
    graph = _capture(fn)
    if graph is None:
        raise RuntimeError("the call could not be captured in a CUDA graph")
    return graph.replay


def _capture(fn: Callable[[], object]) -> Optional[torch.cuda.CUDAGraph]:
    """``fn`` captured in a CUDA graph, or None if it cannot be (e.g. it reads a tensor on the
    host)."""
    side = torch.cuda.Stream()  # warm up on a side stream first, as torch.cuda.graph's docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    # a refused capture (e.g. a host sync): time the call eagerly instead
    except Exception:  # noqa: BLE001
        torch.cuda.synchronize()  # a refused capture is not a sticky CUDA error
        return None
    graph.replay()
    torch.cuda.synchronize()
    return graph


# --- ceilings -------------------------------------------------------------------------------------


def ceilings(timer: Timer = cuda_time) -> dict:
    """Measured device-to-device copy bandwidth (1 GiB, bytes read + written) and bf16 matmul rate
    (8192^3), plus the datasheet HBM bandwidth when the GPU is one we know."""
    src = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    copy_s = timer(lambda: dst.copy_(src), True)["time_s"]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    matmul_s = timer(lambda: a @ b, True)["time_s"]
    found = {
        "copy_bytes_per_s": 2 * src.nbytes / copy_s,
        "matmul_bf16_flop_per_s": 2 * 8192**3 / matmul_s,
    }
    name = torch.cuda.get_device_name()
    for part, bandwidth in DATASHEET_HBM_BYTES_PER_S.items():
        if part in name:
            found["datasheet_hbm_bytes_per_s"] = bandwidth
    return found


# --- providers ------------------------------------------------------------------------------------
# A provider is built by a function returning ``(call, setup)``: ``call()`` returns the output,
# ``setup`` says how the provider was set up. Building may fail (a package or kernel missing): that
# is reported.

Builder = Callable[[], tuple[Callable[[], torch.Tensor], str]]


def attention_builders(problem: Problem, inputs) -> dict[str, Builder]:
    """Providers of a decode / prefill case, each call returning ``out (b, sq, h, d)``."""
    builders = {
        "kernels": lambda: kernels_call(inputs.kwargs()),
        "kernels_api": lambda: kernels_api_call(inputs.kwargs()),
        BASELINE: lambda: sdpa_flash_call(problem, inputs),
    }
    if _installed("flash_attn_interface") or _installed("flash_attn"):
        builders["flash_attn"] = lambda: flash_attn_call(problem, inputs)
    return builders


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except Exception:  # noqa: BLE001  (missing, or installed but broken: not a provider either way)
        return False
    return True


def kernels_call(kwargs: dict) -> tuple[Callable[[], torch.Tensor], str]:
    """``kernels.flash_attn_with_kvcache(**kwargs)``, the public call; the timer captures it in a
    CUDA graph (value checks off under capture)."""
    import kernels

    fn = kernels.flash_attn_with_kvcache
    accum = fn(**kwargs, return_softmax_lse=True)[2]
    splits = 1 if accum is None else accum.shape[0]
    return (lambda: fn(**kwargs)), f"public call in a CUDA graph, num_splits=0 chose {splits}"


def kernels_api_call(kwargs: dict) -> tuple[Callable[[], torch.Tensor], str]:
    """The public call made eagerly, value checks on (they read index tensors: a host sync)."""
    import kernels

    fn = kernels.flash_attn_with_kvcache
    return (lambda: fn(**kwargs)), "public call, eager, value checks on (host sync)"


def kernels_unchecked_call(kwargs: dict) -> tuple[Callable[[], torch.Tensor], str]:
    """The public call made eagerly inside ``kernels.no_host_checks()``: no host read, host work
    timed."""
    import kernels

    fn = kernels.flash_attn_with_kvcache

    def call():
        with kernels.no_host_checks():
            return fn(**kwargs)

    return call, "public call, eager, inside kernels.no_host_checks()"


def decode_step(inputs) -> dict:
    """Arguments of one decode step on ``inputs``: one new k/v token per sequence appended at
    ``cache_seqlens - 1``, so the step attends to the problem's ``seqlen_k`` keys."""
    q = inputs.q
    gen = torch.Generator(device=q.device).manual_seed(1)
    shape = (q.shape[0], 1, inputs.k_cache.shape[2], q.shape[3])
    k, v = (torch.randn(shape, generator=gen, device=q.device, dtype=q.dtype) for _ in range(2))
    return dict(inputs.kwargs(), k=k, v=v, cache_seqlens=inputs.cache_seqlens - 1)


def replay_difference(step: dict, capture: Callable, steps: int = REPLAY_CHECKS) -> float:
    """Capture the public call on copies of ``step``'s tensors (``capture(fn)`` returns the replay),
    then ``steps`` times: new q / k / v and ``cache_seqlens`` (moved by a different amount per
    sequence) written into the captured tensors, one replay, and the eager call (value checks on) on
    a second copy of the caches. Returns the largest ``|out|`` difference (0 expected); raises if
    the caches differ. Needs ``cache_seqlens >= steps + 2``."""
    import kernels

    args = {name: x.clone() if isinstance(x, torch.Tensor) else x for name, x in step.items()}
    args["out"] = torch.empty_like(args["q"])  # the graph's output tensor
    eager = dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone(), out=None)
    replay = capture(lambda: kernels.flash_attn_with_kvcache(**args))
    for name in ("k_cache", "v_cache"):  # undo the warm-up call's append
        args[name].copy_(eager[name])
    q, device = args["q"], args["q"].device
    gen = torch.Generator(device=device).manual_seed(2)
    offsets = torch.arange(q.shape[0], device=device) % 3
    worst = 0.0
    for i in range(steps):
        for name in ("q", "k", "v"):
            args[name].copy_(
                torch.randn(args[name].shape, generator=gen, device=device, dtype=q.dtype)
            )
        args["cache_seqlens"].copy_(step["cache_seqlens"] - steps + i - offsets)
        replay()
        expected = kernels.flash_attn_with_kvcache(
            **dict(eager, **{name: args[name].clone() for name in ("q", "k", "v", "cache_seqlens")})
        )
        worst = max(worst, (args["out"].float() - expected.float()).abs().max().item())
        if not all(torch.equal(args[name], eager[name]) for name in ("k_cache", "v_cache")):
            raise AssertionError(f"replay {i}: the cache differs from the eager call's")
    return worst


def kernels_graph_call(step: dict, capture: Callable) -> tuple[Callable[[], torch.Tensor], str]:
    """The graph suite's ``kernels``: :func:`replay_difference` must be 0, then the public call
    (timed as the timer captures it in a CUDA graph)."""
    worst = replay_difference(step, capture)
    if worst != 0:
        raise AssertionError(f"CUDA graph replays differ from eager calls by up to {worst}")
    fn, setup = kernels_call(step)
    return (
        fn,
        f"{setup}; {REPLAY_CHECKS} replays with new tokens and cache_seqlens = eager calls, "
        "exactly",
    )


def sdpa_flash_call(problem: Problem, inputs) -> tuple[Callable[[], torch.Tensor], str]:
    """SDPA's flash backend on dense K/V: GQA through ``enable_gqa`` if the backend takes it, else
    on K/V with the KV heads repeated (4x the bytes)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = inputs.q.transpose(1, 2)  # (b, h, sq, d)
    k, v = dense_kv(inputs, problem.seqlen_k, expand_gqa=False)  # (b, h_k, sk, d)

    def gqa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal, enable_gqa=True)
        return out.transpose(1, 2)  # (b, sq, h, d)

    try:
        gqa()
        return gqa, "flash backend, dense (b, h_k, sk, d) K/V, enable_gqa=True"
    except RuntimeError:
        del k, v
    k_rep, v_rep = dense_kv(inputs, problem.seqlen_k, expand_gqa=True)  # (b, h, sk, d)

    def repeated():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=problem.causal)
        return out.transpose(1, 2)

    return (
        repeated,
        "flash backend refused enable_gqa: dense (b, h, sk, d) K/V with KV heads repeated",
    )


def flash_attn_call(problem: Problem, inputs) -> tuple[Callable[[], torch.Tensor], str]:
    """FlashAttention 3 (``flash_attn_interface``, the same API as ours) or else 2
    (``flash_attn``)."""
    if _installed("flash_attn_interface"):
        from flash_attn_interface import flash_attn_with_kvcache as fa3

        return (lambda: fa3(**inputs.kwargs())), "FlashAttention 3, paged cache"
    from flash_attn import flash_attn_with_kvcache as fa2

    sk = problem.seqlen_k
    # (b, sk, h_k, d)
    k_dense = paged_to_dense(inputs.k_cache, inputs.page_table)[:, :sk].contiguous()
    v_dense = paged_to_dense(inputs.v_cache, inputs.page_table)[:, :sk].contiguous()
    return (
        lambda: fa2(
            inputs.q, k_dense, v_dense, cache_seqlens=inputs.cache_seqlens, causal=problem.causal
        ),
        "FlashAttention 2, contiguous cache (its paged cache needs pages of a multiple of 256 "
        "tokens)",
    )


def combine_builders(states) -> dict[str, Builder]:
    """Providers of a combine case, each call returning the merged ``out``."""

    def kernels_merge():
        import kernels

        merge = kernels.merge_attention_states
        return (lambda: merge(*states)[0]), "Triton merge kernel"

    return {
        "attn_ref": lambda: (
            (lambda: attn_ref.merge_attention_states(*states)[0]),
            "eager PyTorch",
        ),
        "kernels": kernels_merge,
    }


# --- cases ----------------------------------------------------------------------------------------


def measure_attention(problem: Problem, timer: Timer, ceilings: dict, device: str = "cuda") -> dict:
    """One decode / prefill case: every provider's time, TB/s, TFLOP/s, % of copy bandwidth,
    error."""
    inputs = make_inputs(problem, device)
    reference = attn_ref.flash_attn_with_kvcache(**inputs.kwargs()).float()  # (b, sq, h, d)
    providers = {
        name: _measured(
            name, build, reference, problem.bytes_moved(), problem.flops(), timer, ceilings
        )
        for name, build in attention_builders(problem, inputs).items()
    }
    return _case(
        problem.suite,
        problem.label,
        problem.shape(),
        problem.bytes_moved(),
        problem.flops(),
        providers,
        ceilings,
    )


def measure_graph_step(
    problem: Problem,
    timer: Timer,
    ceilings: dict,
    device: str = "cuda",
    capture: Callable = cuda_graph_replay,
) -> dict:
    """One graph-suite case: a decode step (:func:`decode_step`) replayed from a CUDA graph
    (``kernels``, after :func:`replay_difference`), eager with value checks (``kernels_api``, the
    baseline) and eager without (``kernels_unchecked``)."""
    step = decode_step(make_inputs(problem, device))
    # writes the same new token as the calls
    reference = attn_ref.flash_attn_with_kvcache(**step).float()
    builders = {
        "kernels": lambda: kernels_graph_call(step, capture),
        "kernels_api": lambda: kernels_api_call(step),
        "kernels_unchecked": lambda: kernels_unchecked_call(step),
    }
    providers = {
        name: _measured(
            name, build, reference, problem.bytes_moved(), problem.flops(), timer, ceilings
        )
        for name, build in builders.items()
    }
    return _case(
        "graph",
        problem.label,
        problem.shape(),
        problem.bytes_moved(),
        problem.flops(),
        providers,
        ceilings,
        baseline="kernels_api",
    )


def measure_combine(
    rows: int, heads: int, dv: int, timer: Timer, ceilings: dict, device: str = "cuda"
) -> dict:
    """``(out_a, lse_a) ⊕ (out_b, lse_b)`` of fp32 states ``out (rows, heads, dv)``, ``lse (rows,
    heads)``.

    Bytes: both states read, the merged one written: ``3 * rows * heads * (dv + 1) * 4``.
    FLOPs are not counted (a handful per element; the merge is bandwidth-bound).
    """
    gen = torch.Generator(device=device).manual_seed(0)
    out_a, out_b = (torch.randn(rows, heads, dv, generator=gen, device=device) for _ in range(2))
    lse_a, lse_b = (torch.randn(rows, heads, generator=gen, device=device) for _ in range(2))
    states = (out_a, lse_a, out_b, lse_b)
    nbytes = 3 * rows * heads * (dv + 1) * 4
    reference = attn_ref.merge_attention_states(*states)[0]
    providers = {
        name: _measured(name, build, reference, nbytes, 0, timer, ceilings)
        for name, build in combine_builders(states).items()
    }
    shape = {"rows": rows, "heads": heads, "head_dim_v": dv, "dtype": "float32"}
    return _case(
        "combine",
        f"rows={rows} h={heads} dv={dv}",
        shape,
        nbytes,
        0,
        providers,
        ceilings,
        baseline="attn_ref",
    )


def _measured(
    name: str,
    build: Builder,
    reference: torch.Tensor,
    nbytes: int,
    flops: int,
    timer: Timer,
    ceilings: dict,
) -> dict:
    """Build and time one provider; a failure is recorded as the provider's result, not raised."""
    try:
        fn, setup = build()
        diff = (fn().float() - reference).abs().max().item()
        timing = timer(fn, name not in EAGER_PROVIDERS)
    except Exception as exc:  # noqa: BLE001  (a provider that fails is a result to report)
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    t = timing["time_s"]
    measured = {
        **timing,
        "setup": setup,
        "bytes_per_s": nbytes / t,
        "flop_per_s": flops / t,
        "max_abs_diff_vs_attn_ref": diff if math.isfinite(diff) else None,
    }
    if not math.isfinite(diff):
        measured["setup"] += "; OUTPUT NOT FINITE (NaN/inf where the reference is finite)"
    if "copy_bytes_per_s" in ceilings:
        measured["pct_of_copy_bandwidth"] = (
            100 * measured["bytes_per_s"] / ceilings["copy_bytes_per_s"]
        )
    return measured


def _case(suite, label, shape, nbytes, flops, providers, ceilings, baseline=BASELINE) -> dict:
    base = providers.get(baseline, {}).get("time_s")
    for p in providers.values():
        if "time_s" in p:
            p["time_ratio_vs_baseline"] = p["time_s"] / base if base else None
    ideal = nbytes / ceilings["copy_bytes_per_s"] if "copy_bytes_per_s" in ceilings else None
    if ideal is not None and flops and "matmul_bf16_flop_per_s" in ceilings:
        ideal = max(ideal, flops / ceilings["matmul_bf16_flop_per_s"])
    return {
        "suite": suite,
        "label": label,
        "shape": shape,
        "bytes": nbytes,
        "flops": flops,
        "baseline": baseline,
        "ideal_time_s": ideal,
        "providers": providers,
    }


def _failed_case(
    suite: str, problem: Problem, exc: Exception, ceilings: dict, baseline=BASELINE
) -> dict:
    """The record of a case whose setup failed."""
    failed = {"setup": {"error": f"{type(exc).__name__}: {exc}"[:500]}}
    return _case(
        suite,
        problem.label,
        problem.shape(),
        problem.bytes_moved(),
        problem.flops(),
        failed,
        ceilings,
        baseline,
    )


def run(
    quick: bool, ceilings: dict, timer: Timer = cuda_time, device: str = "cuda"
) -> Iterator[dict]:
    """The case records, one at a time (a run stopped early keeps those already yielded)."""
    for problem in problems(quick):
        try:
            yield measure_attention(problem, timer, ceilings, device)
        except Exception as exc:  # noqa: BLE001  (keep the other cases: report this one's failure)
            yield _failed_case(problem.suite, problem, exc, ceilings)
        if not quick:
            time.sleep(1)  # let clocks and power settle between cases (FA's benchmark habit)
    for shape in combine_shapes(quick):
        yield measure_combine(*shape, timer, ceilings, device)
    for problem in graph_problems(quick):
        try:
            yield measure_graph_step(problem, timer, ceilings, device)
        except Exception as exc:  # noqa: BLE001  (as above)
            yield _failed_case("graph", problem, exc, ceilings, baseline="kernels_api")


def targets(cases: list[dict]) -> list[dict]:
    """Decode >= 70 % of copy bandwidth at b x context >= 64k; prefill >= 0.8x SDPA flash at 8k
    causal."""
    found = []
    for case in cases:
        shape, kernels = case["shape"], case["providers"].get("kernels", {})
        if case["suite"] == "decode" and shape["batch"] * shape["seqlen_k"] >= 65536:
            pct = kernels.get("pct_of_copy_bandwidth", 0.0)
            found.append(
                {
                    "name": f"decode {case['label']}: kernels % of copy bandwidth >= "
                    f"{DECODE_BANDWIDTH_TARGET}",
                    "value": pct,
                    "met": pct >= DECODE_BANDWIDTH_TARGET,
                }
            )
        if case["suite"] == "prefill" and shape["seqlen_k"] == 8192:
            ratio = kernels.get("time_ratio_vs_baseline")
            speed = 1 / ratio if ratio else 0.0
            found.append(
                {
                    "name": f"prefill {case['label']}: kernels speed / SDPA flash speed >= "
                    f"{PREFILL_SPEED_TARGET}",
                    "value": speed,
                    "met": speed >= PREFILL_SPEED_TARGET,
                }
            )
    return found
