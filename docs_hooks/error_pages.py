"""MkDocs hook: the error catalog's pages and JSON API, generated from ``errors/catalog.json``.

Nothing is written into ``docs/``: every page and JSON document is a ``File.generated`` added in
``on_files``, so ``mkdocs serve`` does not loop and the site always matches the catalog.

* ``errors/index.md`` -> ``/errors/``: one table row per entry (message, type, area, link);
* ``errors/<id>.md`` -> ``/errors/<id>/``: the entry's sections (the URL that
  :func:`errors.catalog.docs_url` prints in exception notes);
* ``api/errors/<id>.json``: the entry, serialised as the catalog serialises it
  (:func:`entry_json`), so its bytes are those of the entry in ``errors/catalog.json``;
* ``api/errors/index.json``: package, version and one summary row per entry, with its message
  template and regex (the site's search matches pasted messages with them: ``error-search.js``);
* ``api/errors/schema.json``: ``errors/schema.json``, byte for byte.
"""

from __future__ import annotations

import html
import json
import re
import sys
import textwrap
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, InclusionLevel

SECTION = "Errors"
AFTER = "Benchmarks"
EXAMPLE_TABS = [("trigger", "Triggers the error"), ("fixed", "Fixed"), ("guard", "Guard"),
                ("predicate", "Predicate"), ("recovery", "Recovery")]
REQUIREMENTS = {"cuda": "a CUDA GPU", "triton": "Triton"}


def _catalog_module(config):
    root = str(Path(config["config_file_path"]).parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from errors import catalog

    return catalog


def entry_json(entry: dict) -> str:
    """One entry as stored in the catalog: ``errors.catalog.dumps`` indents it by 4 more spaces."""
    return json.dumps(entry, indent=2, ensure_ascii=False) + "\n"


def index_json(catalog: dict) -> str:
    rows = [
        {"id": e["id"], "slug": e["slug"], "status": e["status"], "type": e["exception"]["type"],
         "area": e["area"], "summary": e["summary"], "docs_url": e["docs_url"], "api_url": e["api_url"],
         "template": e["message"]["template"], "regex": e["message"]["regex"]}
        for e in catalog["errors"]
    ]
    doc = {"package": catalog["package"], "package_version": catalog.get("package_version"),
           "schema_version": catalog["schema_version"], "docs_base_url": catalog["docs_base_url"], "errors": rows}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _fence(code: str, lang: str = "python", options: str = "") -> str:
    """A fenced block that no backtick run inside ``code`` can close."""
    ticks = "`" * max([3] + [len(run) + 1 for run in re.findall("`+", code)])
    head = f"{ticks}{lang}" + (f" {options}" if options else "")
    return f"{head}\n{code.rstrip()}\n{ticks}"


def _indent(text: str, spaces: int = 4) -> str:
    return textwrap.indent(text, " " * spaces)


def _cell(text: str) -> str:
    """Inline code that survives a markdown table: escaped HTML, no raw pipes or newlines."""
    return "<code>" + html.escape(text).replace("|", "&#124;").replace("\n", " ") + "</code>"


def entry_page(entry: dict, by_id: dict) -> str:
    message, when, examples, source = entry["message"], entry["when_it_happens"], entry["examples"], entry["source"]
    lines = [
        "---", f"title: {json.dumps(entry['slug'])}", f"description: {json.dumps(entry['summary'])}", "---", "",
        f"# {entry['summary']}", "",
        f"`{entry['exception']['type']}` · area `{entry['area']}` · slug `{entry['slug']}` · id `{entry['id']}` · "
        f"[JSON](../api/errors/{entry['id']}.json)", "",
    ]
    if entry["status"] == "removed":
        lines += ['!!! note "No longer raised"', "", _indent(entry["removed_note"]), ""]
    lines += ["## Error message", "", _fence(message["template"], "text"), ""]
    renamed = [p for p in message["placeholders"] if p["expr"] != p["name"]]
    if renamed:
        lines += ["Placeholders: " + ", ".join(f"`{{{p['name']}}}` is `{p['expr']}`" for p in renamed) + ".", ""]
    lines += ["## What it means", "", entry["what_it_means"].rstrip(), "",
              "## When it happens", "", when["trigger"].rstrip(), ""]
    lines += [f"* {situation}" for situation in when["common_situations"]] + [""]
    # Pygments drops leading empty lines, so the block starts at the first non-empty one.
    text = source["excerpt"]["text"].lstrip("\n")
    start = source["excerpt"]["start_line"] + len(source["excerpt"]["text"]) - len(text)
    first, last = source["line"] - start + 1, source["end_line"] - start + 1
    lines += ["## Source", "", f"Raised in `{source['function']}`, `{source['path']}` line {source['line']}:", "",
              _fence(text, "python", f'linenums="{start}" hl_lines="{first}-{last}" title="{source["path"]}"'), ""]
    lines += ["## Solutions", ""]
    for n, solution in enumerate(entry["solutions"], 1):
        lines += [f"{n}. **{solution['title']}**", "", _indent(solution["body"].rstrip()), ""]
    lines += ["## Example fix", ""]
    if examples.get("requires"):
        lines += ["These examples need " + " and ".join(REQUIREMENTS[r] for r in examples["requires"]) + ".", ""]
    if examples.get("setup"):
        lines += ["Every tab below starts from this setup:", "", _fence(examples["setup"]), ""]
    for key, title in EXAMPLE_TABS:
        example = examples[key]
        lines += [f'=== "{title}"', "", _indent(_fence(example["code"])), ""]
        if key == "predicate":
            for label, cases in (("True (the call raises)", example["true_cases"]),
                                 ("False (the call is valid)", example["false_cases"])):
                lines += [_indent(f"{label} for:"), ""] + [_indent(f"* `{case}`") for case in cases] + [""]
    if entry.get("upstream"):
        up = entry["upstream"]
        raised_as = f" as `{up['exception']}`" if up.get("exception") else ""
        lines += ["## Upstream", "", f"sglang raises this message too{raised_as}: `{up['repository']}`, "
                  f"`{up['path']}`, in `{up['function']}`. {up['note']}", ""]
    if entry["related"]:
        lines += ["## Related errors", ""]
        for link in entry["related"]:
            other = by_id[link["id"]]
            lines.append(f"* [{other['summary']}]({other['id']}.md) ({link['relation'].replace('_', ' ')})")
        lines.append("")
    return "\n".join(lines)


def _table(entries: list[dict]) -> list[str]:
    rows = [f"| {_cell(e['message']['template'])} | {e['exception']['type']} | `{e['area']}` | [{e['slug']}]({e['id']}.md) |"
            for e in sorted(entries, key=lambda e: e["message"]["template"])]
    return ["| Message | Type | Area | Entry |", "|---|---|---|---|", *rows, ""]


def index_page(catalog: dict) -> str:
    lines = [
        "# Error catalog", "",
        catalog.get("scope", "").rstrip(), "",
        "Every entry has a page with what the error means, when it happens, the raise statement in the "
        "source, solutions and runnable examples. Exceptions raised through the public API carry the "
        "entry's id and link as a note (set `ATTN_REF_ERROR_NOTES=0` to turn the notes off); from a "
        "shell, `python -m errors explain \"<message>\"` prints the same page.", "",
    ]
    if catalog.get("upstream_shared"):
        lines += [catalog["upstream_shared"]["statement"], ""]
    lines += [
        "Machine-readable: [`api/errors/index.json`](../api/errors/index.json) lists every entry, "
        "`api/errors/<id>.json` holds one entry exactly as in `errors/catalog.json`, and "
        "[`api/errors/schema.json`](../api/errors/schema.json) is its JSON Schema.", "",
    ]
    active = [e for e in catalog["errors"] if e["status"] == "active"]
    for area in sorted({e["area"] for e in active}):
        lines += [f"## {area.replace('_', ' ').capitalize()}", ""] + _table([e for e in active if e["area"] == area])
    removed = [e for e in catalog["errors"] if e["status"] == "removed"]
    if removed:
        lines += ["## No longer raised", ""] + _table(removed)
    return "\n".join(lines)


def on_config(config):
    path = _catalog_module(config).CATALOG_PATH
    nav = [item for item in config["nav"] if SECTION not in item]
    if path.exists():
        at = next((n + 1 for n, item in enumerate(nav) if AFTER in item), len(nav) - 1)
        nav.insert(at, {SECTION: "errors/index.md"})
    config["nav"] = nav
    return config


def on_files(files, config):
    catalog_module = _catalog_module(config)
    if not catalog_module.CATALOG_PATH.exists():
        return files
    try:
        catalog = catalog_module.load()
    except catalog_module.CatalogError as exc:
        raise PluginError(f"error pages: {exc}") from None
    by_id = {entry["id"]: entry for entry in catalog["errors"]}
    generated = {"errors/index.md": index_page(catalog),
                 "api/errors/index.json": index_json(catalog),
                 "api/errors/schema.json": catalog_module.SCHEMA_PATH.read_bytes()}
    for entry in catalog["errors"]:
        generated[f"errors/{entry['id']}.md"] = entry_page(entry, by_id)
        generated[f"api/errors/{entry['id']}.json"] = entry_json(entry)
    for src_uri, content in generated.items():
        if files.get_file_from_path(src_uri) is not None:
            raise PluginError(f"error pages: docs/{src_uri} exists; the catalog pages are generated, remove it")
        # Entry pages are reached from the index, not from the nav.
        files.append(File.generated(config, src_uri, content=content, inclusion=InclusionLevel.NOT_IN_NAV))
    return files
