"""What every result file carries (machine, date, versions, command, load) and how it is written.

A result is one JSON document per device (``cpu.json`` / ``cuda.json``), described by
``benchmarks/schema.json``::

    {"schema_version", "device", "date", "command", "machine", "versions", "load", "settings",
     "ceilings", "cases": [case, ...], "targets": [{"name", "value", "met"}, ...]}

    case = {"suite", "label", "shape", "bytes", "flops", "baseline",
            "providers": {name: {"time_s", "bytes_per_s", "flop_per_s", "time_ratio_vs_baseline",
            ...}
                               | {"error": why it did not run}}}

Units are SI: seconds, bytes, bytes/s, FLOP/s (TB = 1e12, GB = 1e9, never powers of 1024).
The same document renders as the printed table and as ``<device>.md`` (:func:`markdown`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("schema.json")
REPO_ROOT = Path(__file__).resolve().parent.parent


def command_line() -> str:
    """The command that produced the results, as typed (interpreter shown by its file name)."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return shlex.join([Path(argv[0]).name, *argv[1:]])


def gpu_refusal(program: str) -> str | None:
    """Why this machine cannot run the GPU suite ``program`` (``benchmarks.gpu_backward``...): no
    CUDA device, or the Triton interpreter; None when it can."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return f"{program}: TRITON_INTERPRET=1 (interpreter timings are not benchmarks)"
    if not torch.cuda.is_available():
        return f"{program}: no CUDA device (interpreter timings are not benchmarks)"
    return None


def metadata(device: str, settings: dict) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        "machine": machine(device),
        "versions": versions(),
        "load": {"loadavg_1_5_15_start": list(os.getloadavg())},
        "settings": settings,
    }


def finish(result: dict) -> None:
    """Record the load at the end (other processes on a shared machine skew CPU timings)."""
    result["load"]["loadavg_1_5_15_end"] = list(os.getloadavg())


def machine(device: str) -> dict:
    info = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": _meminfo_bytes("MemTotal"),
        "os": platform.platform(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": props.name,
            "gpu_sms": props.multi_processor_count,
            "gpu_memory_bytes": props.total_memory,
            "gpu_l2_bytes": getattr(props, "L2_cache_size", None),
            "gpu_compute_capability": f"{props.major}.{props.minor}",
            "gpu_driver_and_clocks": _nvidia_smi_query(),
        }
        info["summary"] = f"{props.name} ({props.multi_processor_count} SMs)"
    else:
        info["summary"] = (
            f"{info['cpu']} ({info['cpu_count']} CPUs, {info['torch_threads']} torch threads)"
        )
    return info


def versions() -> dict:
    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for module in ("triton", "numpy", "matplotlib", "flash_attn", "flash_attn_interface"):
        try:
            found[module] = getattr(__import__(module), "__version__", "installed")
        except Exception:  # noqa: BLE001  (missing or broken: not part of this run)
            continue
    found["attn_ref_git"] = _git_describe()
    return found


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _meminfo_bytes(field: str):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _run(args: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20, cwd=REPO_ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _git_describe() -> str:
    """``git describe --always --dirty``; where the tree was copied without ``.git`` (a lent GPU
    machine), the caller's ``ATTN_REF_GIT`` environment variable."""
    return (
        _run(["git", "describe", "--always", "--dirty"])
        or os.environ.get("ATTN_REF_GIT")
        or "unknown (no git checkout, ATTN_REF_GIT unset)"
    )


def _nvidia_smi_query() -> str:
    fields = (
        "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"
    )
    return _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"]) or "nvidia-smi unavailable"


def write_json(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result, indent=1) + "\n")


# --- tables ---------------------------------------------------------------------------------------


def table_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per (case, provider)."""
    gpu = result["device"] == "cuda"
    unit, scale = ("TB/s", 1e12) if gpu else ("GB/s", 1e9)
    header = [
        "suite",
        "case",
        "provider",
        "time",
        f"{unit} (logical)",
        "TFLOP/s",
        "time / baseline",
        "% of copy BW" if gpu else "peak extra MB",
        "max abs diff vs attn_ref",
    ]
    header += ["roofline time"] if gpu else ["inputs MB", "load (1 min)"]
    rows = []
    for case in result["cases"]:
        for name, p in case["providers"].items():
            extra = _device_cells(gpu, case, p)
            if "error" in p:
                rows.append(
                    [
                        case["suite"],
                        case["label"],
                        name,
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        p["error"][:60],
                        *extra,
                    ]
                )
                continue
            last = p.get("pct_of_copy_bandwidth") if gpu else p.get("peak_extra_bytes")
            last = "-" if last is None else (f"{last:.1f}" if gpu else f"{last / 1e6:.1f}")
            diff, ratio = p.get("max_abs_diff_vs_attn_ref"), p.get("time_ratio_vs_baseline")
            rows.append(
                [
                    case["suite"],
                    case["label"],
                    name,
                    _duration(p["time_s"]),
                    f"{p['bytes_per_s'] / scale:.3g}",
                    f"{p['flop_per_s'] / 1e12:.3g}",
                    "-" if ratio is None else f"{ratio:.2f}",
                    last,
                    "-" if diff is None else f"{diff:.2e}",
                    *extra,
                ]
            )
    return header, rows


def _device_cells(gpu: bool, case: dict, provider: dict) -> list[str]:
    """GPU: the roofline time (bytes / copy bandwidth, or FLOPs / matmul rate if larger). CPU: what
    the provider is given (SDPA: dense K/V gathered before the timer) and the load after the
    case."""
    if gpu:
        return ["-" if case.get("ideal_time_s") is None else _duration(case["ideal_time_s"])]
    inputs = provider.get("input_bytes")
    return ["-" if inputs is None else f"{inputs / 1e6:.1f}", f"{case['loadavg_1min_after']:.1f}"]


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.3g} us"


def text_table(result: dict) -> str:
    header, rows = table_rows(result)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [
        f"target: {t['name']}: {t['value']:.4g} -> {'met' if t['met'] else 'NOT met'}"
        for t in result["targets"]
    ]
    return "\n".join(lines)


def calls(result: dict) -> list[str]:
    """Markdown lines: the exact call each provider times, once per (suite, kind of case,
    provider)."""
    found = {}
    for case in result["cases"]:
        kind = case["suite"] + (" (ragged lengths)" if case["shape"].get("ragged") else "")
        for name, p in case["providers"].items():
            if "call" in p:
                found.setdefault((kind, name), p["call"])
    return [f"- {kind}, `{name}`: `{call}`" for (kind, name), call in found.items()]


def provenance(result: dict) -> str:
    """One line: machine, date, versions, command (printed on every figure and table)."""
    v = result["versions"]
    return (
        f"{result['machine']['summary']} | {result['date']} | torch {v['torch']}, "
        f"triton {v.get('triton', '-')}, attn_ref {v['attn_ref_git']} | {result['command']}"
    )


def _loads(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def markdown(result: dict) -> str:
    header, rows = table_rows(result)
    load = result["load"]
    lines = [
        f"Machine: {result['machine']['summary']}. Date: {result['date']}. "
        f"Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v) + ".",
        "",
        f"Command: `{result['command']}`. Load average (1, 5, 15 min) at start "
        f"{_loads(load['loadavg_1_5_15_start'])}, at end {_loads(load['loadavg_1_5_15_end'])}"
        + (
            f". Stopped early: {result['settings']['stopped_early']}."
            if "stopped_early" in result["settings"]
            else "."
        ),
        "",
        *(
            [
                "Calls timed (inputs made before the timer; a case's baseline is its fastest SDPA "
                "call):",
                "",
                *calls(result),
                "",
            ]
            if calls(result)
            else []
        ),
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        *(
            f"- {t['name']}: {t['value']:.4g}, **{'met' if t['met'] else 'not met'}**"
            for t in result["targets"]
        ),
        "",
    ]
    return "\n".join(lines)
