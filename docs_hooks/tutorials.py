"""MkDocs hook: the notebooks of ``docs/tutorials/`` as a "Tutorials" section, with their titles
intact.

* Nav: every ``docs/tutorials/*.ipynb`` is listed, in file-name order (``01_...``, ``02_...``),
  after "Concepts" (the learning path: concepts, tutorials, side by side, errors). mkdocs-jupyter
  renders them (``execute: false``: they are committed executed).
* Titles and anchors: mkdocs-jupyter builds a notebook's table of contents from its own markdown
  pass, which drops inline code: a heading "`cache_seqlens`: one length per sequence" becomes
  ": one length per sequence" with an id that the rendered page does not have. So the nav title is
  the notebook's first heading read from its source, and a notebook page's table of contents and
  title are rebuilt from the headings of the rendered HTML.
* Permalinks: nbconvert's heading permalinks (``anchor-link``) become Material's (``headerlink``),
  which look the same as on every other page and which the search index leaves out of a section's
  title (an ``anchor-link`` put a trailing "¶" on every notebook section in search results).
* Downloads: under its title, each notebook page links the notebook (mkdocs-jupyter's
  ``include_source`` copies it next to the page) and its Python source (``tutorials_src/<name>.py``,
  added here as a generated file in the same folder), and states the run time that
  ``scripts/build_notebooks.py`` measured when it executed the notebook (``metadata.attn_ref``).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from mkdocs.structure.files import File
from mkdocs.structure.toc import get_toc

SECTION = "Tutorials"
AFTER = "Concepts"
SOURCES = "tutorials_src"
#: nbconvert's permalink after a notebook heading.
ANCHOR_LINK = re.compile(r'<a class="anchor-link" (href="#[^"]*")>')
HEADING = re.compile(
    r'<h(?P<level>[1-6]) id="(?P<id>[^"]+)"[^>]*>(?P<inner>.*?)</h(?P=level)>', re.S
)


def notebook_title(path: Path) -> str:
    """Text of the first markdown heading of a notebook, inline code marks removed."""
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines():
            if line.startswith("#"):
                return line.lstrip("#").strip().replace("`", "")
    return path.stem


def on_config(config):
    notebooks = sorted(Path(config["docs_dir"], "tutorials").glob("*.ipynb"))
    nav = [item for item in config["nav"] if SECTION not in item]
    if notebooks:
        at = next((n + 1 for n, item in enumerate(nav) if AFTER in item), len(nav))
        nav.insert(at, {SECTION: [{notebook_title(p): f"tutorials/{p.name}"} for p in notebooks]})
    config["nav"] = nav
    return config


def _is_notebook(page) -> bool:
    return page.file.src_uri.startswith("tutorials/") and page.file.src_uri.endswith(".ipynb")


def on_files(files, config):
    """Each notebook's Python source, next to the copy of the notebook:
    ``tutorials/<name>/<name>.py``."""
    root = Path(config["config_file_path"]).parent
    for notebook in sorted(Path(config["docs_dir"], "tutorials").glob("*.ipynb")):
        source = root / SOURCES / f"{notebook.stem}.py"
        if source.is_file():
            files.append(
                File.generated(
                    config, f"tutorials/{notebook.stem}/{source.name}", content=source.read_bytes()
                )
            )
    return files


def downloads(notebook: Path, has_source: bool) -> str:
    """The download line of a notebook page: the notebook, its source, its measured run time."""
    links = [f'<a href="{notebook.name}" download>{notebook.name}</a> (notebook, with its outputs)']
    if has_source:
        links.append(
            f'<a href="{notebook.stem}.py" download>{notebook.stem}.py</a> (its source, jupytext '
            "percent format)"
        )
    record = json.loads(notebook.read_text(encoding="utf-8"))["metadata"].get("attn_ref", {})
    run = ""
    if "run_seconds" in record:
        run = (
            f" It ran top to bottom in {record['run_seconds']:.0f} s when it was built, on a "
            f"{record['cpu_count']}-core CPU (no GPU)."
        )
    return f'<p class="notebook-downloads"><strong>Download:</strong> {" · ".join(links)}.{run}</p>'


def toc_tokens(content: str) -> list[dict]:
    """Nested ``{level, id, name, children}`` tokens of the headings of rendered HTML, in order."""
    root = {"level": 0, "children": []}
    stack = [root]
    for match in HEADING.finditer(content):
        text = re.sub(r'<a class="headerlink".*?</a>|<[^>]+>', "", match["inner"])
        token = {
            "level": int(match["level"]),
            "id": match["id"],
            "name": html.unescape(text).strip(),
            "children": [],
        }
        while stack[-1]["level"] >= token["level"]:
            stack.pop()
        stack[-1]["children"].append(token)
        stack.append(token)
    return root["children"]


def on_page_content(content, page, config, files):
    """Notebook pages: the table of contents and title from the rendered headings (ids that exist,
    code kept), and the download line after the title."""
    if not _is_notebook(page):
        return content
    content = ANCHOR_LINK.sub(r'<a class="headerlink" \1 title="Permanent link">', content)
    tokens = toc_tokens(content)
    page.toc = get_toc(tokens)
    if tokens and tokens[0]["level"] == 1:
        page.title = tokens[0]["name"]
    notebook = Path(page.file.abs_src_path)
    has_source = (
        files.get_file_from_path(f"tutorials/{notebook.stem}/{notebook.stem}.py") is not None
    )
    line = downloads(notebook, has_source)
    title = HEADING.search(content)
    at = title.end() if title and title["level"] == "1" else 0
    return content[:at] + line + content[at:]
