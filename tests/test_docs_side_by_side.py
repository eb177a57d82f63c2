"""The side-by-side rows (``docs_hooks/side_by_side.py``): what an excerpt spec shows, and the
pages' blocks.

The hook is run here on small made-up pieces, so every rule of the spec format is checked on lines
whose numbers are known; then every ``pairs`` block of ``docs/side-by-side/`` is rendered and held
to the pages' rules (twins by name, short cells, every row a pair or a marked one-sided step).
"""

from __future__ import annotations

import html
import re
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from docs_hooks.side_by_side import BLOCK, render  # noqa: E402
from twin_names import twin_name  # noqa: E402

REFERENCE = '''\
import torch


def softmax_rows(x):
    """Row softmax of a (n, m) tensor."""
    # the largest score of each row
    m = x.max(dim=-1, keepdim=True).values
    p = torch.exp(x - m)
    total = p.sum(
        dim=-1,
        keepdim=True,
    )
    return p / total
'''

KERNEL = '''\
@jit
def softmax_rows_kernel(
    x_ptr,  # (n, m)
    out_ptr,  # (n, m)
    stride,
    M,
    BLOCK: int,
):
    """One program: one row."""
    row = program_id(0)
    x = load(x_ptr + row * stride)
    m = max(x)
    for block in range(BLOCK):
        p = exp(x - m)
        store(out_ptr, p)
    return None
'''


@pytest.fixture
def root(tmp_path) -> Path:
    (tmp_path / "attn_ref").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "attn_ref" / "soft.py").write_text(REFERENCE)
    (tmp_path / "kernels" / "soft.py").write_text(KERNEL)
    return tmp_path


def block(rows: str) -> str:
    return (
        "reference: attn_ref/soft.py softmax_rows\nkernel: kernels/soft.py "
        "softmax_rows_kernel\nrows:\n" + textwrap.dedent(rows)
    )


def cells(rendered: str) -> list[dict[str, list[str]]]:
    """Per row (heading row left out): each side's shown lines as ``"<number> <text>"``, the text
    with its indentation (an elision is ``"..."``, unnumbered)."""
    grid = rendered.split("\n??? ")[0]
    out = []
    for row in re.findall(
        r'<div class="sbs-row">(.*?)</div>\n?(?=<div class="sbs-row"|</div>\s*$)', grid, re.S
    ):
        found = {}
        for side in ("reference", "kernel"):
            cell = re.search(
                rf'<div class="sbs-cell sbs-{side}[^"]*">(.*?)</code></pre></div></div>|<div '
                rf'class="sbs-cell sbs-{side} sbs-empty"></div>',
                row,
                re.S,
            )
            lines = []
            if cell and cell.group(1):
                for line in cell.group(1).split("<code>", 1)[1].split("\n"):
                    number = re.match(r'<span class="sbs-ln">(\d*)</span>', line).group(1)
                    text = html.unescape(re.sub(r"<[^>]+>", "", line.split("</span>", 1)[1]))
                    lines.append(f"{number} {text}" if number else text.strip())
            found[side] = lines
        out.append(found)
    return out


def test_a_text_shows_its_statement_and_a_compound_statement_its_header(root):
    rows = cells(
        render(
            block("""\
        - step: "the max"
          reference: "m = x.max"
          kernel: "m = max(x)"
        - step: "the loop"
          reference: "p = torch.exp"
          kernel: "for block in"
        """),
            root,
        )
    )
    # the def was skipped
    assert rows[0] == {
        "reference": ["...", "7     m = x.max(dim=-1, keepdim=True).values"],
        "kernel": ["...", "12     m = max(x)"],
    }
    # the header only, not its body
    assert rows[1]["kernel"] == ["13     for block in range(BLOCK):"]


def test_a_long_statement_or_header_is_trimmed_and_from_to_is_not(root):
    rows = cells(
        render(
            block("""\
        - step: "the signature"
          reference: "def softmax_rows"
          kernel: "def softmax_rows_kernel"
        - step: "the sum, whole"
          reference: {from: "total = p.sum", to: "keepdim=True"}
          kernel: null
        """),
            root,
        )
    )
    # decorators kept
    assert rows[0]["kernel"] == ["1 @jit", "2 def softmax_rows_kernel(", "...", "8 ):"]
    assert rows[0]["reference"] == ["4 def softmax_rows(x):"]
    # to: the end of the statement holding the line (the call's closing parenthesis), untrimmed
    assert rows[1]["reference"] == [
        "...",
        "9     total = p.sum(",
        "10         dim=-1,",
        "11         keepdim=True,",
        "12     )",
    ]
    assert rows[1]["kernel"] == []


def test_from_alone_takes_the_body_and_a_list_marks_its_gaps(root):
    rows = cells(
        render(
            block("""\
        - step: "the loop, whole"
          reference: ["m = x.max", "return p / total"]
          kernel: {from: "for block in"}
        """),
            root,
        )
    )
    assert rows[0]["kernel"] == [
        "...",
        "13     for block in range(BLOCK):",
        "14         p = exp(x - m)",
        "15         store(out_ptr, p)",
    ]
    assert rows[0]["reference"] == [
        "...",
        "7     m = x.max(dim=-1, keepdim=True).values",
        "...",
        "13     return p / total",
    ]


def test_skipping_only_comments_and_docstrings_shows_no_ellipsis(root):
    rows = cells(
        render(
            block("""\
        - step: "the signature"
          reference: "def softmax_rows"
          kernel: "def softmax_rows_kernel"
        - step: "the first statement"
          reference: "m = x.max"
          kernel: "row = program_id"
        """),
            root,
        )
    )
    assert rows[1] == {
        "reference": ["7     m = x.max(dim=-1, keepdim=True).values"],
        "kernel": ["10     row = program_id(0)"],
    }


def test_rows_read_on_from_the_previous_row(root):
    """A side searches on from where its previous row ended: a text above that point is not
    found."""
    with pytest.raises(PluginError, match="no line containing 'm = x.max'"):
        render(
            block("""\
            - step: "the end"
              reference: "return p / total"
              kernel: null
            - step: "back up"
              reference: "m = x.max"
              kernel: null
            """),
            root,
        )


@pytest.mark.parametrize(
    "rows, error",
    [
        (
            '- step: "x"\n  reference: "no such text"\n  kernel: null\n',
            "no line containing 'no such text'",
        ),
        (
            '- step: "x"\n  reference: {from: "m = x.max", to: "no such end"}\n  kernel: null\n',
            "no line containing 'no such end'",
        ),
        (
            '- step: "x"\n  reference: {from: "a", to: "b", c}\n  kernel: null\n',
            "an excerpt is a text",
        ),
        ('- step: "x"\n  referenc: "m = x.max"\n', "takes only reference and kernel"),
        ("- step: a: b\n", "not YAML"),
    ],
)
def test_a_wrong_spec_fails_the_build_with_its_reason(root, rows, error):
    with pytest.raises(PluginError, match=error):
        render(block(rows), root)


def test_the_block_ends_with_the_whole_pieces_folded(root):
    rendered = render(block('- step: "x"\n  reference: "m = x.max"\n  kernel: "m = max"\n'), root)
    assert rendered.split("\n??? ", 1)[1].splitlines() == [
        'abstract "The whole pieces"',
        "",
        '    {{ source("attn_ref/soft.py", "softmax_rows") }}',
        "",
        '    {{ source("kernels/soft.py", "softmax_rows_kernel") }}',
    ]


#: The most lines a cell of a page's row shows: a row is one step, read at a glance.
MAX_CELL_LINES = 12


def page_blocks() -> list[tuple[str, str]]:
    return [
        (md.name, m["body"])
        for md in sorted((ROOT / "docs" / "side-by-side").glob("*.md"))
        for m in BLOCK.finditer(md.read_text(encoding="utf-8"))
    ]


def paired_name(qualname: str) -> str:
    """The name a piece pairs under: ``_split_states_kernel``, ``plan_attend`` -> ``split_states``,
    ``attend``."""
    return twin_name(qualname.rsplit(".", 1)[-1])


#: Pairs whose names differ on purpose. The ring loop is one code for both packages (the kernels
#: pass another backend): beside it stand the kernel functions its backend calls.
PAIRS_NAMED_APART = {("_ring_forward", "flash_attn_with_kvcache")}


def test_paired_name_rule():
    assert paired_name("_split_states_kernel") == paired_name("_split_states") == "split_states"
    assert paired_name("plan_attend") == paired_name("attend") == "attend"
    assert paired_name("UlyssesAttention.forward") == "forward"
    assert paired_name("_merge_pair") != paired_name("merge_attention_states")


def test_pages_show_pairs_as_rows_of_twins_in_short_cells():
    blocks = page_blocks()
    assert len(blocks) >= 10
    for page in sorted((ROOT / "docs" / "side-by-side").glob("*.md")):
        assert 'class="side-by-side"' not in page.read_text(encoding="utf-8"), (
            f"{page.name}: a pair of whole columns left"
        )
    for page, body in blocks:
        spec = yaml.safe_load(body)
        names = {}
        for side, package in (("reference", "attn_ref/"), ("kernel", "kernels/")):
            pieces = spec[side] if isinstance(spec[side], list) else [spec[side]]
            assert all(p.startswith(package) for p in pieces), (page, pieces)
            names[side] = [piece.split(" ", 1)[1] for piece in pieces]
        twins = {(r, k) for r in names["reference"] for k in names["kernel"]}
        assert twins & PAIRS_NAMED_APART or any(
            paired_name(r) == paired_name(k) for r, k in twins
        ), (page, names)
        rows = cells(render(body, ROOT))
        assert len(rows) == len(spec["rows"]) >= 2, (page, names)
        for number, row in enumerate(rows, 1):
            assert row["reference"] or row["kernel"], (page, names, number)
            for side, lines in row.items():
                assert len(lines) <= MAX_CELL_LINES, (
                    f"{page}: {names[side]}, row {number}: {len(lines)} lines"
                )
