"""PNG figures of a result document, one per suite: ``<device>_<suite>.png``.

Each figure is a row of grouped bar charts (one group per case, one bar per provider) and carries
the machine, date, versions and command in its footer (:func:`benchmarks.record.provenance`).

* CPU: median time (log scale), time / the case's fastest SDPA call (with the 2x target), peak
  memory (inputs + extra).
* GPU: throughput (TB/s for decode and combine, with the measured copy bandwidth and 70 % of it;
  TFLOP/s for prefill) and median time.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from .cpu import RATIO_SUITES, RATIO_TARGET  # noqa: E402
from .record import provenance  # noqa: E402


def _panels(device: str, suite: str, ceilings: dict) -> list[dict]:
    """What each panel shows: a value extractor, a y label, a log flag and reference lines."""
    time_panel = {
        "value": lambda p: p["time_s"] * 1e3,
        "ylabel": "median time (ms)",
        "log": True,
        "lines": [],
    }
    if device == "cpu":
        ratio_lines = [(RATIO_TARGET, "target 2x")] if suite in RATIO_SUITES else []
        memory = {
            "value": lambda p: (p["input_bytes"] + (p["peak_extra_bytes"] or 0)) / 1e6,
            "ylabel": "inputs + peak extra (MB)",
            "log": True,
            "lines": [],
        }
        ratio = {
            "value": lambda p: p.get("time_ratio_vs_baseline"),
            "ylabel": "time / fastest SDPA call",
            "log": False,
            "lines": ratio_lines,
            "skip_baseline": True,
        }
        return [time_panel, ratio, memory]
    if suite == "prefill":
        throughput = {
            "value": lambda p: p["flop_per_s"] / 1e12,
            "ylabel": "TFLOP/s",
            "log": False,
            "lines": [],
        }
    else:
        copy = ceilings.get("copy_bytes_per_s")
        lines = [(copy / 1e12, "measured copy"), (0.7 * copy / 1e12, "70% of copy")] if copy else []
        throughput = {
            "value": lambda p: p["bytes_per_s"] / 1e12,
            "ylabel": "TB/s (logical bytes)",
            "log": False,
            "lines": lines,
        }
    return [throughput, time_panel]


def _case_order(case: dict) -> tuple:
    shape = case["shape"]
    return shape.get("seqlen_k", shape.get("rows", 0)), shape.get("batch", 0)


def caption(result: dict, suite: str, cases: list[dict]) -> str:
    """The figure's title: what is compared, on which shapes (those all the suite's cases share)."""
    shape = cases[0]["shape"] if cases else {}
    shared = {
        key: value
        for key, value in shape.items()
        if all(c["shape"].get(key) == value for c in cases)
    }
    what = ", ".join(
        f"{key}={shared[key]}"
        for key in ("batch", "heads_q", "heads_kv", "head_dim", "dtype", "causal")
        if key in shared
    )
    versus = (
        "attn_ref (PyTorch reference) vs the fastest SDPA call"
        if result["device"] == "cpu"
        else "Triton kernels vs SDPA"
    )
    return f"{result['device'].upper()} {suite}: {versus}" + (f"\n{what}" if what else "")


def plot_suite(result: dict, suite: str, path: Path) -> None:
    cases = sorted((c for c in result["cases"] if c["suite"] == suite), key=_case_order)
    providers = list(dict.fromkeys(name for c in cases for name in c["providers"]))
    panels = _panels(result["device"], suite, result.get("ceilings", {}))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6), squeeze=False)
    width = 0.8 / max(1, len(providers))
    for ax, panel in zip(axes[0], panels):
        for j, name in enumerate(providers):
            if panel.get("skip_baseline") and all(
                c["baseline"] == name for c in cases if name in c["providers"]
            ):
                continue
            xs, ys = [], []
            for i, case in enumerate(cases):
                p = case["providers"].get(name, {})
                value = None if "error" in p or not p else panel["value"](p)
                if value is not None:
                    xs.append(i + (j - (len(providers) - 1) / 2) * width)
                    ys.append(value)
            # one colour per provider in every panel
            ax.bar(xs, ys, width=width, label=name, color=f"C{j}")
        for y, text in panel["lines"]:
            ax.axhline(y, linestyle="--", color="gray", linewidth=1)
            ax.set_ylim(top=max(ax.get_ylim()[1], 1.15 * y))
            ax.annotate(text, (0, y), xycoords=("axes fraction", "data"), fontsize=7, va="bottom")
        ax.set_xticks(
            range(len(cases)), [c["label"] for c in cases], rotation=30, ha="right", fontsize=8
        )
        ax.set_ylabel(panel["ylabel"])
        if panel["log"]:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 5)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(caption(result, suite, cases))
    fig.text(0.01, 0.01, textwrap.fill(provenance(result), 180), fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(result: dict, out_dir: Path) -> list[Path]:
    paths = []
    for suite in dict.fromkeys(c["suite"] for c in result["cases"]):
        path = out_dir / f"{result['device']}_{suite}.png"
        plot_suite(result, suite, path)
        paths.append(path)
    return paths
