"""MkDocs hook: the "Benchmarks" page, generated from the committed results in
``benchmarks/results/``.

For each device that has results (``<device>.json``, written by ``python -m benchmarks.run``), the
page shows the run's provenance, the exact calls timed, the table of
:func:`benchmarks.record.table_rows` (the harness's own rows, so the page and the printed table
agree), the targets, the notes written on the run (``<device>_notes.md``, if any) and every
``<device>_<suite>.png`` plot. A device without results gets a warning that says so, first on the
page, instead of a description of figures that are not there. The page and the plots are
``File.generated`` (nothing is written into ``docs/``); without any result file there is no page and
no nav entry.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mkdocs.structure.files import File

SECTION = "Benchmarks"
AFTER = "Side by side"
DEVICES = {"cuda": "GPU: Triton kernels", "cpu": "CPU: the PyTorch reference"}
INTRO = """---
hide: [navigation]
---

# Benchmarks

Measured results, committed with the code that produced them. Every table states the machine, the
date, the versions and the command; rerun it with `python -m benchmarks.run --device cpu` (or
`--device cuda` on a GPU) from the repository root. Timings of the Triton interpreter are not
benchmarks and are never reported.
"""
#: What each device's results compare, said only when they exist.
MEASURES = {
    "cuda": "The Triton kernels against PyTorch's `scaled_dot_product_attention` on the same "
    "problems (decode bandwidth, prefill FLOP/s, the combine kernel).",
    "cpu": "The PyTorch reference against `scaled_dot_product_attention` at its best on the same "
    "problems (K/V gathered before the timer, `enable_gqa=True`, no mask unless lengths are "
    "ragged), and a training step (`attn_ref.flash_attn_func` forward and backward against SDPA's "
    "with `is_causal=True, enable_gqa=True`, every leaf made before the timer): time ratio and "
    "peak memory.",
}


#: What is missing for a device without committed results.
MISSING = {
    "cuda": ("GPU", "timings of the Triton kernels and no comparison with SDPA on a GPU"),
    "cpu": ("CPU", "timings of the PyTorch reference and no comparison with SDPA on a CPU"),
}


def missing_section(device: str) -> list[str]:
    """What the page says for a device without committed results: plainly, that there are none."""
    label, what = MISSING[device]
    return [
        f"## {DEVICES[device]}",
        "",
        f'!!! warning "No {label} figures yet"',
        "",
        f"    No {label} run is committed (`benchmarks/results/{device}.json` does not exist), "
        "so this "
        f"page has no {what}. `python -m benchmarks.run --device {device}` on a {label} machine "
        "makes them.",
        "",
    ]


def _results(config) -> Path:
    return Path(config["config_file_path"]).parent / "benchmarks" / "results"


def _devices(config) -> list[str]:
    return [d for d in DEVICES if (_results(config) / f"{d}.json").is_file()]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def result_section(result: dict) -> list[str]:
    """Provenance, table and targets of one result document, as markdown lines."""
    from benchmarks import record

    header, rows = record.table_rows(result)
    lines = [
        f"Measured on {result['machine']['summary']}, {result['date']}, with "
        f"`{result['command']}`.",
        "",
    ]
    lines += [
        "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v) + ".",
        "",
    ]
    if record.calls(result):
        lines += [
            "Calls timed (inputs made before the timer; a case's baseline is its fastest SDPA "
            "call):",
            "",
        ]
        lines += record.calls(result) + [""]
    lines += ["| " + " | ".join(map(_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in rows] + [""]
    lines += [
        f"* {t['name']}: {t['value']:.4g}, **{'met' if t['met'] else 'not met'}**"
        for t in result["targets"]
    ]
    return lines + [""]


def page(config) -> tuple[str, dict[str, bytes]]:
    """The page's markdown and its images ``{name: bytes}``."""
    root = str(Path(config["config_file_path"]).parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    results, lines, images = _results(config), [INTRO], {}
    present = _devices(config)
    for device in [d for d in DEVICES if d not in present]:
        lines += missing_section(device)
    for device in present:
        result = json.loads((results / f"{device}.json").read_text(encoding="utf-8"))
        lines += [f"## {DEVICES[device]}", "", MEASURES[device], ""] + result_section(result)
        notes = results / f"{device}_notes.md"  # what the measurements say, written after the run
        if notes.is_file():
            lines += [notes.read_text(encoding="utf-8"), ""]
        for plot in sorted(results.glob(f"{device}_*.png")):
            suite = plot.stem.removeprefix(f"{device}_").replace("_", " ")
            images[plot.name] = plot.read_bytes()
            lines += [f"![{DEVICES[device]}, {suite}]({plot.name})", ""]
    return "\n".join(lines), images


def on_config(config):
    nav = [item for item in config["nav"] if SECTION not in item]
    if _devices(config):
        at = next(
            (n + 1 for n, item in enumerate(nav) if AFTER in item),
            next((n + 1 for n, item in enumerate(nav) if "Side by side" in item), len(nav)),
        )
        nav.insert(at, {SECTION: "benchmarks/index.md"})
    config["nav"] = nav
    return config


def on_files(files, config):
    if not _devices(config):
        return files
    markdown, images = page(config)
    files.append(File.generated(config, "benchmarks/index.md", content=markdown))
    for name, content in images.items():
        files.append(File.generated(config, f"benchmarks/{name}", content=content))
    return files
