"""The docs site: a strict build, the error catalog's pages and JSON API, and a headless browser.

The site is built once per module with ``mkdocs build --strict`` into a temporary folder (any broken
link, anchor, include or nav entry fails it). The browser test drives Debian's Chromium
(``/usr/bin/chromium``) through Playwright for Python against the built site served on localhost.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from docs_hooks.error_pages import entry_json  # noqa: E402
from docs_hooks.source_includes import definition_lines  # noqa: E402
from errors import catalog as cat  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    return site_dir


@pytest.fixture(scope="module")
def catalog() -> dict:
    return cat.load()


def test_strict_build_has_every_nav_page(site):
    for page in ["index.html", "concepts/masks/index.html", "concepts/sequence-parallel/index.html",
                 "side-by-side/index.html", "reference/attn_ref/index.html", "errors/index.html"]:
        assert (site / page).is_file(), page
    for notebook in (ROOT / "docs" / "tutorials").glob("*.ipynb"):
        assert (site / "tutorials" / notebook.stem / "index.html").is_file(), notebook.name


def test_benchmarks_page_shows_every_committed_result(site):
    results = ROOT / "benchmarks" / "results"
    devices = sorted(results.glob("*.json")) if results.is_dir() else []
    page = site / "benchmarks" / "index.html"
    assert page.is_file() == bool(devices), "a benchmarks page exactly when results are committed"
    if devices:
        html = page.read_text(encoding="utf-8")
        for plot in results.glob("*.png"):
            assert f'src="{plot.name}"' in html and (site / "benchmarks" / plot.name).is_file(), plot.name


def test_source_include_finds_definitions():
    path = ROOT / "attn_ref" / "masks.py"
    start, end = definition_lines(path, "visible_keys")
    lines = path.read_text().splitlines()
    assert lines[start - 1].startswith("def visible_keys(")
    assert lines[end - 1].strip() == "return visible"
    with pytest.raises(PluginError, match="no definition 'not_there'"):
        definition_lines(path, "not_there")


def test_every_catalog_entry_has_a_page(site, catalog):
    index = (site / "errors" / "index.html").read_text(encoding="utf-8")
    base = catalog["docs_base_url"].rstrip("/")
    for entry in catalog["errors"]:
        page = site / "errors" / entry["id"] / "index.html"
        assert page.is_file(), entry["id"]
        # The URLs the catalog (and the exception notes) print are the pages and files built here.
        assert site / entry["docs_url"].removeprefix(base).strip("/") / "index.html" == page
        assert (site / entry["api_url"].removeprefix(base).strip("/")).is_file(), entry["api_url"]
        text = page.read_text(encoding="utf-8")
        assert "Error message" in text and "Solutions" in text and "Recovery" in text, entry["id"]
        assert f'href="{entry["id"]}/"' in index, f"errors/index does not link {entry['id']}"


def test_error_pages_highlight_the_raise(site, catalog):
    for entry in catalog["errors"]:
        text = (site / "errors" / entry["id"] / "index.html").read_text(encoding="utf-8")
        highlighted = text.split('<span class="hll">', 1)[1].split("</span>\n", 1)[0]
        assert "raise" in highlighted, entry["id"]


def test_entry_json_is_the_catalog_entry_byte_for_byte(site, catalog):
    stored = cat.CATALOG_PATH.read_text(encoding="utf-8")
    for entry in catalog["errors"]:
        published = (site / "api" / "errors" / f"{entry['id']}.json").read_bytes()
        assert published == entry_json(entry).encode("utf-8")
        assert json.loads(published) == entry
        assert textwrap.indent(published.decode("utf-8").rstrip("\n"), "    ") in stored, entry["id"]


def test_index_json_lists_exactly_the_catalog_ids(site, catalog):
    index = json.loads((site / "api" / "errors" / "index.json").read_text(encoding="utf-8"))
    assert [row["id"] for row in index["errors"]] == [entry["id"] for entry in catalog["errors"]]
    published = {p.stem for p in (site / "api" / "errors").glob("*.json")} - {"index", "schema"}
    assert published == {entry["id"] for entry in catalog["errors"]}
    assert (site / "api" / "errors" / "schema.json").read_bytes() == cat.SCHEMA_PATH.read_bytes()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def heading(page) -> str:
    """The page's h1 without Material's permalink sign."""
    return page.locator("article h1").inner_text().rstrip("¶").strip()


def search(page, served: str, text: str):
    """Type ``text`` into Material's search box on the home page; the result items (at least one)."""
    page.goto(served + "/")
    page.locator("label.md-search__icon, .md-search__input").first.click()
    page.locator("input.md-search__input").press_sequentially(text, delay=10)  # keystrokes, as a reader
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=15_000)  # times out when the search finds nothing
    return results


@pytest.fixture(scope="module")
def served(site):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_browser_home_error_page_and_search(served, catalog):
    assert CHROMIUM.is_file(), "Debian's chromium is missing: `make browser` installs it (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    problems = []
    with sync_playwright() as playwright:
        # Playwright gives the browser a fresh, empty profile (toolchain.md's --user-data-dir) itself.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        page = browser.new_page()
        # Errors of the site itself. Requests that leave localhost (Material asks api.github.com for the
        # repository's stars) fail offline and are not the site's fault.
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda msg: problems.append(f"console: {msg.text}")
                if msg.type == "error" and msg.location.get("url", "").startswith(served) else None)
        # A request cut off by the next navigation (net::ERR_ABORTED, e.g. the favicon) is no fault;
        # a missing file shows up as an HTTP 404 below.
        page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} ({r.failure})")
                if r.url.startswith(served) and r.failure != "net::ERR_ABORTED" else None)
        page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

        assert page.goto(served + "/").ok
        assert heading(page) == "attn-ref"

        entry = catalog["errors"][0]
        assert page.goto(f"{served}/errors/{entry['id']}/").ok
        assert heading(page) == entry["summary"]
        assert page.locator("article").get_by_text("What it means").count() == 1

        assert "only_qv" in search(page, served, "only_qv").first.inner_text().replace("\u200b", "")
        # An error message typed into the search box leads to its catalog page.
        message = next(e["message"]["template"] for e in catalog["errors"] if not e["message"]["placeholders"])
        hits = search(page, served, " ".join(message.split()[:6]))
        assert any("/errors/" in (hits.nth(i).locator("a").first.get_attribute("href") or "")
                   for i in range(hits.count())), message
        browser.close()
    assert problems == []


def test_concept_figures_are_what_the_script_draws(tmp_path):
    """The committed SVGs match scripts/doc_figures.py (masks and splits are drawn from attn_ref)."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "doc_figures.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    committed = {p.name for p in (ROOT / "docs" / "figures").glob("*.svg")}
    assert {p.name for p in tmp_path.glob("*.svg")} == committed
    for name in sorted(committed):
        assert (tmp_path / name).read_bytes() == (ROOT / "docs" / "figures" / name).read_bytes(), (
            f"docs/figures/{name} is stale: run .venv/bin/python scripts/doc_figures.py")
