"""GPU backward suite: ``kernels.attention_backward`` against torch SDPA's backward, on a CUDA
device.

Usage: ``python -m benchmarks.gpu_backward --out DIR [--quick]``; writes ``DIR/backward.json`` and
``DIR/backward.md`` (the table of :func:`benchmarks.record.markdown`) and prints the table. Without
a CUDA device, or under the Triton interpreter, it exits with a message and writes nothing.

Cases: bf16, ``B = 1``, ``H = 32`` query heads sharing ``Hkv = 8`` KV heads, ``D = 128``,
``S = 1k / 4k / 8k`` (``--quick``: 1k only), causal and full. Figures:

* **TFLOP/s** with FlashAttention's count for the backward, 2.5x the forward's
  ``4 · B · H · Sq · Sk · D`` (five matmuls of ``2 · Sq · Sk · D`` against the forward's two),
  halved for causal: :func:`backward_flops`.
* **bytes** (logical, for the roofline column): q, out, dO and dq (``B · S · H · D`` each), k, v,
  dk, dv (``B · S · Hkv · D`` each) at 2 bytes, and the fp32 LSE.

Providers see the same logical problem and time the backward alone (the forward runs once, before):

* ``kernels``: :func:`kernels.attention_backward` from the forward's saved ``out`` and ``lse`` (what
  the Triton kernels' ``flash_attn_with_kvcache(..., return_softmax_lse=True)`` returns), fp32
  accumulation, gradients returned in bf16;
* ``sdpa_flash`` (the baseline): ``torch.autograd.grad`` through ``F.scaled_dot_product_attention``
  run under ``SDPBackend.FLASH_ATTENTION`` with ``enable_gqa=True``; if that backend refuses GQA, on
  K/V with the KV heads repeated ahead of time, the timed call then including the sum of
  ``dk``/``dv`` over each group (``setup`` says which).

Timing is :func:`benchmarks.gpu.cuda_time` (CUDA graph replay, ``do_bench`` median, cold L2; eager
if the call cannot be captured, and ``method`` says which). ``max_abs_diff_vs_attn_ref`` is the
largest difference of ``dq``, ``dk``, ``dv`` from :func:`attn_ref.attention_backward` (fp32 math) on
the same saved state.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from . import record

SUITE = "backward"
BASELINE = "sdpa_flash"
SEQLENS = (1024, 4096, 8192)
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
TIMING = (
    "benchmarks.gpu.cuda_time: CUDA graph replay (or eager) timed by do_bench median, "
    "L2 zeroed before each call"
)

Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # dq [B, S, H, D], dk, dv [B, S, Hkv, D]


@dataclass(frozen=True)
class BackwardProblem:
    """One backward case: ``q [B, S, H, D]``, ``k, v [B, S, Hkv, D]``, bf16."""

    seqlen: int
    causal: bool
    batch: int = 1
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    head_dim: int = HEAD_DIM

    @property
    def label(self) -> str:
        return f"S={self.seqlen} {'causal' if self.causal else 'full'}"

    def shape(self) -> dict:
        return {
            "batch": self.batch,
            "seqlen": self.seqlen,
            "heads_q": self.heads,
            "heads_kv": self.kv_heads,
            "head_dim": self.head_dim,
            "causal": self.causal,
            "dtype": "bfloat16",
        }

    def flops(self) -> int:
        return backward_flops(
            self.batch, self.heads, self.seqlen, self.seqlen, self.head_dim, self.causal
        )

    def bytes_moved(self) -> int:
        """q, out, dO, dq and k, v, dk, dv at 2 bytes, and the fp32 LSE (see the module
        docstring)."""
        b, s, d = self.batch, self.seqlen, self.head_dim
        return 2 * 4 * b * s * (self.heads + self.kv_heads) * d + 4 * b * s * self.heads


def backward_flops(
    batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool
) -> int:
    """FlashAttention's backward count: ``2.5 · 4 · B · H · Sq · Sk · D``, halved for causal."""
    flops = 10 * batch * heads * seqlen_q * seqlen_k * head_dim  # 2.5 · 4 = 10
    return flops // 2 if causal else flops


def problems(quick: bool) -> list[BackwardProblem]:
    """bf16, GQA 32/8, d = 128; causal and full at each length (``quick``: 1k only)."""
    lengths = SEQLENS[:1] if quick else SEQLENS
    return [BackwardProblem(s, causal) for s in lengths for causal in (True, False)]


@dataclass
class SavedForward:
    """The inputs, the forward's saved state and the upstream gradient of one problem."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor  # [B, S, H, D] bf16
    lse: torch.Tensor  # [B, H, S] fp32, as the forward returns it
    dout: torch.Tensor
    scale: float


def make_saved_forward(problem: BackwardProblem, device: str, seed: int = 0) -> SavedForward:
    """Random bf16 inputs and upstream gradient, and the Triton forward's ``out`` and ``lse``."""
    import kernels

    gen = torch.Generator(device=device).manual_seed(seed)
    b, s, d = problem.batch, problem.seqlen, problem.head_dim

    def randn(heads: int) -> torch.Tensor:
        return torch.randn(b, s, heads, d, generator=gen, device=device).to(torch.bfloat16)

    q, k, v, dout = (
        randn(problem.heads),
        randn(problem.kv_heads),
        randn(problem.kv_heads),
        randn(problem.heads),
    )
    scale = d**-0.5
    out, lse, *_ = kernels.flash_attn_with_kvcache(
        q, k, v, softmax_scale=scale, causal=problem.causal, return_softmax_lse=True
    )
    return SavedForward(q, k, v, out, lse, dout, scale)


Builder = Callable[[], tuple[Callable[[], Grads], str]]


def kernels_call(problem: BackwardProblem, saved: SavedForward) -> tuple[Callable[[], Grads], str]:
    """``kernels.attention_backward`` from the saved ``out`` and ``lse``."""
    import kernels
    from attn_ref import AttentionMask

    s = saved
    mask = AttentionMask(causal=problem.causal)
    return (
        lambda: kernels.attention_backward(s.dout, s.q, s.k, s.v, s.out, s.lse, s.scale, mask),
        "kernels.attention_backward: preprocess + dK/dV + dQ kernels, fp32 accumulation, bf16 "
        "gradients",
    )


def sdpa_flash_call(
    problem: BackwardProblem, saved: SavedForward
) -> tuple[Callable[[], Grads], str]:
    """``torch.autograd.grad`` through SDPA's flash backend (forward run once, graph retained)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # [B, H, S, D]
    q, k, v = (x.transpose(1, 2).detach().requires_grad_() for x in (saved.q, saved.k, saved.v))
    dout = saved.dout.transpose(1, 2)
    group = problem.heads // problem.kv_heads
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal, enable_gqa=True)
        setup, leaves = (
            "flash backend, enable_gqa=True, torch.autograd.grad of the retained graph",
            (q, k, v),
        )
    except RuntimeError:
        k, v = (x.detach().repeat_interleave(group, dim=1).requires_grad_() for x in (k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal)
        setup, leaves = (
            (
                "flash backend refused enable_gqa: K/V with the KV heads repeated, the group sum "
                "of dk/dv timed with the backward"
            ),
            (q, k, v),
        )

    def backward() -> Grads:
        dq, dk, dv = torch.autograd.grad(out, leaves, dout, retain_graph=True)
        if dk.shape[1] != problem.kv_heads:  # repeated KV heads: sum the gradients of each group
            dk, dv = (x.unflatten(1, (problem.kv_heads, group)).sum(2) for x in (dk, dv))
        return tuple(x.transpose(1, 2) for x in (dq, dk, dv))

    return backward, setup


def builders(problem: BackwardProblem, saved: SavedForward) -> dict[str, Builder]:
    return {
        "kernels": lambda: kernels_call(problem, saved),
        BASELINE: lambda: sdpa_flash_call(problem, saved),
    }


def measure_backward(problem: BackwardProblem, timer, ceilings: dict, device: str = "cuda") -> dict:
    """One case: every provider's backward time, TFLOP/s, bytes/s and largest gradient
    difference."""
    from . import gpu

    saved = make_saved_forward(problem, device)
    reference = attn_ref_grads(problem, saved)
    providers = {}
    for name, build in builders(problem, saved).items():
        try:
            fn, setup = build()
            diff = max((g.float() - r).abs().max().item() for g, r in zip(fn(), reference))
            timing = timer(fn, True)
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
        if "copy_bytes_per_s" in ceilings:
            providers[name]["pct_of_copy_bandwidth"] = (
                100 * providers[name]["bytes_per_s"] / ceilings["copy_bytes_per_s"]
            )
    return gpu._case(
        SUITE,
        problem.label,
        problem.shape(),
        problem.bytes_moved(),
        problem.flops(),
        providers,
        ceilings,
    )


def attn_ref_grads(problem: BackwardProblem, saved: SavedForward) -> Grads:
    """fp32 ``(dq, dk, dv)`` of :func:`attn_ref.attention_backward` on the saved state."""
    import attn_ref

    s = saved
    return attn_ref.attention_backward(
        s.dout,
        s.q,
        s.k,
        s.v,
        s.out,
        s.lse,
        s.scale,
        attn_ref.AttentionMask(causal=problem.causal),
        grad_dtype=torch.float32,
    )


def run(quick: bool, ceilings: dict, timer, device: str = "cuda") -> Iterator[dict]:
    """The case records, one at a time; a case that fails is recorded with its error."""
    from . import gpu

    for problem in problems(quick):
        try:
            yield measure_backward(problem, timer, ceilings, device)
        except Exception as exc:  # noqa: BLE001  (keep the other cases: report this one's failure)
            yield gpu._failed_case(SUITE, problem, exc, ceilings)
        if device == "cuda":
            torch.cuda.empty_cache()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_backward", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for backward.json and backward.md"
    )
    parser.add_argument("--quick", action="store_true", help="S = 1k only")
    args = parser.parse_args(argv)
    why = record.gpu_refusal("benchmarks.gpu_backward")
    if why is not None:
        sys.exit(why)
    from . import gpu

    result = record.metadata("cuda", {"quick": args.quick, "timing": TIMING})
    result["ceilings"] = gpu.ceilings()
    result["cases"] = []
    start = time.perf_counter()
    for case in run(args.quick, result["ceilings"], gpu.cuda_time):
        result["cases"].append(case)
        print(f"[{time.perf_counter() - start:6.1f} s] {case['suite']} {case['label']}", flush=True)
    result["targets"] = []
    record.finish(result)
    print(record.text_table(result))
    print(record.provenance(result))
    args.out.mkdir(parents=True, exist_ok=True)
    record.write_json(result, args.out / "backward.json")
    (args.out / "backward.md").write_text(record.markdown(result))
    print(f"wrote {args.out / 'backward.json'} and {args.out / 'backward.md'}")
    return result


if __name__ == "__main__":
    main()
