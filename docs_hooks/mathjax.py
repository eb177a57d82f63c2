"""MkDocs hook: ship MathJax with the site, so the tutorials' math renders offline.

The notebooks write math as TeX (``$...$``, ``$$...$$``), which mkdocs-jupyter leaves in the page for
MathJax 2 to typeset in the browser (nbconvert's template). Instead of a CDN, the site carries its own
MathJax 2.7.9: the copy in the PyPI package ``jupyter-server-mathjax`` (the one Jupyter itself serves),
copied into ``assets/mathjax/`` after each build. Only what the pages load is copied: the combined
TeX + HTML-CSS configuration, the Safe extension, the HTML-CSS output and its STIX-Web fonts (about
3 MB); localisations, the SVG output and the accessibility maps are left out.

``config/attn-ref.js`` (written here) makes MathJax use the shipped web fonts only: it never looks
for locally installed fonts, never falls back to image fonts that are not there, and never shows
its loading messages. mkdocs.yml points mkdocs-jupyter at :data:`URL`, relative to a notebook page.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from mkdocs.exceptions import PluginError

TARGET = "assets/mathjax"
#: The script URL as a notebook page (``tutorials/<name>/index.html``) sees it; mkdocs.yml uses it.
URL = f"../../{TARGET}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe,attn-ref"
LEFT_OUT = ("localization", "SVG", "a11y", "mhchem3", "*.md")
LOCAL_CONFIG = """\
MathJax.Hub.Config({
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null},
  messageStyle: "none",
  menuSettings: {zoom: "None"}
});
MathJax.Ajax.loadComplete("[MathJax]/config/attn-ref.js");
"""


def mathjax_dir() -> Path:
    """The MathJax tree inside ``jupyter_server_mathjax`` (found without importing the server extension)."""
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise PluginError("mathjax: the package jupyter-server-mathjax is missing (pip install jupyter-server-mathjax)")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def on_config(config):
    configured = config["plugins"]["mkdocs-jupyter"].config["custom_mathjax_url"]
    if configured != URL:
        raise PluginError(f"mathjax: mkdocs-jupyter's custom_mathjax_url must be {URL!r}, not {configured!r}")
    return config


def on_post_build(config):
    target = Path(config["site_dir"]) / TARGET
    shutil.copytree(mathjax_dir(), target, ignore=shutil.ignore_patterns(*LEFT_OUT), dirs_exist_ok=True)
    (target / "config" / "attn-ref.js").write_text(LOCAL_CONFIG, encoding="utf-8")
