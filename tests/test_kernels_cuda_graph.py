"""The public kernel call in a CUDA graph: the GPU check, and its record assembly on the CPU.

On a GPU (``benchmarks/gpu_check.sh`` runs this file with the other kernel tests): a decode step of
``kernels.flash_attn_with_kvcache`` (one token appended per sequence, paged cache) is captured in a
``torch.cuda.CUDAGraph`` and replayed with new tokens and moved ``cache_seqlens``; every replay must
equal the eager call (value checks on) exactly, caches included
(:func:`benchmarks.gpu.replay_difference`).

Everywhere (the CPU's interpreter, or the GPU): the graph suite's case record
(:func:`benchmarks.gpu.measure_graph_step`) is assembled with a fake timer and a stand-in for the
capture (the call inside ``kernels.no_host_checks()``, as it runs under capture) on a tiny problem,
and validates against ``benchmarks/schema.json``.
"""

import json
from pathlib import Path

import jsonschema
import pytest
import torch

import kernels
from benchmarks import gpu
from benchmarks.problems import Problem, decode, make_inputs

SCHEMA = json.loads(
    (Path(__file__).resolve().parent.parent / "benchmarks" / "schema.json").read_text()
)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graph capture)"
)
@pytest.mark.parametrize("batch", [1, 8])
def test_captured_decode_step_replays_like_eager_calls(batch):
    step = gpu.decode_step(make_inputs(decode(batch, 1024), "cuda"))
    assert gpu.replay_difference(step, gpu.cuda_graph_replay) == 0


def stand_in_capture(fn):
    """What capture changes for the call, on the CPU: the warm-up call, then replays without value
    checks."""
    fn()

    def replay():
        with kernels.no_host_checks():
            fn()

    return replay


def test_graph_suite_record_on_cpu():
    def timer(fn, capture):
        return {"time_s": 1e-3 if capture else 3e-3, "method": "fake"}

    tiny = Problem("decode", 2, 1, 40, heads_q=4, heads_kv=2, head_dim=32, page_size=16)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = gpu.measure_graph_step(
        tiny, timer, {"copy_bytes_per_s": 1e12}, device=device, capture=stand_in_capture
    )
    jsonschema.Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/case"}).validate(
        case
    )
    providers = case["providers"]
    assert case["suite"] == "graph" and case["baseline"] == "kernels_api"
    for name in ("kernels", "kernels_api", "kernels_unchecked"):
        assert "error" not in providers[name], providers[name]
        assert providers[name]["max_abs_diff_vs_attn_ref"] < 0.05
    assert "replays" in providers["kernels"]["setup"]
    assert providers["kernels"]["time_ratio_vs_baseline"] == pytest.approx(1 / 3)
    assert providers["kernels_unchecked"]["time_s"] == 3e-3  # eager
