"""MkDocs hook: the site ships MathJax 3, so the tutorials' math renders offline.

The notebooks write math as TeX (``$...$`` inline, ``$$...$$`` displayed). nbconvert's template
(through mkdocs-jupyter) loads MathJax 2 from a CDN for it, so offline the reader sees raw TeX. Here
each notebook page loads MathJax 3.2.2 from the site itself instead: the copy in the PyPI package
``django-static-mathjax`` (plain static files, no dependencies), of which :func:`on_post_build`
copies the ``tex-chtml`` component, its TeX extensions and its woff-v2 fonts (about 2.5 MB) into
``assets/mathjax/``. MathJax typesets with its own TeX fonts, so the math looks the same offline and
online and on any system, whatever math fonts it has.

nbconvert's template also puts a mermaid.js loader (a CDN import, run only for mermaid diagrams,
which the tutorials do not have) into every notebook page; it is removed, so a notebook page refers
to nothing outside the site.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.utils import get_relative_url

TARGET = "assets/mathjax"
#: What is copied from the package's ``es5/`` folder: the component and what it loads.
COPIED = ["tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2"]
#: MathJax 3's configuration: the notebooks' delimiters (MathJax 3 has no ``$`` by default); no
#: context menu (its accessibility tools would load the speech engine, which is not shipped).
CONFIG = {
    "tex": {
        "inlineMath": [["$", "$"], ["\\(", "\\)"]],
        "displayMath": [["$$", "$$"], ["\\[", "\\]"]],
        "processEscapes": True,
    },
    "options": {"enableMenu": False},
}
#: nbconvert's MathJax 2 loader and configuration, and its mermaid.js loader.
MATHJAX2 = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
MERMAID = re.compile(
    r'<script type="module">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*</script>', re.S
)


def mathjax_dir() -> Path:
    """MathJax's ``es5/`` folder in the ``django-static-mathjax`` package (module ``mathjax``)."""
    spec = importlib.util.find_spec("mathjax")
    folder = (
        Path(next(iter(spec.submodule_search_locations))) / "static" / "mathjax" / "es5"
        if spec
        else None
    )
    if folder is None or not (folder / "tex-chtml.js").is_file():
        raise PluginError(
            "math: MathJax is missing: pip install django-static-mathjax (see the Makefile's pins)"
        )
    return folder


def loader(page_url: str) -> str:
    """The scripts that configure and load the site's MathJax, for a page at ``page_url``."""
    src = get_relative_url(f"{TARGET}/tex-chtml.js", page_url)
    return (
        f"<script>window.MathJax = {json.dumps(CONFIG)};</script>\n"
        f'<script defer src="{src}"></script>'
    )


def on_page_content(content, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return content
    if len(MATHJAX2.findall(content)) != 1:
        raise PluginError(
            f"math: {page.file.src_uri} does not have nbconvert's MathJax loader once"
        )
    return MERMAID.sub("", MATHJAX2.sub(lambda _: loader(page.url), content))


def on_post_build(config):
    source, target = mathjax_dir(), Path(config["site_dir"]) / TARGET
    for rel in COPIED:
        if (source / rel).is_dir():
            shutil.copytree(source / rel, target / rel, dirs_exist_ok=True)
        else:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, target / rel)
    shutil.copy2(source.parent / "LICENSE", target / "LICENSE")
