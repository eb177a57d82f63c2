"""The GPU backward benchmark (``benchmarks/gpu_backward.py``): its counts, its refusal without
CUDA, and its case records assembled on the CPU with a fixed fake timer (nothing here is a
timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from benchmarks import gpu_backward

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "benchmarks" / "schema.json").read_text())


def test_flop_and_byte_counts():
    # FlashAttention's backward count: 2.5 x the forward's 4·B·H·Sq·Sk·D, halved for causal
    assert (
        gpu_backward.backward_flops(1, 32, 8192, 8192, 128, causal=False)
        == 10 * 32 * 8192 * 8192 * 128
    )
    assert gpu_backward.backward_flops(2, 4, 100, 60, 64, causal=True) == 5 * 2 * 4 * 100 * 60 * 64
    case = gpu_backward.BackwardProblem(1024, causal=True)
    # q, out, dO, dq [1, S, 32, 128] and k, v, dk, dv [1, S, 8, 128] in bf16, plus the fp32 LSE
    assert case.bytes_moved() == 2 * 1024 * 128 * (4 * 32 + 4 * 8) + 4 * 1024 * 32
    assert [p.label for p in gpu_backward.problems(quick=False)] == [
        f"S={s} {mask}" for s in (1024, 4096, 8192) for mask in ("causal", "full")
    ]


def test_refuses_cleanly_without_cuda(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA device, even on a GPU machine
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_backward", "--out", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "benchmarks.gpu_backward:" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_case_records_with_a_fake_timer():
    """Inputs, both providers, gradient differences and TFLOP/s of a tiny case on the CPU."""
    fake = {"copy_bytes_per_s": 1e12, "matmul_bf16_flop_per_s": 1e15}
    tiny = gpu_backward.BackwardProblem(64, causal=True, heads=4, kv_heads=2, head_dim=32)
    case = gpu_backward.measure_backward(
        tiny, lambda fn, capture: {"time_s": 1e-3, "method": "fake"}, fake, device="cpu"
    )
    assert (
        case["suite"] == "backward"
        and case["baseline"] == "sdpa_flash"
        and case["flops"] == tiny.flops()
    )
    for name in ("kernels", "sdpa_flash"):
        provider = case["providers"][name]
        assert "error" not in provider, provider
        assert provider["flop_per_s"] == pytest.approx(tiny.flops() / 1e-3)
        assert provider["max_abs_diff_vs_attn_ref"] < 0.05  # bf16 gradients of the same saved state
    # the record has the layout of every other suite's cases (benchmarks/schema.json)
    jsonschema.Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/case"}).validate(
        case
    )
