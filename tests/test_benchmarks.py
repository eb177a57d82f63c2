"""The benchmark harness works, its result files are valid and its problems are tested
(``benchmarks/``).

These tests time nothing that is reported: the quick CPU run writes to a temporary folder, and the
GPU suite's case records are assembled on the CPU with a fixed fake timer (the Triton interpreter's
speed is not a benchmark). Every problem a suite times, scaled down, runs through both
implementations against the dense oracle: the benchmarks build their inputs with the tests' case
factory (:mod:`benchmarks.calls`), so a timed problem is a tested one.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

from benchmarks import cpu, gpu, memory
from benchmarks.problems import Problem, decode, make_inputs, prefill
from dense_oracle import assert_matches_oracle
from kvcache_cases import KERNELS, REF, over

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "benchmarks" / "schema.json").read_text())
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def validate(result: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(result)


def check_result_files(json_path: Path) -> dict:
    """The JSON validates, and its Markdown table and one PNG per suite sit beside it."""
    result = json.loads(json_path.read_text())
    validate(result)
    device = result["device"]
    markdown = (json_path.parent / f"{device}.md").read_text()
    assert result["command"] in markdown and result["date"] in markdown
    for suite in {case["suite"] for case in result["cases"]}:
        png = json_path.parent / f"{device}_{suite}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC, png
    return result


def test_quick_cpu_run_writes_valid_results(tmp_path):
    command = [
        sys.executable,
        "-m",
        "benchmarks.run",
        "--quick",
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = check_result_files(tmp_path / "cpu.json")
    assert "time / baseline" in done.stdout  # the printed table
    assert result["settings"]["quick"] is True and "stopped_early" not in result["settings"]
    assert {"python", "torch", "attn_ref_git"} <= result["versions"].keys()
    assert result["command"].endswith(
        "-m benchmarks.run --quick --device cpu --out " + str(tmp_path)
    )
    assert {case["suite"] for case in result["cases"]} == {"decode", "prefill", "training"}
    for case in result["cases"]:
        ref, sdpa = case["providers"]["attn_ref"], case["providers"][case["baseline"]]
        assert len(ref["times_s"]) == 3 and min(ref["times_s"]) <= ref["time_s"] <= max(
            ref["times_s"]
        )
        assert ref["time_ratio_vs_baseline"] == pytest.approx(ref["time_s"] / sdpa["time_s"])
        assert ref["bytes_per_s"] == pytest.approx(case["bytes"] / ref["time_s"])
        assert "enable_gqa=True" in sdpa["call"]  # the KV heads are not repeated
        baselines = [p for name, p in case["providers"].items() if name != "attn_ref"]
        assert sdpa["time_s"] == min(p["time_s"] for p in baselines)  # the fastest SDPA call
        assert all(p["max_abs_diff_vs_attn_ref"] < 1e-4 for p in baselines)  # same problem, fp32
        ragged = case["shape"].get("ragged", False)  # training cases: equal lengths
        assert ("attn_mask" in " ".join(p["call"] for p in baselines)) == ragged
    ratio_targets = [t for t in result["targets"] if t["name"].startswith(cpu.RATIO_SUITES)]
    assert len(ratio_targets) == len(result["cases"])


def test_committed_results_validate():
    committed = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    if not committed:
        pytest.skip("no results committed under benchmarks/results/ yet")
    for path in committed:
        result = check_result_files(path)
        assert result["settings"]["quick"] is False, (
            f"{path.name}: committed results must be a full run"
        )


def test_byte_and_flop_counts():
    # decode: K+V = b*sk*h_k*(d+dv)*2 bytes, q+out = b*h*(d+dv)*2, page table b*ceil(sk/64)*4 +
    # lengths b*4
    assert (
        decode(8, 8192).bytes_moved()
        == 8 * 8192 * 8 * 256 * 2 + 8 * 32 * 256 * 2 + 8 * 128 * 4 + 8 * 4
    )
    assert decode(8, 100).pages_per_sequence == 2
    # prefill: 2 matmuls x 2*sq*sk*d each, per head; causal counts half
    assert prefill(1, 4096).flops() == 4 * 32 * 4096 * 4096 * 128 // 2
    assert decode(2, 1000, dtype="float32").flops() == 4 * 2 * 32 * 1000 * 128


def test_gpu_case_records_validate_with_a_fake_timer():
    """The GPU suite's record assembly (inputs, providers, errors, ratios, % of copy bandwidth) on
    CPU."""
    fake = {"copy_bytes_per_s": 1e12, "matmul_bf16_flop_per_s": 1e15}

    def timer(fn, capture):
        return {"time_s": 2e-3 if capture else 4e-3, "method": "fake"}

    tiny = Problem("prefill", 2, 48, 48, heads_q=4, heads_kv=2, head_dim=32, page_size=16)
    case = gpu.measure_attention(tiny, timer, fake, device="cpu")
    combine = gpu.measure_combine(8, 4, 32, timer, fake, device="cpu")
    result = {
        "schema_version": 1,
        "device": "cuda",
        "date": "2026-01-01T00:00:00+00:00",
        "command": "python -m benchmarks.run --device cuda",
        "machine": {"summary": "x", "cpu": "x", "cpu_count": 1, "torch_threads": 1, "os": "x"},
        "versions": {"python": "3", "torch": "2", "attn_ref_git": "x"},
        "load": {"loadavg_1_5_15_start": [0, 0, 0], "loadavg_1_5_15_end": [0, 0, 0]},
        "settings": {"quick": True, "timing": "fake"},
        "ceilings": fake,
        "cases": [case, combine],
        "targets": gpu.targets([case, combine]),
    }
    validate(result)
    providers = case["providers"]
    assert {"kernels", "kernels_api", "sdpa_flash"} <= providers.keys()
    for name in ("kernels", "kernels_api", "sdpa_flash"):
        assert "error" not in providers[name], providers[name]
        assert providers[name]["max_abs_diff_vs_attn_ref"] < 0.1
    # timed eagerly: its validation syncs with the host
    assert providers["kernels_api"]["time_s"] == 4e-3
    assert providers["kernels"]["pct_of_copy_bandwidth"] == pytest.approx(
        100 * case["bytes"] / 2e-3 / 1e12
    )
    assert combine["bytes"] == 3 * 8 * 4 * 33 * 4
    assert combine["providers"]["kernels"]["max_abs_diff_vs_attn_ref"] < 1e-5


def test_targets_are_judged_from_the_measurements():
    def case(suite, batch, seqlen, kernels):
        return {
            "suite": suite,
            "label": "",
            "shape": {"batch": batch, "seqlen_k": seqlen},
            "providers": {"kernels": kernels, "attn_ref": kernels},
        }

    found = gpu.targets(
        [
            case("decode", 8, 8192, {"pct_of_copy_bandwidth": 71.0}),
            case("decode", 4, 32768, {"pct_of_copy_bandwidth": 69.0}),
            case("decode", 8, 1024, {"pct_of_copy_bandwidth": 10.0}),  # 8k tokens: no target
            case("prefill", 1, 8192, {"time_ratio_vs_baseline": 1.3}),  # 1 / 1.3 < 0.8
            case("decode", 1, 65536, {"error": "failed"}),
        ]
    )
    assert [t["met"] for t in found] == [True, False, False, False]
    assert cpu.targets(
        [
            case(
                "decode",
                8,
                32768,
                {"time_ratio_vs_baseline": 2.5, "input_bytes": 10, "peak_extra_bytes": 5},
            )
        ]
    ) == [
        {"name": "decode : attn_ref time / sdpa time <= 2.0", "value": 2.5, "met": False},
        {
            "name": "decode with a 32k context runs in memory (inputs + peak extra, bytes)",
            "value": 15,
            "met": True,
        },
    ]


def test_peak_memory_probe_sees_an_allocation():
    if memory.peak_extra_bytes(lambda: None) is None:
        pytest.skip(
            "/proc/self/clear_refs is not writable here: peak memory is reported as unavailable"
        )
    size = 64 * 1024 * 1024
    peak = memory.peak_extra_bytes(lambda: torch.ones(size, dtype=torch.uint8))
    assert size <= peak < size + 16 * 1024 * 1024


def timed_problems() -> dict:
    """Every problem the CPU and GPU suites time (full and quick runs), by id; the graph suite's are
    decode steps (``step-...``: :func:`benchmarks.gpu.decode_step`), True in the pair."""
    found = {}
    for quick in (False, True):
        for step, problems in (
            (False, cpu.problems(quick)),
            (False, gpu.problems(quick)),
            (True, gpu.graph_problems(quick)),
        ):
            for p in problems:
                step_name = "step-" if step else ""
                ragged = "-ragged" if p.ragged else ""
                found[f"{step_name}{p.suite}-b{p.batch}-sk{p.seqlen_k}{ragged}"] = (step, p)
    return found


def scaled_down(problem: Problem) -> Problem:
    """The problem at test size: 1/64 of the tokens, 1/8 of the heads (same GQA ratio), of the head
    dim and of the page size; batch, suite (decode, causal prefill) and dtype as they are."""
    return dataclasses.replace(
        problem,
        seqlen_q=-(-problem.seqlen_q // 64),
        seqlen_k=problem.seqlen_k // 64,
        heads_q=problem.heads_q // 8,
        heads_kv=problem.heads_kv // 8,
        head_dim=problem.head_dim // 8,
        page_size=problem.page_size // 8,
    )


@pytest.mark.parametrize("impl, timed", over([REF, KERNELS], timed_problems()))
def test_timed_problems_match_the_oracle(impl, timed):
    step, problem = timed
    inputs = make_inputs(scaled_down(problem), "cpu")
    assert_matches_oracle(impl.fn, gpu.decode_step(inputs) if step else inputs.kwargs())
