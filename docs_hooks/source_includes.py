"""MkDocs hook: include a Python function, class or assignment from the real source by name.

A line of the form::

    {{ source("attn_ref/attention.py", "attention_with_lse") }}

(alone on its line, any indentation) becomes a fenced code block whose body is a
``pymdownx.snippets`` line-range include of that definition (decorators included), numbered with
the file's own line numbers and titled with the path::

    ```python title="attn_ref/attention.py" linenums="31"
    --8<-- "attn_ref/attention.py:31:88"
    ```

The line range is found with :mod:`ast` at every build, so the page always shows the current code;
a definition that no longer exists fails the build. A dotted name (``"KVCacheCall.paged"``) reaches
into a class; a module-level assignment (``"REFERENCE_BACKEND"``) is found by its target name.
``{{ source("attn_ref/kvcache.py", "attend", body=True) }}`` shows only the statements after the
signature and docstring (for functions whose signature is shown elsewhere on the page), and
``{{ source("kernels/attention.py", "_attend_key_blocks", start="# ---- online softmax",
stop="return") }}`` only a part of the definition: from its first line that contains ``start`` up to
(not including) the next line that contains ``stop`` (without ``stop``: to the end), trailing blank
lines dropped. Side-by-side pairs show whole pieces; text that is not found fails the build.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

DIRECTIVE = re.compile(
    r'^(?P<indent>[ \t]*)\{\{ source\("(?P<path>[^"]+)", "(?P<name>[^"]+)"(?P<body>, body=True)?'
    r'(?:, start="(?P<start>[^"]+)")?(?:, stop="(?P<stop>[^"]+)")?\) \}\}[ \t]*$',
    re.M,
)


def definition_lines(path: Path, qualname: str, body_only: bool = False) -> tuple[int, int]:
    """First and last line (1-based, decorators included) of the definition ``qualname`` in
    ``path``.

    ``body_only``: start at the first statement after the signature and the docstring instead.
    """
    body = ast.parse(path.read_text(encoding="utf-8")).body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if part in _names(n)), None)
        if node is None:
            raise PluginError(f"source include: {path} has no definition {qualname!r}")
        body = getattr(node, "body", [])
    if body_only:
        statements = node.body[1:] if ast.get_docstring(node) is not None else node.body
        return statements[0].lineno, node.end_lineno
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return start, node.end_lineno


def part_lines(path: Path, qualname: str, start: str, stop: str | None = None) -> tuple[int, int]:
    """First and last line of the part of ``qualname`` from the line containing ``start`` up to the
    line before the next one containing ``stop`` (or the definition's end), trailing blank lines
    dropped."""
    first, last = definition_lines(path, qualname)
    lines = path.read_text(encoding="utf-8").splitlines()
    begin = next((n for n in range(first, last + 1) if start in lines[n - 1]), None)
    if begin is None:
        raise PluginError(
            f"source include: {qualname!r} in {path} has no line containing {start!r}"
        )
    end = last
    if stop is not None:
        end = next((n - 1 for n in range(begin + 1, last + 1) if stop in lines[n - 1]), None)
        if end is None:
            raise PluginError(
                f"source include: {qualname!r} in {path} has no line containing {stop!r} after "
                f"{start!r}"
            )
    while end > begin and not lines[end - 1].strip():
        end -= 1
    return begin, end


def include_lines(root: Path, match: re.Match) -> tuple[int, int]:
    """The line range a ``source(...)`` directive includes."""
    path = root / match["path"]
    if match["start"]:
        return part_lines(path, match["name"], match["start"], match["stop"])
    return definition_lines(path, match["name"], body_only=bool(match["body"]))


def _names(node: ast.stmt) -> list[str]:
    """Names a statement defines: a function, a class, or the targets of an assignment."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _code_block(match: re.Match, root: Path) -> str:
    indent, rel, name = match["indent"], match["path"], match["name"]
    path = root / rel
    if not path.is_file():
        raise PluginError(f"source include: no file {rel}")
    start, end = include_lines(root, match)
    title = (
        f"{rel}: body of {name}"
        if match["body"]
        else f"{rel}: part of {name}"
        if match["start"]
        else rel
    )
    lines = [
        f'```python title="{title}" linenums="{start}"',
        f'--8<-- "{rel}:{start}:{end}"',
        "```",
    ]
    return "\n".join(indent + line for line in lines)


def on_config(config):
    """Resolve snippet paths against the project root (where mkdocs.yml is), whatever the working
    dir."""
    root = str(Path(config["config_file_path"]).parent)
    config["mdx_configs"].setdefault("pymdownx.snippets", {})["base_path"] = [root]
    return config


def on_page_markdown(markdown, page, config, files):
    root = Path(config["config_file_path"]).parent
    return DIRECTIVE.sub(lambda m: _code_block(m, root), markdown)
