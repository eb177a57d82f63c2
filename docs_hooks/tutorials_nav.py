"""MkDocs hook: list every notebook in ``docs/tutorials/`` under a "Tutorials" nav section.

Notebooks are rendered by mkdocs-jupyter (``execute: false``: they are committed executed). The nav
entry has no title, so each page takes its title from the notebook's first heading; notebooks are
listed in file-name order (``01_...``, ``02_...``). The section goes after "Side by side".
"""

from __future__ import annotations

from pathlib import Path

SECTION = "Tutorials"
AFTER = "Side by side"


def on_config(config):
    notebooks = sorted(Path(config["docs_dir"], "tutorials").glob("*.ipynb"))
    nav = [item for item in config["nav"] if SECTION not in item]
    if notebooks:
        at = next((n + 1 for n, item in enumerate(nav) if AFTER in item), len(nav))
        nav.insert(at, {SECTION: [f"tutorials/{path.name}" for path in notebooks]})
    config["nav"] = nav
    return config
