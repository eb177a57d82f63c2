"""MkDocs hook: a reference piece and its kernel twin as aligned rows, one step of the computation
per row.

A block of the form::

    ```pairs
    reference: attn_ref/append.py _append_kv_entry
    kernel: kernels/append.py _append_kv_entry_kernel
    rows:
      - step: the positions of the new tokens
        reference: positions = torch.arange
        kernel: positions = cache_len
      - step: the write
        reference: {from: "for t in", to: "cache[slot]"}
        kernel: [keys = _rotated, tl.store]
      - step: only the kernel checks the tile's rows
        reference: null
        kernel: if pid_t
    ```

becomes a grid: a heading row naming both pieces, then per row the step's text (inline Markdown)
over two code cells, the reference's on the left and the kernel's on the right, at one height. The
code is the real source, read when the site is built, highlighted, with the files' own line numbers.
``reference`` and ``kernel`` name one definition each, ``"path qualname"``, or a list of them (the
rows walk through them in order). A row's side is an *excerpt*:

* a text: the statement that starts on the first line containing it; of a compound statement
  (``def``, ``for``, ``if``, ``with``, ...) only its header; one of more than four lines (a kernel's
  parameter list, a call with many keywords) is trimmed to its first line, ``...`` and its last
  line;
* ``{from: A}``: the whole statement starting on the line containing ``A``, its body included;
* ``{from: A, to: B}``: the lines from the one containing ``A`` to the end of the statement on the
  line containing ``B``;
* a list of these: shown in order, lines skipped between them become ``...``;
* ``null``: nothing on this side (the step has no counterpart there).

Each side searches on from where its previous row ended, so rows follow the source top to bottom,
and text that is not found fails the build. Lines with code skipped between two rows are marked by a
``...`` at the top of the later cell: an excerpt is a trimmed view, never a silent cut. The block
ends with the two whole definitions, folded (``??? "The whole pieces"``), as ``source(...)``
includes (``docs_hooks/source_includes.py``, which runs after this hook).

Code never wraps (a cell scrolls sideways), so indentation reads as Python's.
"""

from __future__ import annotations

import ast
import html
import re
from dataclasses import dataclass
from pathlib import Path

import markdown
import yaml
from mkdocs.exceptions import PluginError
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

BLOCK = re.compile(r"^```pairs[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)

#: A statement (or a compound statement's header) longer than this many lines is shown trimmed.
MAX_UNTRIMMED_LINES = 4

SIDES = ("reference", "kernel")


@dataclass
class Piece:
    """One definition in one file: its lines, dedented by the definition's own indent,
    highlighted."""

    path: str
    qualname: str
    first: int  # 1-based first line (decorators included)
    last: int  # 1-based last line
    text: list[str]  # source lines first..last, dedented
    html: list[str]  # the same lines, highlighted (one HTML fragment per line)
    statements: list[ast.stmt]  # every statement of the definition, itself included
    docstrings: set[int]  # lines of docstrings (skipped without a `...`)

    @classmethod
    def load(cls, root: Path, spec: str) -> "Piece":
        path, _, qualname = spec.strip().partition(" ")
        file = root / path
        if not file.is_file() or not qualname:
            raise PluginError(f"pairs: expected 'path qualname', got {spec!r}")
        source = file.read_text(encoding="utf-8")
        node = _definition(ast.parse(source), qualname, path)
        first = _first_line(node)
        lines = source.splitlines()[first - 1 : node.end_lineno]
        indent = len(lines[0]) - len(lines[0].lstrip())
        text = [line[indent:] if not line[:indent].strip() else line.lstrip() for line in lines]
        highlighted = highlight(
            "\n".join(text) + "\n", PythonLexer(stripnl=False), HtmlFormatter(nowrap=True)
        )
        statements = [stmt for stmt in ast.walk(node) if isinstance(stmt, ast.stmt)]
        docstrings = {
            line
            for stmt in statements
            if isinstance(stmt, DEFINITIONS) and ast.get_docstring(stmt)
            for line in range(stmt.body[0].lineno, stmt.body[0].end_lineno + 1)
        }
        return cls(
            path,
            qualname,
            first,
            node.end_lineno,
            text,
            highlighted.split("\n")[: len(text)],
            statements,
            docstrings,
        )

    def line(self, number: int) -> str:
        return self.text[number - self.first]

    def find(self, needle: str, after: int) -> int | None:
        """The first line at or after ``after`` that contains ``needle``."""
        for number in range(max(after, self.first), self.last + 1):
            if needle in self.line(number):
                return number
        return None

    def statement_end(self, number: int, whole: bool) -> int:
        """The last line of the innermost statement on line ``number``: the end of a simple
        statement; of a compound one only its header (all of it if ``whole`` and it starts on
        ``number``); a line of a compound statement outside its header and its children (``else:``)
        is itself."""
        around = [s for s in self.statements if _first_line(s) <= number <= s.end_lineno]
        if not around:
            return number
        stmt = min(around, key=lambda s: s.end_lineno - _first_line(s))
        body = getattr(stmt, "body", None)
        if not isinstance(body, list) or not body:
            return stmt.end_lineno
        if whole and number == _first_line(stmt):
            return stmt.end_lineno
        if number < body[0].lineno:
            # a docstring is body[0]: the header ends before it
            return max(number, body[0].lineno - 1)
        return number

    def decorated_start(self, number: int) -> int:
        """``number``, or the first decorator's line when ``number`` is the ``def`` line of a
        definition with short decorators (at most two lines; longer ones are left out and marked
        ``...``)."""
        for stmt in self.statements:
            if (
                isinstance(stmt, DEFINITIONS)
                and stmt.lineno == number
                and number - _first_line(stmt) <= 2
            ):
                return _first_line(stmt)
        return number


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _first_line(stmt: ast.stmt) -> int:
    """A statement's first line, its decorators included."""
    return min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])


def _definition(module: ast.Module, qualname: str, path: str) -> ast.stmt:
    body, node = module.body, None
    for part in qualname.split("."):
        node = next((n for n in body if getattr(n, "name", None) == part), None)
        if node is None:
            raise PluginError(f"pairs: {path} has no definition {qualname!r}")
        body = getattr(node, "body", [])
    return node


class Side:
    """The pieces of one side and how far the rows have read them."""

    def __init__(self, pieces: list[Piece]):
        self.pieces, self.index, self.cursor = pieces, 0, pieces[0].first

    def take(self, spec) -> list[tuple[Piece, int, int, int | None]]:
        specs = spec if isinstance(spec, list) else [spec]
        return [self._one(s) for s in specs]

    def _one(self, spec) -> tuple[Piece, int, int, int | None]:
        """``(piece, first line, last line, trimmed)``: ``trimmed``, the last line shown before a
        ``...`` that stands for the rest of a long statement (its last line is shown after it), or
        None."""
        start_text, stop_text, whole = _parse_spec(spec)
        for index in range(self.index, len(self.pieces)):
            piece = self.pieces[index]
            found = piece.find(start_text, self.cursor if index == self.index else piece.first)
            if found is None:
                continue
            start = piece.decorated_start(found)
            if stop_text is None:
                end = piece.statement_end(found, whole)
            else:
                stop = piece.find(stop_text, found)
                if stop is None:
                    raise PluginError(
                        f"pairs: {piece.qualname} ({piece.path}) has no line containing "
                        f"{stop_text!r} after {start_text!r}"
                    )
                end = piece.statement_end(stop, whole=False)
            self.index, self.cursor = index, end + 1
            long = stop_text is None and not whole and end - found + 1 > MAX_UNTRIMMED_LINES
            return piece, start, end, found if long else None
        names = ", ".join(f"{p.path} {p.qualname}" for p in self.pieces[self.index :])
        raise PluginError(
            f"pairs: no line containing {start_text!r} in {names} after line {self.cursor}"
        )


def _parse_spec(spec) -> tuple[str, str | None, bool]:
    if isinstance(spec, str):
        return spec, None, False
    if isinstance(spec, dict) and set(spec) <= {"from", "to"} and "from" in spec:
        return str(spec["from"]), (str(spec["to"]) if "to" in spec else None), "to" not in spec
    raise PluginError(
        f"pairs: an excerpt is a text, {{from: A}}, {{from: A, to: B}} or a list of them, got "
        f"{spec!r}"
    )


def _has_code(piece: Piece, first: int, last: int) -> bool:
    """Whether lines ``first..last`` of ``piece`` hold anything but blanks, comments and
    docstrings."""
    return any(
        piece.line(n).strip()
        and not piece.line(n).lstrip().startswith("#")
        and n not in piece.docstrings
        for n in range(first, last + 1)
    )


def _indent(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def _elision(indent: str) -> str:
    return f'<span class="sbs-ln"></span>{indent}<span class="sbs-elided">...</span>'


def _cell_lines(
    parts: list[tuple[Piece, int, int, int | None]], previous: tuple[Piece, int] | None
) -> list[str]:
    """HTML lines of one cell; ``previous``: the piece and last line the side's previous row showed.
    Code skipped since then (or since the start of a piece not shown before) becomes a ``...``
    line."""
    out: list[str] = []
    for piece, start, end, trimmed in parts:
        shown_to = previous[1] if previous is not None and previous[0] is piece else piece.first - 1
        if _has_code(piece, shown_to + 1, start - 1):
            out.append(_elision(_indent(piece.line(start))))
        numbers = (
            [*range(start, trimmed + 1), None, end] if trimmed else list(range(start, end + 1))
        )
        for number in numbers:
            if number is None:
                out.append(_elision(_indent(piece.line(trimmed)) + "    "))
            else:
                out.append(
                    f'<span class="sbs-ln">{number}</span>{piece.html[number - piece.first]}'
                )
        previous = (piece, end)
    return out


def _code_cell(side: str, lines: list[str]) -> str:
    if not lines:
        return f'<div class="sbs-cell sbs-{side} sbs-empty"></div>'
    body = "\n".join(lines)
    return (
        f'<div class="sbs-cell sbs-{side}"><div class="highlight"><pre><code>{body}</code></pre>'
        "</div></div>"
    )


def _inline(text: str) -> str:
    """A step's text, inline Markdown to HTML (code spans, emphasis; links are written as HTML)."""
    rendered = markdown.markdown(str(text).strip())
    return rendered.removeprefix("<p>").removesuffix("</p>")


def render(body: str, root: Path) -> str:
    """The HTML (and the folded whole pieces, as Markdown) of one ``pairs`` block."""
    try:
        spec = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise PluginError(f"pairs: not YAML: {exc}") from exc
    if not isinstance(spec, dict) or set(spec) != {"reference", "kernel", "rows"}:
        raise PluginError("pairs: a block has exactly the keys reference, kernel and rows")
    sides, heads = {}, []
    for side in SIDES:
        names = spec[side] if isinstance(spec[side], list) else [spec[side]]
        pieces = [Piece.load(root, name) for name in names]
        sides[side] = Side(pieces)
        by_path: dict[str, list[str]] = {}
        for p in pieces:
            by_path.setdefault(p.path, []).append(f"<code>{html.escape(p.qualname)}</code>")
        listed = ", ".join(
            f'{", ".join(names)} <span class="sbs-path">{html.escape(path)}</span>'
            for path, names in by_path.items()
        )
        heads.append(f'<div class="sbs-head sbs-{side}">{side.capitalize()}: {listed}</div>')
    rows, previous = [], {side: None for side in SIDES}
    for number, row in enumerate(spec["rows"], 1):
        if not isinstance(row, dict) or "step" not in row or set(row) - {"step", *SIDES}:
            raise PluginError(
                f"pairs: row {number} needs a step and takes only reference and kernel: {row!r}"
            )
        cells = []
        for side in SIDES:
            excerpt = row.get(side)
            parts = [] if excerpt is None else sides[side].take(excerpt)
            cells.append(_code_cell(side, _cell_lines(parts, previous[side])))
            if parts:
                previous[side] = (parts[-1][0], parts[-1][2])
        rows.append(
            '<div class="sbs-row"><div '
            f'class="sbs-step">{_inline(row["step"])}</div>{"".join(cells)}</div>'
        )
    grid = (
        f'<div class="sbs-pairs">\n<div class="sbs-row sbs-heads">{"".join(heads)}</div>\n'
        + "\n".join(rows)
        + "\n</div>"
    )
    whole = ["", '??? abstract "The whole pieces"', ""]
    for side in SIDES:
        for piece in sides[side].pieces:
            whole.append(f'    {{{{ source("{piece.path}", "{piece.qualname}") }}}}')
            whole.append("")
    return grid + "\n" + "\n".join(whole)


def on_page_markdown(markdown_text, page, config, files):
    root = Path(config["config_file_path"]).parent
    return BLOCK.sub(lambda m: render(m["body"], root), markdown_text)
