"""``docs/contributing.md`` names real files: its recipes list every file a change touches.

A recipe that names a file which is not there (moved, renamed) sends a contributor looking; one that
leaves out the backward lets a new mask or argument silently miss it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
#: A backticked repository path: a folder and a file name with an extension.
PATH = re.compile(
    r"`((?:attn_ref|kernels|tests|docs|errors|scripts|benchmarks|docs_hooks|tutorials_src)/[\w./-]+\.\w+)`"
)


def recipe(title: str) -> str:
    """The text of the section ``### <title>`` up to the next heading."""
    return re.search(r"^### " + re.escape(title) + r".*?\n(.*?)(?=^#)", TEXT, re.M | re.S).group(1)


RECIPES = {
    "mask or argument": recipe("Add a mask or an argument"),
    "kernel": recipe("A new kernel"),
}


@pytest.mark.parametrize("name", RECIPES)
def test_every_file_a_recipe_names_exists(name):
    paths = PATH.findall(RECIPES[name])
    assert len(paths) >= 5, paths
    missing = [p for p in paths if "<" not in p and not (ROOT / p).is_file()]
    assert not missing, missing


def test_every_file_the_page_names_exists():
    missing = sorted({p for p in PATH.findall(TEXT) if "<" not in p and not (ROOT / p).exists()})
    assert not missing, missing


def test_the_mask_and_argument_recipe_includes_the_backward():
    paths = set(PATH.findall(RECIPES["mask or argument"]))
    assert {
        "attn_ref/backward.py",
        "kernels/backward.py",
        "tests/backward_cases.py",
        "tests/test_backward_reference.py",
        "tests/test_backward_kernels.py",
    } <= paths
