"""GPU training suite: ``kernels.flash_attn_func`` forward and backward against torch SDPA's flash
backend, on a CUDA device.

Usage: ``python -m benchmarks.gpu_training --out DIR [--quick]``; writes ``DIR/training.json`` and
``DIR/training.md`` (the table of :func:`benchmarks.record.markdown`) and prints the table. Without
a CUDA device, or under the Triton interpreter, it exits with a message and writes nothing. Stopped
by SIGTERM (``timeout`` in ``benchmarks/gpu_check.sh``), it writes the cases it finished.

Cases (:class:`benchmarks.training.TrainingProblem`): bf16, ``B = 1``, 32 query heads over 8 KV
heads, ``D = 128``, ``S = 1k / 4k / 8k`` (``--quick``: 1k only), causal and full. Each provider
times the step of :mod:`benchmarks.training` (forward, then ``torch.autograd.grad`` of the output;
every leaf made before the timer):

* ``kernels``: :func:`kernels.flash_attn_func`, FA3's signature on the Triton kernels;
* ``sdpa_flash`` (the baseline): ``F.scaled_dot_product_attention(..., enable_gqa=True)`` under
  ``SDPBackend.FLASH_ATTENTION`` (K/V heads repeated before the timer if that backend refuses GQA;
  ``setup`` says which).

Figures: **TFLOP/s** with FlashAttention's count of a forward and backward (3.5x the forward's
``4 · B · H · S² · D``, halved for causal: :func:`benchmarks.training.training_flops`), the time
ratio to the baseline, and ``max_abs_diff_vs_attn_ref``, the largest difference of ``out``, ``dq``,
``dk``, ``dv`` from :func:`attn_ref.flash_attn_func`'s step on the same inputs (fp32 math, bf16
results). Timing: :func:`benchmarks.gpu.cuda_time` on the eager step (``do_bench`` median, cold L2;
autograd is not captured in a CUDA graph), so host work is included for every provider alike.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from . import record, training
from .run import TimeLimit, _raise_time_limit
from .training import TrainingProblem

BASELINE = "sdpa_flash"
SEQLENS = (1024, 4096, 8192)
TIMING = (
    "benchmarks.gpu.cuda_time on the eager step (forward + torch.autograd.grad): do_bench median, "
    "L2 zeroed before each call"
)


def problems(quick: bool) -> list[TrainingProblem]:
    """bf16, GQA 32/8, d = 128; causal and full at each length (``quick``: 1k only)."""
    lengths = SEQLENS[:1] if quick else SEQLENS
    return [TrainingProblem(s, "bfloat16", causal) for s in lengths for causal in (True, False)]


def builders(
    problem: TrainingProblem, inputs: training.TrainingInputs
) -> dict[str, Callable[[], tuple[training.Step, str]]]:
    """The providers of a case, each built into ``(step, setup)`` when it is measured."""

    def kernels_step():
        import kernels

        return (
            training.flash_attn_step(kernels.flash_attn_func, inputs, problem.causal),
            f"out = kernels.flash_attn_func(q, k, v, causal={problem.causal}); "
            "torch.autograd.grad(out, (q, k, v), dout)",
        )

    def sdpa_flash_step():
        from torch.nn.attention import SDPBackend

        return training.sdpa_step(inputs, problem.causal, SDPBackend.FLASH_ATTENTION)

    return {"kernels": kernels_step, BASELINE: sdpa_flash_step}


def measure_training(problem: TrainingProblem, timer, ceilings: dict, device: str = "cuda") -> dict:
    """One case: every provider's step time, TFLOP/s, bytes/s and largest difference from the
    reference's step."""
    import attn_ref

    from . import gpu

    inputs = training.make_inputs(problem, device)
    reference = training.flash_attn_step(attn_ref.flash_attn_func, inputs, problem.causal)()
    providers = {}
    for name, build in builders(problem, inputs).items():
        try:
            step, setup = build()
            diff = training.max_difference(step(), reference)
            timing = timer(step, False)
        except Exception as exc:  # noqa: BLE001  (a provider that fails is a result to report)
            providers[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            continue
        t = timing["time_s"]
        providers[name] = {
            **timing,
            "setup": setup,
            "bytes_per_s": problem.bytes_moved() / t,
            "flop_per_s": problem.flops() / t,
            "max_abs_diff_vs_attn_ref": diff,
        }
    return gpu._case(
        problem.suite,
        problem.label,
        problem.shape(),
        problem.bytes_moved(),
        problem.flops(),
        providers,
        ceilings,
    )


def run(quick: bool, ceilings: dict, timer, device: str = "cuda") -> Iterator[dict]:
    """The case records, one at a time; a case that fails is recorded with its error."""
    from . import gpu

    for problem in problems(quick):
        try:
            yield measure_training(problem, timer, ceilings, device)
        except Exception as exc:  # noqa: BLE001  (keep the other cases: report this one's failure)
            yield gpu._failed_case(problem.suite, problem, exc, ceilings)
        if device == "cuda":
            torch.cuda.empty_cache()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_training", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for training.json and training.md"
    )
    parser.add_argument("--quick", action="store_true", help="S = 1k only")
    args = parser.parse_args(argv)
    why = record.gpu_refusal("benchmarks.gpu_training")
    if why is not None:
        sys.exit(why)
    from . import gpu

    signal.signal(signal.SIGTERM, _raise_time_limit)
    result = record.metadata("cuda", {"quick": args.quick, "timing": TIMING})
    result["ceilings"] = gpu.ceilings()
    result["cases"] = []
    start = time.perf_counter()
    try:
        for case in run(args.quick, result["ceilings"], gpu.cuda_time):
            result["cases"].append(case)
            print(f"[{time.perf_counter() - start:6.1f} s] {case['label']}", flush=True)
    except TimeLimit as stop:
        result["settings"]["stopped_early"] = str(stop)
    result["targets"] = []
    record.finish(result)
    print(record.text_table(result))
    print(record.provenance(result))
    args.out.mkdir(parents=True, exist_ok=True)
    record.write_json(result, args.out / "training.json")
    (args.out / "training.md").write_text(record.markdown(result))
    print(f"wrote {args.out / 'training.json'} and {args.out / 'training.md'}")
    return result


if __name__ == "__main__":
    main()
