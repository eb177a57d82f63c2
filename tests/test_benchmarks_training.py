"""The training benchmark (``benchmarks/training.py``, its CPU cases in ``benchmarks/cpu.py`` and
its GPU script ``benchmarks/gpu_training.py``) and the GPU check script that runs it: counts, the
steps' agreement, the GPU script's refusal without CUDA and its case records assembled on the CPU
with a fixed fake timer (nothing here is a timing)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
import torch.nn.functional as F

import attn_ref
from benchmarks import cpu, gpu_training, training
from benchmarks.training import TrainingProblem

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "benchmarks" / "schema.json").read_text())
GPU_CHECK = ROOT / "benchmarks" / "gpu_check.sh"


def test_flop_and_byte_counts():
    # FlashAttention's fwd + bwd count: 3.5 x the forward's 4·B·H·Sq·Sk·D, halved for causal
    assert training.training_flops(1, 32, 4096, 4096, 128, causal=False) == (
        14 * 32 * 4096 * 4096 * 128
    )
    assert training.training_flops(2, 4, 100, 60, 64, causal=True) == 7 * 2 * 4 * 100 * 60 * 64
    problem = TrainingProblem(2048)
    assert problem.flops() == 7 * 32 * 2048 * 2048 * 128
    # q, out, dout, dq [1, S, 32, 128] and k, v, dk, dv [1, S, 8, 128] in fp32, plus the fp32 LSE
    assert problem.bytes_moved() == 4 * 2048 * 128 * (4 * 32 + 4 * 8) + 4 * 2048 * 32
    assert TrainingProblem(1024, "bfloat16").bytes_moved() == (
        2 * 1024 * 128 * (4 * 32 + 4 * 8) + 4 * 1024 * 32
    )
    assert [p.label for p in cpu.training_problems(quick=False)] == [
        "b=1 s=2048 causal",
        "b=1 s=4096 causal",
    ]
    assert [p.label for p in gpu_training.problems(quick=False)] == [
        f"b=1 s={s} {mask}" for s in (1024, 4096, 8192) for mask in ("causal", "full")
    ]


def _tiny(causal=True, dtype="float32") -> TrainingProblem:
    return TrainingProblem(48, dtype, causal, batch=2, heads_q=4, heads_kv=2, head_dim=32)


@pytest.mark.parametrize("causal", [True, False])
def test_the_steps_compute_the_same_gradients(causal):
    """The reference's step and SDPA's (``enable_gqa``, and the repeated-heads fallback taken when
    a backend refuses GQA) return the same ``out, dq, dk, dv`` in one layout; the inputs are not
    modified."""
    inputs = training.make_inputs(_tiny(causal), "cpu")
    before = [x.clone() for x in (inputs.q, inputs.k, inputs.v, inputs.dout)]
    reference = training.flash_attn_step(attn_ref.flash_attn_func, inputs, causal)()
    step, call = training.sdpa_step(inputs, causal)
    assert "enable_gqa=True" in call
    assert training.max_difference(step(), reference) < 1e-5
    assert [g.shape for g in step()] == [x.shape for x in (inputs.q, inputs.q, inputs.k, inputs.v)]

    sdpa = F.scaled_dot_product_attention

    def refuses_gqa(*args, enable_gqa=False, **kwargs):
        if enable_gqa:
            raise RuntimeError("no GQA here")
        return sdpa(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training.F, "scaled_dot_product_attention", refuses_gqa)
        step, call = training.sdpa_step(inputs, causal)
        assert "heads repeated" in call
        assert training.max_difference(step(), reference) < 1e-5
    after = (inputs.q, inputs.k, inputs.v, inputs.dout)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_gpu_training_refuses_cleanly_without_cuda(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA device, even on a GPU machine
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_training", "--out", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "benchmarks.gpu_training:" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_gpu_case_records_with_a_fake_timer():
    """Inputs, both providers, differences and TFLOP/s of a tiny bf16 case on the CPU (the Triton
    interpreter runs the kernels). Until ``kernels.flash_attn_func`` exists, its provider records
    that error instead, and the record still validates."""
    import kernels

    tiny = _tiny(dtype="bfloat16")
    case = gpu_training.measure_training(
        tiny, lambda fn, capture: {"time_s": 1e-3, "method": "fake"}, {}, device="cpu"
    )
    assert case["suite"] == "training" and case["baseline"] == "sdpa_flash"
    assert case["flops"] == tiny.flops() and case["bytes"] == tiny.bytes_moved()
    sdpa = case["providers"]["sdpa_flash"]
    assert "error" not in sdpa, sdpa
    assert sdpa["flop_per_s"] == pytest.approx(tiny.flops() / 1e-3)
    assert sdpa["max_abs_diff_vs_attn_ref"] < 0.05  # bf16 results of the same step
    provider = case["providers"]["kernels"]
    if hasattr(kernels, "flash_attn_func"):
        assert "error" not in provider, provider
        assert provider["max_abs_diff_vs_attn_ref"] < 0.05
    else:
        assert "flash_attn_func" in provider["error"]
    jsonschema.Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/case"}).validate(
        case
    )


def test_gpu_check_script_parses_and_runs_modules_that_exist():
    """``bash -n`` accepts the script, every ``python -m benchmarks.X`` it runs imports, and the
    limits of its steps add up to the total its header states."""
    done = subprocess.run(["bash", "-n", str(GPU_CHECK)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = GPU_CHECK.read_text()
    modules = re.findall(r'"\$py" -m (benchmarks\.\w+)', text)
    assert {"benchmarks.run", "benchmarks.gpu_backward", "benchmarks.gpu_training"} <= set(modules)
    for module in modules:
        assert callable(importlib.import_module(module).main), module
    limits = [int(n) for n in re.findall(r"^step [\w-]+ (\d+) ", text, flags=re.M)]
    (stated,) = re.findall(r"the limits add up to (\d+) s", text)
    assert sum(limits) == int(stated)
