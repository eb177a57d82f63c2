"""Build the tutorial notebooks: ``tutorials_src/*.py`` -> executed ``docs/tutorials/*.ipynb``.

Each tutorial is written as a plain Python file in jupytext's *percent* format (``# %%`` starts a
code cell, ``# %% [markdown]`` a prose cell whose lines are ``# ``-commented Markdown), so it is
reviewed and diffed as code. This script turns each source into a notebook, executes it top to
bottom in a fresh ``python3`` kernel (nbclient; the working directory is the repository root) and
stores it **with its outputs**, so the docs site renders it without executing anything.

Usage::

    .venv/bin/python scripts/build_notebooks.py          # every tutorial
    .venv/bin/python scripts/build_notebooks.py 04 05    # the tutorials whose file name contains 04
    or 05

It prints the execution time of each notebook and stores it in the notebook's metadata
(``metadata.attn_ref``: :func:`run_record`), which the docs site shows next to the download links.
``tests/test_notebooks.py`` checks that the stored notebooks match their sources and re-executes
them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIR = ROOT / "tutorials_src"
NOTEBOOK_DIR = ROOT / "docs" / "tutorials"
#: Longest a single cell may run (seconds) before the execution counts as failed.
CELL_TIMEOUT_S = 180
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def tutorial_sources() -> list[Path]:
    """Every tutorial source, in reading order (file names start with their number)."""
    return sorted(SOURCE_DIR.glob("[0-9][0-9]_*.py"))


def notebook_path(source: Path) -> Path:
    """Where the executed notebook of ``source`` is stored."""
    return NOTEBOOK_DIR / f"{source.stem}.ipynb"


def load_source(source: Path) -> nbformat.NotebookNode:
    """The unexecuted notebook of a percent-format source, with stable cell ids and metadata."""
    nb = jupytext.read(source, fmt="py:percent")
    nb.metadata = nbformat.from_dict(
        {
            "kernelspec": KERNELSPEC,
            "language_info": {"name": "python"},
        }
    )
    for index, cell in enumerate(nb.cells):
        cell.id = f"cell-{index:02d}"
        cell.metadata.pop("lines_to_next_cell", None)
    return nb


def execute(nb: nbformat.NotebookNode) -> float:
    """Run every cell of ``nb`` in place (outputs stored in it); returns the wall time in seconds.

    Raises ``nbclient.exceptions.CellExecutionError`` on the first cell that fails and
    ``nbclient.exceptions.CellTimeoutError`` on a cell that runs past :data:`CELL_TIMEOUT_S`.
    """
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(ROOT)}},
    )
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def coalesce_streams(nb: nbformat.NotebookNode) -> None:
    """Join consecutive stdout (or stderr) outputs of a cell into one, so rebuilds diff cleanly.

    How a cell's prints are chunked into outputs depends on timing; the joined text does not.
    """
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        joined = []
        for output in cell.outputs:
            previous = joined[-1] if joined else None
            if (
                output.output_type == "stream"
                and previous is not None
                and previous.output_type == "stream"
                and previous.name == output.name
            ):
                previous.text += output.text
            else:
                joined.append(output)
        cell.outputs = joined


def run_record(seconds: float) -> dict:
    """``metadata.attn_ref`` of an executed notebook: its measured run time and on how many CPU
    cores."""
    return {"run_seconds": round(seconds, 1), "cpu_count": os.cpu_count()}


def build(source: Path) -> float:
    """Execute the tutorial ``source`` and store its notebook; returns the execution time."""
    nb = load_source(source)
    seconds = execute(nb)
    coalesce_streams(nb)
    nb.metadata["attn_ref"] = run_record(seconds)
    NOTEBOOK_DIR.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, notebook_path(source))
    return seconds


def main(patterns: list[str]) -> None:
    chosen = [s for s in tutorial_sources() if not patterns or any(p in s.name for p in patterns)]
    total = 0.0
    for source in chosen:
        seconds = build(source)
        total += seconds
        print(f"{notebook_path(source).relative_to(ROOT)}: executed in {seconds:.1f} s", flush=True)
    print(f"{len(chosen)} notebook(s), {total:.1f} s in all")


if __name__ == "__main__":
    main(sys.argv[1:])
