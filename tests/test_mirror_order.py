"""The mirror in the file tree: ``attn_ref/X.py`` and ``kernels/X.py`` list their twins in one
order.

Each paired file reads top-down (public API first, then the pieces in the order they are called),
so a reader holding the two files side by side finds each function and its twin at the same
position. Twins are named by the rule of the side-by-side pages (``tests/twin_names.py``: a kernel
piece takes the reference's name, a launched program adds ``_kernel``, a launch planner ``plan_``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from twin_names import twin_name

ROOT = Path(__file__).resolve().parents[1]
PAIRED = sorted(
    p.name for p in (ROOT / "attn_ref").glob("*.py") if (ROOT / "kernels" / p.name).is_file()
)


def twin_sequence(path: Path) -> list[str]:
    """The twin names of the file's top-level functions and classes, each at its first
    occurrence."""
    names = [
        node.name
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    ]
    return list(dict.fromkeys(twin_name(name) for name in names))


def test_the_pairs_are_the_mirrored_modules():
    assert {
        "append.py",
        "attention.py",
        "backward.py",
        "kvcache.py",
        "masks.py",
        "merge.py",
        "paged.py",
        "rotary.py",
        "splits.py",
    } <= set(PAIRED)


@pytest.mark.parametrize("name", PAIRED)
def test_twins_appear_in_the_same_order(name):
    reference, kernel = (
        twin_sequence(ROOT / "attn_ref" / name),
        twin_sequence(ROOT / "kernels" / name),
    )
    shared = set(reference) & set(kernel)
    assert [n for n in reference if n in shared] == [n for n in kernel if n in shared], (
        reference,
        kernel,
    )


def test_the_attention_pieces_live_with_their_twins():
    """The loop body of ``attend`` is in ``attention.py`` on both sides, not in the API module."""
    for piece in (
        "split_states",
        "load_q",
        "dequantize",
        "attention_with_lse",
        "scores",
        "logits",
        "softmax_state",
        "store_state",
    ):
        assert piece in twin_sequence(ROOT / "attn_ref" / "attention.py"), piece
        assert piece in twin_sequence(ROOT / "kernels" / "attention.py"), piece
        assert piece not in twin_sequence(ROOT / "attn_ref" / "kvcache.py"), piece


def test_twin_name_rule():
    assert twin_name("_split_states_kernel") == twin_name("_split_states") == "split_states"
    assert twin_name("plan_append_kv") == twin_name("append_kv") == "append_kv"
    assert twin_name("_attention_with_lse") == twin_name("attention_with_lse")
