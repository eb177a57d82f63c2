"""The docs site: a strict build, the error catalog's pages and JSON API, and a headless browser.

The site is built once per module with ``mkdocs build --strict`` into a temporary folder (any broken
link, anchor, include or nav entry fails it). The browser test drives Debian's Chromium
(``/usr/bin/chromium``) through Playwright for Python against the built site served on localhost.
"""

from __future__ import annotations

import ast
import datetime
import functools
import html
import http.server
import importlib
import importlib.util
import inspect
import json
import os
import posixpath
import re
import subprocess
import sys
import textwrap
import threading
import typing
import urllib.parse
from pathlib import Path

import pytest
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from conftest import SITE_PATH  # noqa: E402 - the published site's path (its site_url's)
from docs_hooks import code_lines  # noqa: E402
from docs_hooks.error_pages import entry_json, is_capability_gap  # noqa: E402
from docs_hooks.source_includes import definition_lines  # noqa: E402
from errors import catalog as cat, upstream  # noqa: E402
from upstream_forms import pasted_forms  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def catalog() -> dict:
    return cat.load()


def test_strict_build_has_every_nav_page(site):
    for page in [
        "index.html",
        "concepts/masks/index.html",
        "concepts/sequence-parallel/index.html",
        "side-by-side/index.html",
        "reference/attn_ref/index.html",
        "errors/index.html",
    ]:
        assert (site / page).is_file(), page
    for notebook in (ROOT / "docs" / "tutorials").glob("*.ipynb"):
        assert (site / "tutorials" / notebook.stem / "index.html").is_file(), notebook.name


def test_benchmarks_page_shows_every_committed_result(site):
    results = ROOT / "benchmarks" / "results"
    devices = sorted(results.glob("*.json")) if results.is_dir() else []
    page = site / "benchmarks" / "index.html"
    assert page.is_file() == bool(devices), "a benchmarks page exactly when results are committed"
    if devices:
        text = page.read_text(encoding="utf-8")
        for plot in results.glob("*.png"):
            assert f'src="{plot.name}"' in text and (site / "benchmarks" / plot.name).is_file(), (
                plot.name
            )
        # A device without results is said to have none, plainly.
        assert ("No GPU figures yet" in text) == (not (results / "cuda.json").is_file())
        assert ("No CPU figures yet" in text) == (not (results / "cpu.json").is_file())


def test_tutorial_pages_link_their_notebook_and_source_and_state_the_run_time(site):
    for notebook in sorted((ROOT / "docs" / "tutorials").glob("*.ipynb")):
        folder = site / "tutorials" / notebook.stem
        text = (folder / "index.html").read_text(encoding="utf-8")
        seconds = json.loads(notebook.read_text(encoding="utf-8"))["metadata"]["attn_ref"][
            "run_seconds"
        ]
        assert f"It ran top to bottom in {seconds:.0f} s" in text, notebook.name
        for name in (notebook.name, f"{notebook.stem}.py"):
            assert f'href="{name}" download' in text and (folder / name).is_file(), name
        assert (folder / f"{notebook.stem}.py").read_bytes() == (
            ROOT / "tutorials_src" / f"{notebook.stem}.py"
        ).read_bytes()


def test_comm_volume_chart_draws_ulysses_only_at_valid_degrees():
    spec = importlib.util.spec_from_file_location(
        "doc_figures", ROOT / "scripts" / "doc_figures.py"
    )
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    ulysses = next(
        line
        for line in figures.comm_volume().axes[0].lines
        if line.get_label().startswith("Ulysses")
    )
    degrees = [int(p) for p in ulysses.get_xdata()]
    assert degrees and all(8 % p == 0 for p in degrees), degrees  # h_k = 8 KV heads


#: Control characters a text source must not hold: all of C0 but the newline, and DEL (a TAB typed
#: where `\t` of `\text` was meant rendered tutorial 1's accuracy rule as "ext").
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


def notebook_texts(path: Path) -> list[tuple[str, str]]:
    """``(where, text)`` of a notebook's cell sources and text outputs (not images)."""
    texts = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        texts.append((f"{cell.get('id')} source", "".join(cell["source"])))
        for output in cell.get("outputs", []):
            texts.append((f"{cell.get('id')} output", "".join(output.get("text", ""))))
            for kind in ("text/plain", "text/markdown", "text/html"):
                texts.append(
                    (f"{cell.get('id')} {kind}", "".join(output.get("data", {}).get(kind, "")))
                )
    return texts


def doc_sources() -> list[Path]:
    """The hand-written text of the site: markdown pages, tutorial sources, README."""
    return (
        sorted((ROOT / "docs").rglob("*.md"))
        + sorted((ROOT / "tutorials_src").glob("*.py"))
        + [ROOT / "README.md"]
    )


def test_no_control_characters_in_docs_tutorials_and_notebooks():
    found = []
    for path in doc_sources():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if CONTROL.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line!r}")
    for path in sorted((ROOT / "docs" / "tutorials").glob("*.ipynb")):
        found += [
            f"{path.relative_to(ROOT)} {where}: {CONTROL.search(text).group()!r}"
            for where, text in notebook_texts(path)
            if CONTROL.search(text)
        ]
    assert not found, "control characters (a TAB for \\t?):\n" + "\n".join(found)


def test_control_character_rule_catches_a_tab():
    assert CONTROL.search(r"max|\text{out}|") is None  # TeX as written in a raw string
    assert CONTROL.search("max|\text{out}|") is not None  # the TAB that "\t" in a plain string is
    assert CONTROL.search("line one\nline two") is None


#: Spellings docs/notation.md retired, each with what replaces it. They may appear only in that
#: page's "Retired spellings" table.
RETIRED = {
    r"\bH_kv\b|\bHkv\b|H_\{kv\}|\bH_k\b|\bH_\{k\}": "h_k (the number of KV heads)",
    r"\(b_k, max_pages\)": "(b, max_pages): one page-table row per sequence of the batch",
    r"KV head `{0,2}g\b|\bg = h // \(h": "kv_head = head // g (g is the group size h / h_k)",
    r"[Qq]uery head `{1,2}h`{1,2}|[Qq]uery head \$h\$|σ_h\b": (
        "head (h is the number of query heads)"
    ),
    r"pages of `P` tokens|`\(num_pages, P,": "page_size (P is the number of ranks)",
}


def test_docs_use_the_notation_page_symbols():
    sources = (
        doc_sources()
        + [ROOT / "scripts" / "doc_figures.py"]
        + sorted((ROOT / "docs" / "figures").glob("*.svg"))
    )
    notation = (ROOT / "docs" / "notation.md").read_text(encoding="utf-8")
    assert "## Retired spellings" in notation
    found = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        if path.name == "notation.md":
            text = text.split("## Retired spellings", 1)[0]
        for number, line in enumerate(text.splitlines(), 1):
            for pattern, use in RETIRED.items():
                if re.search(pattern, line):
                    found.append(
                        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]!r}: use {use}"
                    )
    assert not found, "retired symbols (docs/notation.md):\n" + "\n".join(found)


#: In docstrings also sglang's upper-case shape letters, which docs/notation.md spells b, s_q, s_k,
#: d_v.
DOCSTRING_RETIRED = {
    **RETIRED,
    r"\[B, |\bSq\b|\bSk\b|\bDv\b": "[b, s_q, h, d], d_v (S / P: a rank's block)",
}
#: Where docstrings follow docs/notation.md: every module of the two implementations.
DOCSTRING_SOURCES = sorted((ROOT / "attn_ref").rglob("*.py")) + sorted(
    (ROOT / "kernels").rglob("*.py")
)


def docstrings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every line of the module's, its classes' and its functions'
    docstrings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            found += [
                (body[0].lineno + n, line)
                for n, line in enumerate(body[0].value.value.splitlines())
            ]
    return found


def test_docstrings_use_the_notation_page_symbols():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]!r}: use {use}"
        for path in DOCSTRING_SOURCES
        for number, line in docstrings(path)
        for pattern, use in DOCSTRING_RETIRED.items()
        if re.search(pattern, line)
    ]
    assert len(DOCSTRING_SOURCES) > 30
    assert not found, "retired symbols in docstrings (docs/notation.md):\n" + "\n".join(found)


def test_retired_symbol_patterns_match_what_they_retire():
    samples = [
        "`H_kv` heads",
        "Hkv = 4",
        "$H_{kv}$",
        "`(b_k, max_pages)`",
        "served by KV head `g = h // (h / h_k)`",
        "Query head `h` reads",
        "query head ``h`` (KV head ``g``)",
        "σ_h",
        "pages of `P` tokens",
    ]
    for sample in samples:
        assert any(re.search(pattern, sample) for pattern in RETIRED), sample
    for fine in [
        "`h_k` KV heads",
        "`(b, max_pages)`",
        "kv_head = head // g",
        "`page_size`",
        "g = h / h_k",
    ]:
        assert not any(re.search(pattern, fine) for pattern in RETIRED), fine
    for sample in ["q ``[B, S, H, D]``", "``j <= i + Sk - Sq``", "``[..., Dv]``"]:
        assert any(re.search(pattern, sample) for pattern in DOCSTRING_RETIRED), sample
    for fine in [
        "q ``[b, S / P, h, d]``",
        "``Sk_b``",
        "``[b, s_q, h_k, g, d_v]``",
        "query head ``head``",
    ]:
        assert not any(re.search(pattern, fine) for pattern in DOCSTRING_RETIRED), fine


def ring_step_cell(rank: int, step: int, ranks: int, zigzag: bool) -> str:
    """What the ring concept page's per-step table says rank ``rank`` computes at step ``step``,
    derived from the ring's own plan (:func:`attn_ref.sequence_parallel.ring._blocks`, causal, 8
    rows a rank)."""
    from attn_ref.sequence_parallel.ring import _blocks, block_chunks

    source, rows, half = (rank - step) % ranks, 8, slice(0, 4)
    blocks = [
        (b.q_rows, b.k_rows, b.causal)
        for b in _blocks(
            block_chunks(rank, ranks, rows, zigzag), block_chunks(source, ranks, rows, zigzag), True
        )
    ]
    if not zigzag:
        whole = (slice(0, 8), slice(0, 8))
        what = [
            ([], "skipped"),
            ([whole + (True,)], "causal square"),
            ([whole + (False,)], "all of it"),
        ]
        return f"block {source}: " + next(text for plan, text in what if plan == blocks)
    if step == 0:
        assert sum(causal for _, _, causal in blocks) == 2
        what = "own block, causal"
    elif blocks == [(slice(0, 8), half, False)]:
        what = f"all q × chunk {source}"
    else:
        assert blocks == [(slice(4, 8), slice(0, 8), False)], blocks
        what = "late q × both"
    return f"{source}, {2 * ranks - 1 - source}: {what}"


def test_ring_step_tables_are_what_the_ring_computes():
    text = (ROOT / "docs" / "concepts" / "sequence-parallel.md").read_text(encoding="utf-8")
    for zigzag, first in ((False, "| rank | step 0 |"), (True, "| rank (its chunks) | step 0 |")):
        table = text[text.index(first) :].split("\n\n", 1)[0].splitlines()[2:]
        cells = [[cell.strip() for cell in row.strip("|").split("|")][1:] for row in table]
        assert cells == [[ring_step_cell(r, t, 4, zigzag) for t in range(4)] for r in range(4)], (
            zigzag
        )


def test_source_include_finds_definitions():
    path = ROOT / "attn_ref" / "masks.py"
    start, end = definition_lines(path, "AttentionMask.visible_keys")  # a method: a dotted name
    lines = path.read_text().splitlines()
    assert lines[start - 1].strip().startswith("def visible_keys(")
    assert lines[end - 1].strip() == "return visible"
    with pytest.raises(PluginError, match="no definition 'not_there'"):
        definition_lines(path, "not_there")


def parameter_rows(site: Path, page: str, qualname: str) -> list[tuple[str, str]]:
    """``(name, default)`` of each row of the Parameters table of ``qualname`` on an API page."""
    text = (site / page).read_text(encoding="utf-8")
    after_heading = text[text.index(f'id="{qualname}"') :]
    table = after_heading.split("Parameters:", 1)[1].split("</table>", 1)[0]  # its first table
    rows = []
    for row in re.findall(r'<tr class="doc-section-item">(.*?)</tr>', table, re.S):
        cells = [
            html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td>(.*?)</td>", row, re.S)
        ]
        rows.append((cells[0], cells[-1]))
    return rows


def source_defaults(function) -> dict[str, str]:
    """Each parameter's default as its source writes it (a literal, or a constant's name such as
    ``NO_MASK``), which is what the API tables show."""
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    args = node.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    pairs += [
        (arg, default)
        for arg, default in zip(args.kwonlyargs, args.kw_defaults)
        if default is not None
    ]
    return {arg.arg: ast.unparse(default) for arg, default in pairs}


@pytest.mark.parametrize(
    "page, qualname, function",
    [
        (
            "reference/attn_ref/index.html",
            "attn_ref.flash_attn_with_kvcache",
            "attn_ref.flash_attn_with_kvcache",
        ),
        (
            "reference/attn_ref/index.html",
            "attn_ref.attention_with_lse",
            "attn_ref.attention_with_lse",
        ),
        ("reference/kernels/index.html", "kernels.kvcache.attend", "kernels.kvcache.attend"),
    ],
)
def test_api_tables_have_one_row_per_parameter_with_its_default(site, page, qualname, function):
    module, name = function.rsplit(".", 1)
    found = getattr(importlib.import_module(module), name)
    defaults = source_defaults(found)
    expected = [
        (p.name, "required" if p.default is p.empty else defaults[p.name])
        for p in inspect.signature(found).parameters.values()
    ]
    assert parameter_rows(site, page, qualname) == expected


API_PAGES = ["attn_ref", "kernels", "sequence_parallel", "errors", "conformance", "transformers"]


def test_every_api_page_is_listed():
    assert sorted(API_PAGES) == sorted(p.stem for p in (ROOT / "docs" / "reference").glob("*.md"))


@pytest.mark.parametrize("page", API_PAGES)
def test_api_reference_examples_run(page):
    """The examples of docs/reference/<page>.md, run top to bottom as one script (their asserts
    hold)."""
    script = page_script(page)
    assert script, page
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]


def page_script(page: str, folder: str = "reference") -> str:
    """The Python examples of docs/<folder>/<page>.md as one script, as
    test_api_reference_examples_run and test_concept_examples_run run them."""
    markdown = (ROOT / "docs" / folder / f"{page}.md").read_text(encoding="utf-8")
    return "\n".join(re.findall(r"```python\n(.*?)```", markdown, re.S))


#: Concept pages whose Python examples are whole programs (the others show fragments of a
#: distributed run or of a call already on the page).
RUNNABLE_CONCEPT_PAGES = ["backward", "varlen"]


@pytest.mark.parametrize("page", RUNNABLE_CONCEPT_PAGES)
def test_concept_examples_run(page):
    """The examples of docs/concepts/<page>.md, run top to bottom as one script (their asserts
    hold)."""
    script = page_script(page, "concepts")
    assert script, page
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]


def _owner(cls: type, attribute: str) -> type:
    """The class of ``cls.__mro__`` that defines ``attribute`` (``cls`` for an instance
    attribute)."""
    return next((c for c in cls.__mro__ if attribute in vars(c)), cls)


def _field_annotation(cls: type, name: str):
    """The annotation of the field ``name`` of ``cls``, evaluated alone: another field's may name
    a class imported only for type checkers (``if TYPE_CHECKING:``), which
    ``typing.get_type_hints`` of the whole class cannot evaluate."""
    for c in cls.__mro__:
        annotation = c.__dict__.get("__annotations__", {}).get(name)
        if annotation is not None:
            if isinstance(annotation, str):
                return eval(annotation, vars(sys.modules[c.__module__]))
            return annotation
    return None


def _hint(owner, name: str):
    """The annotated type of ``owner``'s ``name`` (a field, a property's or a function's return),
    where it is a class (``Optional[C]``: ``C``, what the value is where it is set)."""
    try:
        if inspect.isclass(owner):
            found = inspect.getattr_static(owner, name, None)
            if isinstance(found, property):
                hint = typing.get_type_hints(found.fget).get("return")
            else:
                hint = _field_annotation(owner, name)
        else:
            hint = typing.get_type_hints(owner).get("return")
    except Exception:  # an annotation that does not evaluate: no type
        return None
    if typing.get_origin(hint) is typing.Union:
        classes = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        hint = classes[0] if len(classes) == 1 else None
    return hint if inspect.isclass(hint) else None


class ExampleUses(ast.NodeVisitor):
    """What a script of examples does with the objects it imports, found from its code (not by
    running it).

    Names are followed through ``import``/``from ... import`` (``sp.ring_attention`` is the object
    ``attn_ref.sequence_parallel.ring_attention``), and values through their annotations: ``x =
    f(...)`` is an instance of ``f``'s annotated return class, ``x.field`` of the field's class. The
    script *calls* an object where a call (or a decorator) names it; it *uses* a class where it
    constructs it, catches it (``except``), or reads or calls an attribute of the class or of an
    instance of it (``report.status(...)``; an inherited attribute is a use of the class that
    defines it); it *reads* a constant where an expression names it. Code in a function counts only
    when the script calls (or passes) that function.
    """

    def __init__(self, script: str):
        tree = ast.parse(script)
        self.names: dict[str, object] = {}  # imported names -> their objects
        self.types: dict[str, type] = {}  # variables -> the class of their value, where annotated
        self.called, self.used, self.read = [], set(), []  # objects; classes; (name, object)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._bind(node)
        self._loads: list[ast.Name] = []  # names the counted code reads
        functions = {
            node.name: node
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        self._skipped = set(functions)
        self.visit(tree)
        # A function counts once the code that counts names it (a call, a callback): until nothing
        # changes.
        while True:
            named = {n.id for n in self._loads if isinstance(n, ast.Name)} & self._skipped
            if not named:
                break
            self._skipped -= named
            for name in named:
                for statement in functions[name].body:
                    self.visit(statement)

    def _bind(self, node) -> None:
        for alias in node.names:
            if isinstance(node, ast.Import):
                module = importlib.import_module(alias.name)
                self.names[alias.asname or alias.name.split(".")[0]] = (
                    module if alias.asname else sys.modules[alias.name.split(".")[0]]
                )
            elif node.level == 0 and alias.name != "*":
                module = importlib.import_module(node.module)
                try:
                    found = getattr(module, alias.name)
                except AttributeError:
                    found = importlib.import_module(f"{node.module}.{alias.name}")
                self.names[alias.asname or alias.name] = found

    def value(self, node):
        """The object an expression names: an imported name and attributes of it (of modules and
        classes only)."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = self.value(node.value)
            if inspect.ismodule(owner) or inspect.isclass(owner):
                return getattr(owner, node.attr, None)
        return None

    def type_of(self, node):
        """The class of an expression's value, where its code and annotations say it."""
        if isinstance(node, ast.Name):
            return self.types.get(node.id)
        if isinstance(node, ast.Call):
            function = self.value(node.func)
            if inspect.isclass(function):
                return function
            if callable(function):
                return _hint(function, "return")
            cls = self.type_of(node.func.value) if isinstance(node.func, ast.Attribute) else None
            return _hint(getattr(cls, node.func.attr, None), "return") if cls else None
        if isinstance(node, ast.Attribute):
            cls = self.type_of(node.value)
            return _hint(cls, node.attr) if cls else None
        return None

    def generic_visit(self, node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:  # applying a decorator calls it
                self._call(decorator)
                self.visit(decorator)
            if node.name in self._skipped:
                return
        if isinstance(node, ast.Lambda):
            return
        super().generic_visit(node)

    def _call(self, function) -> None:
        found = self.value(function)
        if found is not None:
            self.called.append(found)
            if inspect.isclass(found):
                self.used.add(found)

    def visit_Call(self, node):
        self._call(node.func)
        cls = self.type_of(node.func)  # an instance called (a layer): a use of its class
        if cls is not None:
            self.used.add(cls)
        self.generic_visit(node)

    def visit_Assign(self, node):
        cls = self.type_of(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name) and cls is not None:
                self.types[target.id] = cls
        self.generic_visit(node)

    def visit_ExceptHandler(self, node):
        for caught in node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]:
            if inspect.isclass(self.value(caught)):
                self.used.add(self.value(caught))
        self.generic_visit(node)

    def visit_Name(self, node):
        if not isinstance(node.ctx, ast.Load):
            return
        self._loads.append(node)
        if node.id in self.names:
            self.read.append((node.id, self.names[node.id]))

    def visit_Attribute(self, node):
        owner, cls = self.value(node.value), self.type_of(node.value)
        if inspect.isclass(owner):
            self.used.add(_owner(owner, node.attr))
        elif cls is not None:
            self.used.add(_owner(cls, node.attr))
        if self.value(node) is not None:
            self.read.append((node.attr, self.value(node)))
        self.generic_visit(node)

    def uses(self, qualname: str) -> bool:
        """Whether the script calls the function, uses the class or reads the constant
        ``qualname``."""
        found = resolve(qualname)
        if inspect.isclass(found):
            return found in self.used
        if callable(found):
            return any(obj is found for obj in self.called)
        name = qualname.rsplit(".", 1)[-1]
        return any(obj is found and seen == name for seen, obj in self.read)


def api_sections(site: Path) -> list[tuple[str, str, str]]:
    """``(page, qualname, html)`` of every object the API reference renders: from its heading to the
    next."""
    sections = []
    for page in sorted((site / "reference").glob("*/index.html")):
        text = page.read_text(encoding="utf-8")
        starts = [
            (m.start(), m.group(1))
            for m in re.finditer(r'<h[2-6] id="(\w+(?:\.\w+)+)"\s+class="doc doc-heading', text)
        ]
        for n, (start, qualname) in enumerate(starts):
            end = starts[n + 1][0] if n + 1 < len(starts) else len(text)
            sections.append((page.parent.name, qualname, text[start:end]))
    return sections


def resolve(qualname: str):
    """The object a dotted name names: its longest importable module, then attributes."""
    parts = qualname.split(".")
    for n in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for part in parts[n:]:
            found = getattr(found, part)
        return found
    raise ImportError(qualname)


#: The project's packages (the constructors of their classes are documented, others' are not).
PACKAGES = ("attn_ref", "kernels", "errors")
#: Entries the reference renders as attributes: the reference's function bound to the kernels'
#: backend (:func:`attn_ref.sequence_parallel.ring_flash_attn.with_backend`), typed on the
#: reference's page.
BOUND_ENTRIES = {"kernels.sequence_parallel.ring_attention"}


def test_api_reference_has_an_example_for_every_entry(site):
    """Every function, class and constant the API reference documents (not modules, not methods) is
    called, used or read (:class:`ExampleUses`) by the Python examples of its page, the script that
    test_api_reference_examples_run executes."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    without, entries, examples = [], 0, {}
    for page, qualname, _ in api_sections(site):
        parent, name = qualname.rsplit(".", 1)
        if inspect.ismodule(resolve(qualname)) or not inspect.ismodule(resolve(parent)):
            continue
        entries += 1
        if page not in examples:
            examples[page] = ExampleUses(page_script(page))
        if not examples[page].uses(qualname):
            without.append(f"{page}: {qualname}")
    assert entries > 60
    assert not without, (
        "API entries no example calls (a function), uses (a class) or reads (a constant):\n"
        + "\n".join(without)
    )


def test_example_rule_wants_a_call_a_use_or_a_read():
    """:class:`ExampleUses` on a sample that does each thing, and on one that only names each
    entry."""
    entries = [
        "attn_ref.split_bounds",
        "attn_ref.sequence_parallel.shard_positions",
        "attn_ref.call.KVCacheCall",
        "attn_ref.call.BatchTable",
        "errors.CatalogError",
        "attn_ref.sequence_parallel.SELF_GROUP",
        "attn_ref.sequence_parallel.layer.SequenceParallelAttention",
    ]
    good = ExampleUses(
        textwrap.dedent("""\
        import attn_ref
        import errors
        from attn_ref import sequence_parallel as sp
        assert attn_ref.split_bounds(4, 2) == [(0, 2), (2, 4)]
        def positions():
            return sp.shard_positions(8, 0, ring_degree=2)
        positions()
        call = attn_ref.check_kvcache_args(q, k_cache, v_cache)
        print(call.num_heads, call.batch_host.cache_seqlens)    # fields of KVCacheCall, of BatchTable
        try:
            errors.load("missing.json")
        except errors.CatalogError as exc:
            print(exc)
        print(sp.all_gather(x, dim=1, group=sp.SELF_GROUP))
        print(sp.UlyssesAttention.backend)                      # defined by SequenceParallelAttention
        """)
    )
    assert [entry for entry in entries if not good.uses(entry)] == []
    bad = ExampleUses(
        textwrap.dedent("""\
        import attn_ref
        import errors
        from attn_ref import sequence_parallel as sp
        assert callable(attn_ref.split_bounds)                  # named, not called
        def never_called():
            return sp.shard_positions(8, 0, ring_degree=2)
        call = object()
        assert isinstance(call, attn_ref.KVCacheCall) and attn_ref.call.BatchTable is not None
        assert issubclass(errors.CatalogError, Exception)
        assert issubclass(sp.UlyssesAttention, sp.layer.SequenceParallelAttention)
        SELF_GROUP = None                                       # a name of its own
        print(SELF_GROUP)
        """)
    )
    assert [entry for entry in entries if bad.uses(entry)] == []


def test_api_reference_gives_every_parameter_a_type(site):
    """Every parameter of every function, method and class the API reference documents shows a type:
    in its Parameters table, or (no row there) as the annotation in its rendered signature."""
    os.environ.setdefault("TRITON_INTERPRET", "1")  # kernels import without a GPU
    untyped, checked = [], 0
    for page, qualname, section in api_sections(site):
        found = resolve(qualname)
        if not (inspect.isfunction(found) or inspect.isclass(found)):
            continue
        if inspect.isclass(found) and not getattr(found.__init__, "__module__", "").startswith(
            PACKAGES
        ):
            # a constructor not of this project (Exception's, torch.nn.Module's, a NamedTuple's)
            continue
        # a function bound at import: no signature of its own
        if "doc-label-module-attribute" in section:
            assert qualname in BOUND_ENTRIES, (
                f"{qualname} is rendered as an attribute, without parameters"
            )
            continue
        rows = {}
        for table in re.findall(r"Parameters:.*?</table>", section, re.S):
            for row in re.findall(r'<tr class="doc-section-item">(.*?)</tr>', table, re.S):
                cells = [
                    html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
                    for cell in re.findall(r"<td>(.*?)</td>", row, re.S)
                ]
                rows[cells[0].lstrip("*")] = cells[1]
        signature = html.unescape(
            re.sub(r"<[^>]+>", "", section.split("doc-signature", 1)[-1].split("</code>", 1)[0])
        )
        for parameter in inspect.signature(found).parameters.values():
            if parameter.name in ("self", "cls"):
                continue
            checked += 1
            if parameter.name in rows:
                typed = bool(rows[parameter.name])
            else:
                typed = parameter.annotation is not parameter.empty and re.search(
                    rf"\b{parameter.name}: \S", signature
                )
            if not typed:
                untyped.append(f"{page}: {qualname}({parameter.name})")
    assert checked > 300
    assert not untyped, "\n".join(untyped)


def entry_html(site: Path, entry: dict) -> str:
    """The built page of a catalog entry: ``errors/<slug>/``."""
    return (site / "errors" / entry["slug"] / "index.html").read_text(encoding="utf-8")


def test_every_catalog_entry_has_a_page(site, catalog):
    index = (site / "errors" / "index.html").read_text(encoding="utf-8")
    base = catalog["docs_base_url"].rstrip("/")
    for entry in catalog["errors"]:
        page = site / "errors" / entry["slug"] / "index.html"
        assert page.is_file(), entry["slug"]
        # The URLs the catalog (and the exception notes) print are the pages and files built here.
        assert site / entry["docs_url"].removeprefix(base).strip("/") / "index.html" == page
        assert (site / entry["api_url"].removeprefix(base).strip("/")).is_file(), entry["api_url"]
        text = page.read_text(encoding="utf-8")
        assert "Error message" in text and "Solutions" in text, entry["id"]
        # fixed and predicate only; upstream's wordings listed
        if entry["status"] == "upstream_only":
            assert "Recovery" not in text and "Also raised upstream as" in text, entry["id"]
        else:  # a recovery (catch, fall back) only where a backend cannot do the call
            assert ("Recovery" in text) == is_capability_gap(entry), entry["id"]
        assert f'href="{entry["slug"]}/"' in index, f"errors/index does not link {entry['slug']}"


def redirect_target(page: Path) -> str:
    """Where a static redirect page sends the reader (its meta refresh), checked against its plain
    link."""
    text = page.read_text(encoding="utf-8")
    target = re.search(r'<meta http-equiv="refresh" content="0; url=([^"]+)">', text).group(1)
    assert f'<a href="{target}">' in text, page
    return target


def test_id_and_old_slug_urls_redirect_to_the_entry_page(site, catalog):
    """``/errors/<id>/`` (the URLs notes printed before slugs) and ``/errors/<alias>/`` are static
    redirects to ``/errors/<slug>/``, with the published page as canonical link."""
    for entry in catalog["errors"]:
        for name in [entry["id"], *entry.get("aliases", [])]:
            page = site / "errors" / name / "index.html"
            target = (page.parent / redirect_target(page)).resolve()
            assert target == (site / "errors" / entry["slug"]).resolve(), (name, target)
            assert f'<link rel="canonical" href="{entry["docs_url"]}">' in page.read_text(
                encoding="utf-8"
            )


def test_no_internal_link_points_to_an_id_url(site):
    """Links of the site (pages, search index, JSON API) name the slug URL; only redirects name
    ids."""
    id_url = re.compile(r"errors/[0-9a-f]{16}/")
    found = {}
    for path in sorted(site.rglob("*")):
        text = path.read_text(encoding="utf-8") if path.suffix in (".html", ".json", ".js") else ""
        if 'http-equiv="refresh"' in text:  # a redirect page names the id it serves
            continue
        hits = sorted(set(id_url.findall(text)))
        if hits:
            found[path.relative_to(site).as_posix()] = hits[:3]
    assert not found, found


def test_upstream_errors_page_links_every_message_to_its_entry(site):
    text = (site / "errors" / "upstream" / "index.html").read_text(encoding="utf-8")
    for data in upstream.load_all():
        assert f">{data['title']}</h2>" in re.sub(r"<a [^>]*>.*?</a>", "", text), data["source"]
        for message in data["messages"]:
            href = posixpath.relpath(
                f"errors/{cat.get(message['entry'])['slug']}", "errors/upstream"
            )
            assert f'href="{href}/"' in text, message["template"]
    page = entry_html(site, cat.get("varlen/index-not-int32"))
    assert "Also raised upstream as" in page and "seqused_k must have dtype int32" in page
    # a bare assert is listed by its source, said to have no message
    page = entry_html(site, cat.get("sequence-parallel/alibi-not-supported"))
    assert "assert alibi_slopes is None" in page and "a bare assert" in page
    assert "AssertionError: assert alibi_slopes" not in page + text


def test_error_pages_show_the_real_output_and_sit_in_the_nav(site, catalog):
    """The trigger's exception line, as raised at build time; the sidebar and previous/next
    links."""
    for entry in catalog["errors"]:
        text = entry_html(site, entry)
        assert 'class="md-footer__link md-footer__link--prev"' in text, entry["id"]
        assert "md-nav__link--active" in text, f"{entry['id']} is not in the nav"
        if entry["status"] == "active":
            printed = html.unescape(
                re.sub(r"<[^>]+>", "", text.split("What Python prints", 1)[1].split("</pre>", 1)[0])
            )
            # a class of the tree prints its module too
            type_line = next(
                line
                for line in printed.splitlines()
                if line.split(": ", 1)[0].rsplit(".", 1)[-1] == entry["exception"]["type"]
            )
            assert re.fullmatch(entry["message"]["regex"], type_line.split(": ", 1)[1]), (
                entry["id"],
                type_line,
            )
        for alias in entry.get("external_aliases", []):
            assert alias["id"] in text, (entry["id"], alias["id"])


def test_error_pages_highlight_the_raise(site, catalog):
    for entry in catalog["errors"]:
        if entry["source"] is None:  # upstream-only: no raise of the package to show
            continue
        text = entry_html(site, entry)
        highlighted = text.split('<span class="hll">', 1)[1].split("</span>\n", 1)[0]
        assert "raise" in highlighted, entry["id"]


def test_entry_json_is_the_catalog_entry_byte_for_byte(site, catalog):
    stored = cat.CATALOG_PATH.read_text(encoding="utf-8")
    for entry in catalog["errors"]:
        published = (site / "api" / "errors" / f"{entry['id']}.json").read_bytes()
        assert published == entry_json(entry).encode("utf-8")
        assert json.loads(published) == entry
        assert textwrap.indent(published.decode("utf-8").rstrip("\n"), "    ") in stored, entry[
            "id"
        ]


def test_index_json_lists_exactly_the_catalog_ids(site, catalog):
    index = json.loads((site / "api" / "errors" / "index.json").read_text(encoding="utf-8"))
    assert [row["id"] for row in index["errors"]] == [entry["id"] for entry in catalog["errors"]]
    published = {p.stem for p in (site / "api" / "errors").glob("*.json")} - {"index", "schema"}
    assert published == {entry["id"] for entry in catalog["errors"]}
    assert (site / "api" / "errors" / "schema.json").read_bytes() == cat.SCHEMA_PATH.read_bytes()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site.parent))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{SITE_PATH}"
    server.shutdown()


class Browser:
    """One Chromium page on the served site that records every problem a reader would meet.

    Every request that leaves the site is recorded and aborted (as offline); console errors, page
    errors, failed requests and HTTP errors are recorded too. :meth:`problems` returns and clears
    them.
    """

    def __init__(self, playwright, served: str):
        self.served = served
        # Playwright hides scrollbars in headless mode; a reader sees them (the code-block test
        # measures them).
        self.browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=CHROMIUM_FLAGS,
            ignore_default_args=["--hide-scrollbars"],
        )
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 900})
        self._problems: list[str] = []
        self.page.route("**/*", self._route)
        self.page.on("pageerror", lambda exc: self._problems.append(f"page error: {exc}"))
        self.page.on(
            "console",
            lambda msg: (
                self._problems.append(f"console {msg.type}: {msg.text}")
                if msg.type == "error"
                else None
            ),
        )
        # A request cut off by the next navigation (net::ERR_ABORTED, e.g. the favicon) is no fault;
        # a missing file shows up as an HTTP error below.
        self.page.on(
            "requestfailed",
            lambda r: (
                self._problems.append(f"failed: {r.url} ({r.failure})")
                if r.url.startswith(served) and r.failure != "net::ERR_ABORTED"
                else None
            ),
        )
        self.page.on(
            "response",
            lambda r: (
                self._problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None
            ),
        )

    def _route(self, route):
        url = route.request.url
        if url.startswith(self.served + "/") or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            self._problems.append(f"request outside the site: {url}")
            route.abort()

    def problems(self) -> list[str]:
        found, self._problems = self._problems, []
        return found

    def open(self, path: str):
        response = self.page.goto(self.served + path)
        assert response is not None and response.ok, path
        # MathJax (tutorial pages) typesets after load: wait until it is done.
        self.page.evaluate(
            "() => window.MathJax && MathJax.startup ? MathJax.startup.promise.then(() => null) : "
            "null"
        )
        return self.page


@pytest.fixture(scope="module")
def browser(served):
    assert CHROMIUM.is_file(), (
        "Debian's chromium is missing: `make browser` installs it (apt-get install chromium)"
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Playwright gives the browser a fresh, empty profile (toolchain.md's --user-data-dir)
        # itself.
        reader = Browser(playwright, served)
        yield reader
        reader.browser.close()


#: Text outside code that still looks like TeX: a backslash command or $-delimited math.
RAW_TEX = r"/\\[a-zA-Z]{2,}|\$\$|\$[^$\s][^$]*\$/"
PAGE_FAULTS = (
    """() => {
  const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src);
  const walker = document.createTreeWalker(document.querySelector("article") || document.body, NodeFilter.SHOW_TEXT);
  const tex = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (parent.closest("pre, code, script, style, mjx-container")) continue;
    if (!parent.getClientRects().length) continue;  // not shown
    const found = node.textContent.match(%s);
    if (found) tex.push(found[0]);
  }
  // Inside typeset math: a TeX error, or a backslash left over (e.g. \\_ in \\text{...}), which the
  // hidden MathML copy that MathJax keeps for screen readers shows.
  document.querySelectorAll("mjx-merror").forEach(e => tex.push("MathJax error: " + e.getAttribute("data-mjx-error")));
  document.querySelectorAll("mjx-assistive-mml").forEach(m => { if (m.textContent.includes("\\\\")) tex.push(m.textContent); });
  return {broken, tex};
}"""
    % RAW_TEX
)

#: The code blocks of the page (every tab's too; notebook outputs aside) whose text runs past the
#: box that clips it: the right edge of the text's line boxes against the nearest box with an
#: overflow that is not visible. For each: how far past, whether that box scrolls with a scrollbar
#: a reader sees, and the block's first long line.
CLIPPED_CODE = """() => {
  const style = document.createElement("style");
  style.textContent = ".md-typeset .tabbed-set > .tabbed-content > .tabbed-block { display: block !important; }";
  document.head.appendChild(style);
  const clipped = [];
  for (const pre of document.querySelectorAll("article pre")) {
    if (!pre.getClientRects().length || pre.closest(".jp-OutputArea")) continue;
    const range = document.createRange();
    range.selectNodeContents(pre);
    let right = -Infinity;
    for (const r of range.getClientRects()) if (r.width > 0) right = Math.max(right, r.right);
    let edge = Infinity, clip = null;
    for (let el = pre.querySelector("code") || pre; el.tagName !== "ARTICLE"; el = el.parentElement) {
      if (getComputedStyle(el).overflowX === "visible") continue;
      const e = el.getBoundingClientRect().left + el.clientLeft + el.clientWidth;
      if (e < edge) { edge = e; clip = el; }
    }
    if (right <= edge + 1) continue;
    const s = getComputedStyle(clip);
    const bar = clip.offsetHeight - clip.clientHeight - parseFloat(s.borderTopWidth) - parseFloat(s.borderBottomWidth);
    const thumb = (s.scrollbarColor.match(/rgba?\\([^)]*\\)/) || ["auto"])[0];
    clipped.push({over: Math.round(right - edge), line: pre.textContent.split("\\n").find(l => l.length > 50) || "",
      scrollbar: ["auto", "scroll"].includes(s.overflowX) && s.scrollbarWidth !== "none" && bar > 0 && !/, 0\\)$/.test(thumb)});
  }
  style.remove();
  return clipped;
}"""


def site_pages(site: Path) -> list[str]:
    """The URL path of every HTML page of the built site."""
    pages = []
    for page in sorted(site.rglob("*.html")):
        if 'http-equiv="refresh"' in page.read_text(encoding="utf-8"):  # a redirect to another page
            continue
        rel = page.relative_to(site).as_posix()
        pages.append("/" + rel.removesuffix("index.html"))
    return pages


def heading(page) -> str:
    """The page's h1 without Material's permalink sign."""
    return page.locator("article h1").first.inner_text().rstrip("¶").strip()


def test_browser_every_page_offline_without_errors(browser, site):
    """Every page: no request outside the site, no console error, every image loads, no raw TeX;
    at 1400 px no code line of a tutorial, side-by-side or error page runs past its block (it fits
    or wraps behind a continuation mark: :data:`CLIPPED_CODE`).

    The catalog's entry pages (over 150, one template) are sampled: every third, in a rotation
    that changes each UTC day, so each is visited within three days; ``ATTN_REF_ALL_PAGES=1``
    visits all of them."""
    pages = site_pages(site)
    assert len(pages) > 100 and "/tutorials/02_masks_and_positions/" in pages
    if not os.environ.get("ATTN_REF_ALL_PAGES"):
        day = datetime.datetime.now(datetime.timezone.utc).toordinal()
        entry_pages = [p for p in pages if p.startswith("/errors/") and p.count("/") > 3]
        skipped = set(entry_pages) - set(entry_pages[day % 3 :: 3])
        pages = [p for p in pages if p not in skipped]
    # Material's search builds its index in a worker on every page load; here (not in the search
    # test) it gets an empty index, which saves about a fifth of this test's time.
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    empty = json.dumps({"config": index["config"], "docs": []})
    browser.page.route(
        "**/search/search_index.json",
        lambda route: route.fulfill(content_type="application/json", body=empty),
    )
    faults = {}
    for path in pages:
        page = browser.open(path)
        found = page.evaluate(PAGE_FAULTS)
        problems = (
            browser.problems()
            + [f"broken image {src}" for src in found["broken"]]
            + [f"raw TeX {tex!r}" for tex in found["tex"]]
        )
        if path.startswith(("/tutorials/", "/side-by-side/", "/errors/")):
            problems += [f"code cut off: {block}" for block in page.evaluate(CLIPPED_CODE)]
        if problems:
            faults[path] = problems
    browser.page.unroute("**/search/search_index.json")
    assert not faults, "\n".join(
        f"{path}: {problem}" for path, problems in faults.items() for problem in problems
    )
    page = browser.open("/tutorials/02_masks_and_positions/")
    assert page.locator("mjx-container").count() > 20, "MathJax typeset the tutorial's math"


def raised(call) -> BaseException:
    """The exception ``call()`` raises (it must raise)."""
    try:
        call()
    except (ValueError, TypeError, NotImplementedError) as exc:
        return exc
    raise AssertionError("the call did not raise")


def real_errors() -> list[BaseException]:
    """Errors raised by the package itself, with numbers in their messages."""
    import torch

    import attn_ref
    from attn_ref.sequence_parallel import UlyssesAttention

    q, cache, new = torch.zeros(1, 1, 2, 8), torch.zeros(1, 8, 2, 8), torch.zeros(1, 1, 2, 8)
    x = torch.zeros(1, 4, 2, 8)
    return [
        raised(
            lambda: attn_ref.flash_attn_with_kvcache(
                q, cache, cache.clone(), k=new, v=new, cache_seqlens=8
            )
        ),
        raised(lambda: UlyssesAttention(2, 8)(x, x, x, replicated_q=x)),
        raised(lambda: attn_ref.flash_attn_with_kvcache([1], cache, cache)),
        raised(lambda: attn_ref.flash_attn_with_kvcache(q, cache, cache, num_splits=1.5)),
    ]


def pasted_search_results(browser, text: str, count: int) -> list[str]:
    """Paste ``text`` into Material's search box; the links of the first ``count`` results once the
    catalog's matches are shown (error-search.js adds them when the text matches an entry's regex,
    or is a fragment of its messages)."""
    page = browser.page
    page.locator("label.md-search__icon, .md-search__input").first.click()
    # a paste: one input event with the whole text
    page.locator("input.md-search__input").fill(text)
    page.locator(".md-search-result__list > .error-search-match").first.wait_for(timeout=10_000)
    items = page.locator(".md-search-result__item")
    return [
        items.nth(n).locator("a").first.get_attribute("href") or ""
        for n in range(min(count, items.count()))
    ]


def first_search_result(browser, text: str) -> str:
    return pasted_search_results(browser, text, 1)[0]


def test_browser_pasted_messages_find_their_entry_first(browser, catalog):
    errors = real_errors()
    assert "exceeds the cache capacity (8 tokens per sequence)" in str(errors[0])
    assert str(errors[1]) == "Replicated Q, K, and V must be provided together."
    page = browser.open("/")
    # Every catalog regex compiles in the browser (error-search.js leaves out those that do not).
    matchable = [e["id"] for e in catalog["errors"] if cat.literal_length(e)]
    loaded = page.evaluate("async () => (await attnRefErrorSearch.load()).map(e => e.id)")
    # upstream's wordings too
    assert loaded == matchable + [m["entry"] for _, m in upstream.messages()]
    for exc in errors:
        for pasted in (str(exc), f"{type(exc).__name__}: {exc}"):
            # The entry `python -m errors explain` gives for the same text (a template that two
            # raise sites share leads to one of them, as there).
            entry = cat.lookup(pasted, catalog)
            assert entry is not None, pasted
            href = first_search_result(browser, pasted)
            assert href.rstrip("/").endswith(f"errors/{entry['slug']}"), (pasted, href)
    # Upstream's messages, as users paste them, open the entry `explain` gives (a few forms: every
    # message in every form is checked against errors.lookup in test_errors_upstream.py).
    for pasted in (
        "RuntimeError: seqused_k must have dtype int32",
        "RuntimeError: q must be on CUDA\nException raised from mha_fwd at "
        "/src/hopper/flash_api.cpp:745 (most recent call first):\nframe #0: "
        "c10::Error::Error(c10::SourceLocation, std::string) + 0x9c",
        "block_table must have contiguous last dimension",
        "AssertionError: zigzag ring is meaningless for causal=False",
        'Traceback (most recent call last):\n  File "/venv/site-packages/ring_flash_attn/'
        'zigzag_ring_flash_attn.py", line 221, in forward\n    assert alibi_slopes is None\n'
        "           ^^^^^^^^^^^^^^^^^^^^\nAssertionError",
        "RuntimeError: FlashAttention only supports Ampere GPUs or newer",
    ):
        entry = cat.lookup(pasted, catalog)
        href = first_search_result(browser, pasted)
        assert href.rstrip("/").endswith(f"errors/{entry['slug']}"), (pasted, href)
    # Every form of every upstream message (bare asserts by a traceback's code line, near misses
    # in other letter case), and near misses of the package's own: the entry `explain` gives.
    queries = [form for _, m in upstream.messages() for form in pasted_forms(m).values()]
    queries += [
        "q CAN ONLY BE NONE WHEN ONLY_QV=TRUE.",
        'ValueError: backend must be "gloo" or "nccl", got \u2018mpi\u2019',
    ]
    listed = page.evaluate(
        "async queries => { const out = []; for (const q of queries) "
        "out.push(await attnRefErrorSearch.matches(q)); return out; }",
        queries,
    )
    differ = [
        (query, shown, cat.lookup(query, catalog)["slug"])
        for query, shown in zip(queries, listed)
        if shown[:1] != [cat.lookup(query, catalog)["slug"]]
    ]
    assert not differ, differ[:5]
    for exc in errors[:2]:  # messages of one raise site: the entry of the exception itself
        assert cat.lookup(str(exc), catalog)["id"] == cat.lookup(exc, catalog)["id"]
    # Free text still searches the pages.
    browser.page.locator("input.md-search__input").fill("")
    browser.page.locator("input.md-search__input").press_sequentially("only_qv", delay=10)
    first = browser.page.locator(".md-search-result__item").first
    first.wait_for(timeout=15_000)
    assert "only_qv" in first.inner_text().replace("\u200b", "")
    assert browser.problems() == []


#: Fragments of messages as a user remembers or copies them (a middle part, with or without the
#: tensor name, with the numbers a real run prints, upstream's wordings), each with the entries it
#: must list first: several where the fragment is in messages of several entries.
MESSAGE_FRAGMENTS = {
    "must have contiguous last dimension": {
        "arguments/non-contiguous-last-dim",
        "arguments/output-not-contiguous",
        "upstream/not-contiguous",
    },
    # FA3's wording, cut short
    "k_cache must have contiguous": {"arguments/non-contiguous-last-dim"},
    "cache_seqlens must have dtype": {"arguments/wrong-dtype"},
    "disagree on": {"sequence-parallel/ranks-disagree"},
    "ValueError: group disagree on q dtype (rank 0: torch.float16, rank 1:": {
        "sequence-parallel/ranks-disagree"
    },
    "every rank must make the same call": {"sequence-parallel/ranks-disagree"},
    "page_size >= 1, got page_size 0": {"paged/zero-page-size"},
    "exceeds the cache capacity (8 tokens per sequence)": {"kv-cache/capacity-exceeded"},
    "cache_seqlens (8) + new tokens (1)": {"kv-cache/capacity-exceeded"},
    "must be a torch.Tensor, got list": {
        "arguments/not-a-tensor",
        "sequence-parallel/not-a-tensor",
    },
    "Replicated Q, K, and V must be": {"sequence-parallel/replicated-qkv-together"},
    "num_splits must be an int <= 256": {"options/bad-num-splits"},
    "need 0 <= cache_leftpad <= cache_seqlens": {"kv-cache/leftpad-exceeds-seqlens"},
    "values must lie in [0, 4), got": {"kv-cache/index-out-of-range"},
    # ring-flash-attention's assert, and this package's zigzag varlen refusal in its words
    "zigzag ring is meaningless": {
        "upstream/ring-needs-causal",
        "sequence-parallel/zigzag-varlen-needs-causal",
    },
    "head dimension at most 256": {"upstream/head-dim-too-large"},  # FlashAttention's check
    "only supports ver=3, got 2": {"kv-cache/unsupported-ver"},  # sglang's wrapper
}


def test_browser_message_fragments_find_their_entries_first(browser, catalog):
    printed = " ".join(str(exc) for exc in real_errors())
    for fragment in (
        "cache_seqlens (8) + new tokens (1)",
        "exceeds the cache capacity (8 tokens per sequence)",
        "must be a torch.Tensor, got list",
        "num_splits must be an int <= 256",
    ):
        assert fragment in printed, fragment  # as a real run prints it
    assert len({slug for slugs in MESSAGE_FRAGMENTS.values() for slug in slugs}) >= 10
    page = browser.open("/")
    missed = {}
    for fragment, slugs in MESSAGE_FRAGMENTS.items():
        assert all(cat.get(slug) for slug in slugs)
        assert cat.lookup(fragment, catalog) is None, (
            f"{fragment!r} is a whole message, not a fragment"
        )
        found = [
            href.rstrip("/").split("errors/", 1)[-1]
            for href in pasted_search_results(browser, fragment, len(slugs))
        ]
        if set(found) != slugs:
            missed[fragment] = found
    assert not missed, missed
    # Concept words are no fragment: they keep the site's own ranking (the concept pages first).
    for words in CONCEPT_WORDS + ["sequence parallel", "KV cache", "paged KV cache"]:
        assert page.evaluate("words => attnRefErrorSearch.matches(words)", words) == [], words
    assert browser.problems() == []


#: Per row of the pages' side-by-side grids (docs_hooks/side_by_side.py): the boxes of its shown
#: code cells, and whether its code lines may wrap.
ROW_LAYOUT = """() => [...document.querySelectorAll(".sbs-row:not(.sbs-heads)")].map(row => {
  const cells = [...row.querySelectorAll(".sbs-cell")].filter(c => c.getClientRects().length);
  const boxes = cells.map(c => c.getBoundingClientRect());
  const codes = [...row.querySelectorAll("pre > code")];
  const wraps = codes.length ? codes.every(c => getComputedStyle(c).whiteSpace === "pre-wrap") : null;
  return {tops: boxes.map(b => Math.round(b.y)), lefts: boxes.map(b => Math.round(b.x)), wraps};
})"""
ROW_BACKGROUNDS = """() => [...document.querySelectorAll(".sbs-row:not(.sbs-heads)")].map(r => getComputedStyle(r).backgroundColor)"""
OVERFLOW = "() => document.documentElement.scrollWidth - window.innerWidth"
SIDE_BY_SIDE_PAGES = [
    "call",
    "addressing",
    "attention",
    "split-kv",
    "sequence-parallel",
    "backward",
]


def test_browser_side_by_side_rows_align_and_narrow_screens(browser, catalog):
    """Every side-by-side page: from 1400 px down to 1000 px each row's two cells stand side by side
    at one height and a long code line wraps; at 420 px they stack (reference over kernel), code
    keeps its lines (a cell scrolls) and the page never scrolls sideways. Pointing at a row marks that row only, its own
    counterparts. The error index and an error page read at 420 px. ATTN_REF_DOCS_SHOTS=<dir> saves
    screenshots there."""
    shots = os.environ.get("ATTN_REF_DOCS_SHOTS")
    page, entry = browser.page, catalog["errors"][0]
    for width in (1400, 1000, 420):
        page.set_viewport_size({"width": width, "height": 1000})
        for name in SIDE_BY_SIDE_PAGES:
            browser.open(f"/side-by-side/{name}/")
            rows = page.evaluate(ROW_LAYOUT)
            assert len(rows) >= 4, name
            for number, row in enumerate(rows):
                assert row["wraps"] in (None, width >= 720), (width, name, number)
                if width >= 1000:
                    assert len(row["tops"]) == 2 and row["tops"][0] == row["tops"][1], (
                        width,
                        name,
                        number,
                        row,
                    )
                    assert row["lefts"][0] < row["lefts"][1], (width, name, number, row)
                else:
                    assert len(set(row["lefts"])) == 1 and row["tops"] == sorted(row["tops"]), (
                        width,
                        name,
                        number,
                        row,
                    )
            assert page.evaluate(OVERFLOW) <= 0, (width, name)
            if shots and name == "attention":
                page.screenshot(path=f"{shots}/side-by-side_{width}.png")
    page.set_viewport_size({"width": 1400, "height": 1000})
    browser.open("/side-by-side/attention/")
    page.mouse.move(0, 0)
    before = page.evaluate(ROW_BACKGROUNDS)
    page.locator(".sbs-row:not(.sbs-heads) .sbs-reference code").nth(2).hover()
    after = page.evaluate(ROW_BACKGROUNDS)
    changed = [n for n, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(changed) == 1, changed
    page.set_viewport_size({"width": 420, "height": 900})
    for path in ("/errors/", f"/errors/{entry['slug']}/"):
        browser.open(path)
        assert page.evaluate(OVERFLOW) <= 0, path
        link = page.locator(".error-index a, article h1").first.bounding_box()
        assert link["x"] >= 0 and link["x"] + link["width"] <= 420, path
        if shots:
            page.screenshot(
                path=f"{shots}/{'error-index' if path == '/errors/' else 'error-page'}_420.png"
            )
    if shots:
        page.set_viewport_size({"width": 1400, "height": 1000})
        browser.open(f"/errors/{entry['slug']}/")
        page.screenshot(path=f"{shots}/error-page_1400.png")
    page.set_viewport_size({"width": 1400, "height": 900})
    assert browser.problems() == []


def test_browser_home_and_an_error_page(browser, catalog):
    assert heading(browser.open("/")) == "attn-ref"
    entry = catalog["errors"][0]
    page = browser.open(f"/errors/{entry['slug']}/")
    assert heading(page) == entry["summary"]
    # The id URL (and an old slug) redirect to the entry's page.
    renamed = next(e for e in catalog["errors"] if e.get("aliases"))
    for old, new in ((entry["id"], entry["slug"]), (renamed["aliases"][0], renamed["slug"])):
        page = browser.open(f"/errors/{old}/#solutions")
        page.wait_for_url(f"**/errors/{new}/#solutions")
        assert heading(page) == cat.get(new)["summary"]
    assert page.locator("article").get_by_text("What it means").count() == 1
    # The longest message and its captured output wrap at 1400 px: nothing is cut at the column's
    # edge.
    longest = max(
        (e for e in catalog["errors"] if e["status"] == "active"),
        key=lambda e: len(e["message"]["template"]),
    )
    page = browser.open(f"/errors/{longest['slug']}/")
    widths = page.evaluate(
        "() => [...document.querySelectorAll('.error-text pre > code')].map(c => [c.scrollWidth, "
        "c.clientWidth])"
    )
    assert len(widths) == 2 and all(scroll <= client + 1 for scroll, client in widths), (
        longest["id"],
        widths,
    )
    assert browser.problems() == []


#: The learning path of the home page's "Start here" list, in order (URL path endings).
LEARNING_PATH = [
    "notation/",
    "concepts/",
    "tutorials/01_kvcache_decoding/",
    "tutorials/02_masks_and_positions/",
    "tutorials/03_mla_qv_only_qv/",
    "tutorials/04_flash_decoding/",
    "tutorials/05_sequence_parallel/",
    "tutorials/06_error_catalog/",
    "tutorials/07_backward/",
    "tutorials/08_transformers_serving/",
    "tutorials/09_conformance/",
    "tutorials/10_training_packed/",
    "tutorials/11_ring_training/",
    "side-by-side/",
    "errors/",
]
START_HERE = """() => {
  const list = document.getElementById("start-here").nextElementSibling.nextElementSibling;
  return [...list.querySelectorAll("a")].map(a => a.href);
}"""
#: Control characters (not newline) in the text a reader sees, outside code blocks.
SHOWN_CONTROL = r"""() => {
  const walker = document.createTreeWalker(document.querySelector("article"), NodeFilter.SHOW_TEXT);
  const found = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement.closest("pre, script, style")) continue;
    const hit = node.textContent.match(/[\x00-\x09\x0b-\x1f\x7f]/);
    if (hit) found.push(node.textContent.slice(0, 60));
  }
  return found;
}"""


def test_browser_learning_path_in_order(browser):
    """The nav's first sections and the home page's "Start here" list follow the path; every page of
    it opens, shows no control character; the ring tutorial's hand-run ring passed its assert; the
    ring diagram keeps its size (10 pt labels) on a 420 px screen."""
    page = browser.open("/")
    tabs = [text.strip() for text in page.locator(".md-tabs__link").all_inner_texts()]
    assert tabs[:6] == ["Home", "Notation", "Concepts", "Tutorials", "Side by side", "Errors"], tabs
    links = page.evaluate(START_HERE)
    assert [link.removeprefix(browser.served + "/") for link in links] == LEARNING_PATH
    for link in links:
        page = browser.open(link.removeprefix(browser.served))
        assert heading(page), link
        assert page.evaluate(SHOWN_CONTROL) == [], link
    page = browser.open("/tutorials/05_sequence_parallel/")
    assert "merged with the LSE == dense causal attention" in page.locator("article").inner_text()
    page.set_viewport_size({"width": 420, "height": 900})
    browser.open("/concepts/sequence-parallel/")
    # Diagrams keep their drawn size on a phone (the wide ones scroll inside their paragraph).
    sizes = page.evaluate("""() => [...document.querySelectorAll('article img[src$=".svg"]')]
      .map(img => [img.getAttribute("src"), img.getBoundingClientRect().width, img.naturalWidth])""")
    assert any(src.endswith("ring_steps.svg") for src, _, _ in sizes), sizes
    assert all(shown >= natural - 1 for _, shown, natural in sizes), sizes  # not scaled down
    assert page.evaluate(OVERFLOW) <= 0  # the page itself does not scroll sideways
    page.set_viewport_size({"width": 1400, "height": 900})
    assert browser.problems() == []


#: Concept words a learner types; the first search results must be concept pages or tutorials, not
#: error entries (entry pages carry a search boost below 1: docs_hooks/error_pages.SEARCH_BOOST).
CONCEPT_WORDS = [
    "cache_seqlens",
    "ring attention",
    "page_table",
    "zigzag",
    "grouped-query",
    "split-KV",
    "softcap",
]


def search_results(browser, words: str, count: int = 3) -> list[str]:
    """The links of the first ``count`` results Material's search lists for ``words``, typed."""
    page = browser.page
    page.locator("label.md-search__icon, .md-search__input").first.click()
    box = page.locator("input.md-search__input")
    box.fill("")
    box.press_sequentially(words, delay=10)
    items = page.locator(".md-search-result__item")
    links, previous = [], None
    # the list is re-rendered after each keystroke: read it until two reads agree
    for _ in range(50):
        items.first.wait_for(timeout=15_000)
        page.wait_for_timeout(300)
        links = [
            items.nth(n).locator("a").first.get_attribute("href") or ""
            for n in range(min(count, items.count()))
        ]
        if links and links == previous:
            return links
        previous = links
    return links


def test_browser_search_ranks_concepts_above_error_pages(browser):
    browser.open("/")
    ranked = {words: search_results(browser, words) for words in CONCEPT_WORDS}
    misranked = {words: links for words, links in ranked.items() if "/errors/" in links[0]}
    assert not misranked, misranked
    assert any("concepts/sequence-parallel" in link for link in ranked["ring attention"][:2]), (
        ranked["ring attention"]
    )
    assert browser.problems() == []


#: A term a learner types -> the page its results must start with (the concept that explains it).
SEARCH_FIRSTS = {
    "ring": "concepts/sequence-parallel/",
    "LSE": "concepts/split-kv/",
    "all-to-all": "concepts/sequence-parallel/",
}


def test_browser_search_puts_the_concept_first_for_its_term(browser):
    """Material's search, typed: each term of :data:`SEARCH_FIRSTS` lists its concept page first
    (the search tags of docs_hooks/search_tags.py), not the API reference."""
    browser.open("/")
    firsts = {words: search_results(browser, words, 1)[0] for words in SEARCH_FIRSTS}
    wrong = {
        words: first
        for words, first in firsts.items()
        if not first.split("?")[0].endswith("/" + SEARCH_FIRSTS[words])
    }
    assert not wrong, wrong
    assert browser.problems() == []


#: The pages the phone-width code test reads besides every side-by-side page: tutorials with code
#: cells, a markdown code block and long lines, and the error pages with the longest example lines.
NARROW_TUTORIALS = ["05_sequence_parallel", "06_error_catalog", "09_conformance"]
NARROW_ERROR_PAGES = 2
#: Per wrapped code line (a line box taller than a row): whether its continuation mark is drawn.
CONTINUATION_MARKS = """() => [...document.querySelectorAll("article .code-line")]
  .filter(line => line.getClientRects().length && line.getBoundingClientRect().height > 1.5 * parseFloat(getComputedStyle(line).lineHeight))
  .map(line => {
    const mark = getComputedStyle(line, "::before");
    return mark.content !== "none" && parseFloat(mark.height) > 0 && mark.maskImage.startsWith("url(");
  })"""


def test_browser_code_lines_wrap_wide_and_scroll_narrow(browser, catalog):
    """At 1400 px a wrapped code line shows its continuation mark, and the code copied from a
    block is its lines, no newline added (every page's clipped code: the every-page test). At
    420 px a tutorial, side-by-side or error page's block that is wider than the screen scrolls,
    with a scrollbar a reader sees."""
    page = browser.page
    page.set_viewport_size({"width": 1400, "height": 900})
    browser.open("/side-by-side/addressing/")
    marks = page.evaluate(CONTINUATION_MARKS)
    assert marks and all(marks), marks
    browser.open("/tutorials/05_sequence_parallel/")
    marks = page.evaluate(CONTINUATION_MARKS)
    assert marks and all(marks), marks
    copied = page.evaluate(
        """() => [...document.querySelectorAll("article .highlight-ipynb pre")].slice(0, 3)
          .map(pre => [pre.innerText, pre.textContent])"""
    )
    assert all(shown == text.rstrip("\n") or shown == text for shown, text in copied), copied
    longest = sorted(catalog["errors"], key=lambda e: -longest_example_line(e))
    paths = (
        [f"/side-by-side/{name}/" for name in SIDE_BY_SIDE_PAGES]
        + [f"/tutorials/{name}/" for name in NARROW_TUTORIALS]
        + [f"/errors/{entry['slug']}/" for entry in longest[:NARROW_ERROR_PAGES]]
    )
    page.set_viewport_size({"width": 420, "height": 900})
    unscrollable, scrolled = {}, 0
    for path in paths:
        browser.open(path)
        clipped = page.evaluate(CLIPPED_CODE)
        scrolled += len(clipped)
        bad = [block for block in clipped if not block["scrollbar"]]
        if bad:
            unscrollable[path] = bad
    page.set_viewport_size({"width": 1400, "height": 900})
    assert scrolled > 50, scrolled  # phone-width blocks do scroll: the test reads real cases
    assert not unscrollable, unscrollable
    assert browser.problems() == []


def longest_example_line(entry: dict) -> int:
    """Characters in the longest line of the entry's examples."""
    codes = [x["code"] if isinstance(x, dict) else x for x in entry.get("examples", {}).values()]
    return max((len(line) for code in codes if code for line in code.splitlines()), default=0)


def test_browser_every_tab_fits_at_1400_px(browser):
    """The tab bar shows every tab's whole title at 1400 px (none cut at the right edge)."""
    page = browser.open("/")
    cut = page.evaluate(
        """() => {
          const list = document.querySelector(".md-tabs__list");
          const edge = list.getBoundingClientRect().right;
          const cut = [...list.querySelectorAll(".md-tabs__link")]
            .filter(a => a.getBoundingClientRect().right > edge + 0.5).map(a => a.textContent.trim());
          if (list.scrollWidth > list.clientWidth + 1) cut.push(`scrolls ${list.scrollWidth} > ${list.clientWidth}`);
          return cut;
        }"""
    )
    assert cut == [], cut
    assert browser.problems() == []


def test_tutorial_sources_keep_prose_out_of_code_cells():
    """No markdown heading or blank comment line (a markdown paragraph break) inside a code cell of a
    tutorial source: a missing ``# %% [markdown]`` marker shows the prose as code."""
    import jupytext

    found = []
    for source in sorted((ROOT / "tutorials_src").glob("[0-9][0-9]_*.py")):
        notebook = jupytext.read(source, fmt="py:percent")
        for number, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            found += [
                (source.name, number, line)
                for line in cell.source.splitlines()
                if PROSE_IN_CODE.match(line)
            ]
    assert not found, found


#: A line of a code cell that is markdown: a heading (``# ## Title``) or a lone ``#`` (a paragraph
#: break of ``#``-commented prose).
PROSE_IN_CODE = re.compile(r"#\s*$|#\s+#{1,6}\s")


def test_prose_in_code_rule_catches_a_missing_marker():
    assert PROSE_IN_CODE.match("# ## Replicated tokens are counted once")
    assert PROSE_IN_CODE.match("#")
    assert not PROSE_IN_CODE.match("# (S/P, h, d)")
    assert not PROSE_IN_CODE.match("x = 1  # ## not at the start")


def test_search_index_titles_have_no_permalink_sign(site):
    """No section title of the search index ends in "¶" (notebook headings' permalinks are Material's
    headerlinks, which the index leaves out: docs_hooks/tutorials.py)."""
    docs = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    assert any(d["location"].startswith("tutorials/") and "#" in d["location"] for d in docs)
    assert [d["title"] for d in docs if "¶" in d["title"]] == []


#: ``href`` and ``src`` of the built pages.
LINK = re.compile(r'<(?:a|img|link|script)\b[^>]*?\b(?:href|src)="([^"]*)"')


def test_internal_links_of_the_built_site_resolve(site):
    """Every link from a page of the built site to the site (notebook pages included, whose
    markdown links mkdocs does not check) reaches a file, and its #fragment an id of that page."""
    ids: dict[Path, set[str]] = {}
    broken = []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        for url in map(html.unescape, LINK.findall(text)):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme or url.startswith("//"):
                continue
            base = site.parent if parts.path.startswith("/") else page.parent
            target = (base / urllib.parse.unquote(parts.path).lstrip("/")).resolve()
            if not parts.path:
                target = page
            elif target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append((page.relative_to(site).as_posix(), url))
            elif parts.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(
                        re.findall(r'\b(?:id|name)="([^"]+)"', target.read_text(encoding="utf-8"))
                    )
                if urllib.parse.unquote(parts.fragment) not in ids[target]:
                    broken.append((page.relative_to(site).as_posix(), url))
    assert not broken, broken


def test_start_here_lists_every_tutorial_with_a_description():
    """The home page's "Start here" list links every tutorial source's notebook, each followed by a
    one-line description."""
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    start = home.split("## Start here", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"\]\(tutorials/([0-9]{2}_\w+)\.ipynb\)(:?)", start))
    sources = [p.stem for p in sorted((ROOT / "tutorials_src").glob("[0-9][0-9]_*.py"))]
    assert sorted(listed) == sources
    assert [stem for stem, colon in listed.items() if not colon] == []


#: Paths of the machine a notebook was built on.
MACHINE_PATH = re.compile(r"/work/|/root/|/home/|site-packages|/tmp/(\w+)")


def test_notebook_outputs_show_no_machine_paths():
    """No output of a stored notebook shows a path of the machine that executed it (a warning's
    file, a home folder). A /tmp folder the tutorial itself names (where it writes its worker
    script) is the tutorial's, not the machine's."""
    found = []
    for notebook in sorted((ROOT / "docs" / "tutorials").glob("*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        source = "".join("".join(cell["source"]) for cell in cells)
        for cell in cells:
            for output in cell.get("outputs", []):
                text = json.dumps(output)
                for match in MACHINE_PATH.finditer(text):
                    if match.group(1) and match.group(1) in source:
                        continue
                    found.append(
                        (notebook.name, text[max(0, match.start() - 40) : match.end() + 40])
                    )
    assert not found, found


def test_code_lines_hook_wraps_each_line_and_keeps_the_text():
    """docs_hooks/code_lines.py: one line span per line, with its indentation; a token over two lines
    (a docstring) is closed and reopened; the text is the same characters; outputs are left
    alone."""
    notebook = (
        '<div class="highlight-ipynb"><pre><span></span><span class="k">def</span> f():\n'
        '    <span class="sd">"""a\n    b"""</span>\n</pre></div>'
    )
    marked = code_lines.mark_code_lines(notebook)
    assert marked.count('class="code-line"') == 3
    assert re.findall(r"--indent: (\d+)", marked) == ["0", "4", "4"]
    assert (
        '"""a\n</span></span><span class="code-line" style="--indent: 4"><span class="sd">'
        in marked
    )
    assert re.sub(r"<[^>]+>", "", marked) == re.sub(r"<[^>]+>", "", notebook)
    fence = '<pre><span></span><code><span id="__span-0-1">  x\n</span></code></pre>'
    assert 'id="__span-0-1" class="code-line" style="--indent: 2"' in code_lines.mark_code_lines(
        fence
    )
    output = '<div class="jp-RenderedText jp-OutputArea-output">\n<pre>a\nb\n</pre>'
    assert code_lines.mark_code_lines(output) == output


def test_concept_figures_are_what_the_script_draws(tmp_path):
    """The committed SVGs match scripts/doc_figures.py (masks and splits are drawn from
    attn_ref)."""
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "doc_figures.py"), str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    committed = {p.name for p in (ROOT / "docs" / "figures").glob("*.svg")}
    assert {p.name for p in tmp_path.glob("*.svg")} == committed
    for name in sorted(committed):
        assert (tmp_path / name).read_bytes() == (ROOT / "docs" / "figures" / name).read_bytes(), (
            f"docs/figures/{name} is stale: run .venv/bin/python scripts/doc_figures.py"
        )
