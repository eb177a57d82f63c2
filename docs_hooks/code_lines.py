"""MkDocs hook: every line of every code block in its own ``<span class="code-line">``, so that a
long line can wrap with a hanging indent and a continuation mark (``docs/stylesheets/extra.css``).

Three kinds of code blocks reach the built pages:

* Markdown fences (pymdownx.highlight with ``line_spans``): each line is already a
  ``<span id="__span-B-L">``; the hook adds the class and the line's indentation.
* Notebook cells (mkdocs-jupyter, ``<div class="highlight-ipynb">``) and the side-by-side cells
  (``docs_hooks/side_by_side.py``): one ``<pre>`` of Pygments spans with newlines between lines;
  the hook splits it into lines, closing the spans that a line leaves open (a docstring over several
  lines) and reopening them on the next.

Each line carries ``style="--indent: N"``: its leading spaces, where its wrapped rows start (CSS
puts them N + 2 characters in, behind a continuation mark), and ``--digits`` where it shows a line
number. The text is unchanged: ``textContent`` and the copied code are the same characters,
newlines included (each newline stays inside its line).
Notebook outputs (``.jp-OutputArea``) are left alone: they scroll.
"""

from __future__ import annotations

import html
import re

LINE_CLASS = "code-line"
PRE = re.compile(r"(<pre\b[^>]*>)(.*?)(</pre>)", re.S)
FENCE_LINE = re.compile(r'<span id="__span-[0-9]+-[0-9]+">')
TAG = re.compile(r"(<[^>]+>)")
TAG_NAME = re.compile(r"<([a-zA-Z0-9]+)")
#: Text of a block that is not code: the side-by-side line numbers.
LINE_NUMBER = re.compile(r'<span class="sbs-ln">[^<]*</span>')
#: Material's line number of a fence line (``linenums``): drawn from the attribute, not in the text.
LINENOS = re.compile(r'<span class="linenos" data-linenos="([^"]*)">')
#: A ``<code>`` around the lines (side-by-side cells): kept outside the line spans.
CODE = re.compile(r"\A(<span></span>)?(<code\b[^>]*>)?(.*?)(</code>)?\Z", re.S)


def indent(line_html: str) -> int:
    """Leading spaces of one line's text (tags and line numbers left out)."""
    text = html.unescape(TAG.sub("", LINE_NUMBER.sub("", line_html)))
    return len(text) - len(text.lstrip(" "))


def line_style(line_html: str) -> str:
    """``--indent``: the line's leading spaces; ``--digits``: the width of its line number
    (Material's ``.linenos``), when it has one."""
    style = f"--indent: {indent(line_html)}"
    number = LINENOS.search(line_html)
    return style + (f"; --digits: {len(number.group(1))}" if number else "")


def open_line(line_html: str) -> str:
    return f'<span class="{LINE_CLASS}" style="{line_style(line_html)}">'


def mark_fence_lines(body: str) -> str:
    """Material's per-line spans: the class and the indentation added."""
    starts = [m.start() for m in FENCE_LINE.finditer(body)] + [len(body)]
    out = [body[: starts[0]]]
    for start, end in zip(starts, starts[1:]):
        line = body[start:end]
        tag = FENCE_LINE.match(line).group(0)
        out.append(tag[:-1] + f' class="{LINE_CLASS}" style="{line_style(line)}">')
        out.append(line[len(tag) :])
    return "".join(out)


def split_lines(body: str) -> str:
    """Pygments HTML with newlines between lines: each line wrapped in a line span, the spans open
    at a newline closed before it ends and reopened after."""
    lines: list[str] = []  # HTML of each line, its newline included
    current: list[str] = []
    stack: list[str] = []  # open tags
    for token in TAG.split(body):
        if not token:
            continue
        if token.startswith("</"):
            stack.pop()
            current.append(token)
        elif token.startswith("<"):
            if not token.endswith("/>"):
                stack.append(token)
            current.append(token)
        else:
            pieces = token.split("\n")
            for piece in pieces[:-1]:
                current.append(piece + "\n")
                current.extend("</" + TAG_NAME.match(t).group(1) + ">" for t in reversed(stack))
                lines.append("".join(current))
                current = list(stack)
            current.append(pieces[-1])
    rest = "".join(current)
    if TAG.sub("", rest):
        lines.append(rest)
    elif lines:
        lines[-1] += rest
    return "".join(f"{open_line(line)}{line}</span>" for line in lines)


def mark_block(match: re.Match) -> str:
    start, body, end = match.groups()
    if LINE_CLASS in body:
        return match.group(0)
    if FENCE_LINE.search(body):
        return start + mark_fence_lines(body) + end
    lead, code_open, inner, code_close = CODE.match(body).groups()
    return start + (lead or "") + (code_open or "") + split_lines(inner) + (code_close or "") + end


def mark_code_lines(page_html: str) -> str:
    """Every ``<pre>`` of the page but notebook outputs, its lines marked."""
    out, position = [], 0
    for match in PRE.finditer(page_html):
        out.append(page_html[position : match.start()])
        before = page_html[max(0, match.start() - 200) : match.start()]
        is_output = "jp-RenderedText" in before or "jp-OutputArea-output" in before
        out.append(match.group(0) if is_output else mark_block(match))
        position = match.end()
    out.append(page_html[position:])
    return "".join(out)


def on_post_page(output, page, config):
    return mark_code_lines(output)
