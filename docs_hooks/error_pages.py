"""MkDocs hook: the error catalog's pages and JSON API, generated from ``errors/catalog.json``.

Nothing is written into ``docs/``: every page and JSON document is a ``File.generated`` added in
``on_files``, so ``mkdocs serve`` does not loop and the site always matches the catalog.

* ``errors/index.md`` -> ``/errors/``: the entries by area, each a link with its type and message
  (a list, not a table, so that it reads on a phone);
* ``errors/<slug>.md`` -> ``/errors/<slug>/`` (``/errors/kv-cache/capacity-exceeded/``): the entry's
  sections (the URL that :func:`errors.catalog.docs_url` prints in exception notes), among them the
  real output of its trigger example (:mod:`docs_hooks.error_outputs`, run at build time) and its
  external aliases. Entry pages are in the nav, one section per area (:data:`AREAS` names them), so
  they have the sidebar and previous/next links;
* ``errors/<id>/index.html`` and ``errors/<alias>/index.html``: static redirects to the entry's page
  (:func:`redirect_page`: meta refresh, canonical link and a plain link; no server rule, works
  offline), so that the id URLs printed before the pages moved to slugs, and old slugs, still land;
* ``api/errors/<id>.json``: the entry, serialised as the catalog serialises it
  (:func:`entry_json`), so its bytes are those of the entry in ``errors/catalog.json``;
* ``errors/upstream.md`` -> ``/errors/upstream/``: upstream's messages
  (``errors/upstream/*.json``) by source, each linking to the entry it maps to; entry pages list
  them as "Also raised upstream as";
* ``api/errors/index.json``: package, version and one summary row per entry, with its message
  template and regex, and one row per upstream message with its kind, path, regex and entry (the
  site's search matches pasted messages with them, a bare assert's source with the code line of a
  pasted traceback: ``error-search.js``);
* ``api/errors/schema.json``: ``errors/schema.json``, byte for byte.
"""

from __future__ import annotations

import builtins
import html
import importlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # mkdocs loads hooks by path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from docs_hooks import error_outputs  # noqa: E402
from errors.examples import predicate_name  # noqa: E402

SECTION = "Errors"
AFTER = "Side by side"
EXAMPLE_TABS = [
    ("trigger", "Triggers the error"),
    ("fixed", "Fixed"),
    ("predicate", "Predicate"),
    ("guard", "Guard"),
    ("recovery", "Recovery"),
]
#: The Recovery tab is shown for an error that says a backend cannot do what was asked
#: (a ``NotImplementedError``): a program falls back to another one, which is what its recovery
#: does. For a wrong call (``ValueError``, ``TypeError``) no program catches the error to retry: the
#: Fixed tab is the call to write, and the recovery stays in the catalog only as the check that
#: the error can be caught (``python -m errors check``).
RECOVERY_FOR = NotImplementedError
#: Material's search boost of an entry page: below 1, so that concept words (``cache_seqlens``,
#: "ring attention") rank the concept pages and tutorials above the 100-odd entries that mention
#: them; a pasted message still opens its entry first (error-search.js matches it against the
#: catalog's regexes).
SEARCH_BOOST = 0.1
REQUIREMENTS = {"cuda": "a CUDA GPU", "triton": "Triton"}
#: Section names of the catalog's areas (an area not listed reads as its name with spaces).
AREAS = {
    "arguments": "Arguments",
    "fp8": "FP8 inputs",
    "kv_cache": "KV cache",
    "merge": "Merging states",
    "only_qv": "MLA: qv and only_qv",
    "options": "Options",
    "paged": "Paged KV cache",
    "rotary": "Rotary",
    "sequence_parallel": "Sequence parallelism",
    "varlen": "Packed (varlen) sequences",
}


def area_title(area: str) -> str:
    return AREAS.get(area, area.replace("_", " ").capitalize())


def _catalog_module(config):
    root = str(Path(config["config_file_path"]).parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from errors import catalog

    return catalog


def _upstream_module():
    from errors import upstream  # importable once _catalog_module has put the root on sys.path

    return upstream


def entry_json(entry: dict) -> str:
    """One entry as stored in the catalog: ``errors.catalog.dumps`` indents it by 4 more spaces."""
    return json.dumps(entry, indent=2, ensure_ascii=False) + "\n"


def index_json(catalog: dict) -> str:
    rows = [
        {
            "id": e["id"],
            "slug": e["slug"],
            "status": e["status"],
            "type": e["exception"]["type"],
            "area": e["area"],
            "summary": e["summary"],
            "docs_url": e["docs_url"],
            "api_url": e["api_url"],
            "template": e["message"]["template"],
            "regex": e["message"]["regex"],
        }
        for e in catalog["errors"]
    ]
    upstream_rows = [
        {
            "source": data["source"],
            "type": m["exception"],
            "kind": m["kind"],
            "path": m["path"],
            "template": m["template"],
            "regex": m["regex"],
            "entry": m["entry"],
        }
        for data, m in _upstream_module().messages()
    ]
    doc = {
        "package": catalog["package"],
        "package_version": catalog.get("package_version"),
        "schema_version": catalog["schema_version"],
        "docs_base_url": catalog["docs_base_url"],
        "errors": rows,
        "upstream": upstream_rows,
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _fence(code: str, lang: str = "python", options: str = "") -> str:
    """A fenced block that no backtick run inside ``code`` can close."""
    ticks = "`" * max([3] + [len(run) + 1 for run in re.findall("`+", code)])
    head = f"{ticks}{lang}" + (f" {options}" if options else "")
    return f"{head}\n{code.rstrip()}\n{ticks}"


def _wrapped(block: str) -> str:
    """A block whose long lines wrap instead of scrolling (messages and outputs: ``.error-text`` in
    extra.css)."""
    return f'<div class="error-text" markdown>\n\n{block}\n\n</div>'


def _indent(text: str, spaces: int = 4) -> str:
    return textwrap.indent(text, " " * spaces)


def _cell(text: str) -> str:
    """Inline code as HTML that markdown leaves alone: escaped, no raw pipes or newlines."""
    return "<code>" + html.escape(text).replace("|", "&#124;").replace("\n", " ") + "</code>"


def page(entry: dict) -> str:
    """The entry page's markdown file, relative to ``errors/``: ``<slug>.md``."""
    return f"{entry['slug']}.md"


def redirect_page(entry: dict, depth: int) -> str:
    """A static page that sends ``errors/<name>/`` (``depth`` path segments in ``name``: 1 for an
    id, 2 for an old slug) to the entry's page; the fragment is kept where JavaScript runs."""
    target = "../" * depth + entry["slug"] + "/"
    summary = html.escape(entry["summary"])
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f"<title>{summary}</title>",
            f'<link rel="canonical" href="{html.escape(entry["docs_url"])}">',
            '<meta name="robots" content="noindex">',
            f'<meta http-equiv="refresh" content="0; url={target}">',
            f"<script>location.replace({json.dumps(target)} + location.hash)</script>",
            "</head>",
            "<body>",
            f'<p>This error\'s page is <a href="{target}">{summary}</a> '
            f"(<code>{entry['slug']}</code>, id <code>{entry['id']}</code>).</p>",
            "</body>",
            "</html>",
            "",
        ]
    )


def entry_page(entry: dict, by_id: dict, output: Optional[str] = None) -> str:
    """The markdown of an entry's page; ``output``: what its trigger printed (the real
    exception)."""
    message, when, examples, source = (
        entry["message"],
        entry["when_it_happens"],
        entry["examples"],
        entry["source"],
    )
    lines = [
        "---",
        f"title: {json.dumps(entry['summary'])}",
        f"description: {json.dumps(entry['summary'])}",
        f"search: {{boost: {SEARCH_BOOST}}}",
        "---",
        "",
        f"# {entry['summary']}",
        "",
        f"`{entry['exception']['type']}` · {area_title(entry['area'])} · slug `{entry['slug']}` · "
        f"id `{entry['id']}` · [JSON](../../api/errors/{entry['id']}.json)",
        "",
    ]
    if entry["status"] == "removed":
        lines += ['!!! note "No longer raised"', "", _indent(entry["removed_note"]), ""]
    if entry["status"] == "upstream_only":
        lines += [
            '!!! note "Raised only upstream"',
            "",
            _indent(
                "attn-ref never raises this error: upstream does (the messages under [Also raised "
                "upstream as](#also-raised-upstream-as)). The examples check when upstream raises "
                "it and run the same computation with attn-ref."
            ),
            "",
        ]
    lines += ["## Error message", "", _wrapped(_fence(message["template"], "text")), ""]
    renamed = [p for p in message["placeholders"] if p["expr"] != p["name"]]
    if renamed:
        lines += [
            "Placeholders: "
            + ", ".join(f"`{{{p['name']}}}` is `{p['expr']}`" for p in renamed)
            + ".",
            "",
        ]
    if output is not None:
        lines += [
            "What Python prints at the end of the traceback when the [trigger](#example-fix) runs "
            "(captured when this page was built):",
            "",
            _wrapped(_fence(output, "text")),
            "",
        ]
    aliases = entry.get("external_aliases", [])
    if aliases:
        lines += ["Also known as: " + "; ".join(_alias(alias) for alias in aliases) + ".", ""]
    lines += [
        "## What it means",
        "",
        entry["what_it_means"].rstrip(),
        "",
        "## When it happens",
        "",
        when["trigger"].rstrip(),
        "",
    ]
    lines += [f"* {situation}" for situation in when["common_situations"]] + [""]
    if source is not None:
        # Pygments drops leading empty lines, so the block starts at the first non-empty one.
        text = source["excerpt"]["text"].lstrip("\n")
        start = source["excerpt"]["start_line"] + len(source["excerpt"]["text"]) - len(text)
        first, last = source["line"] - start + 1, source["end_line"] - start + 1
        lines += [
            "## Source",
            "",
            f"Raised in `{source['function']}`, `{source['path']}` line {source['line']}:",
            "",
            _fence(
                text,
                "python",
                f'linenums="{start}" hl_lines="{first}-{last}" title="{source["path"]}"',
            ),
            "",
        ]
    lines += ["## Solutions", ""]
    for n, solution in enumerate(entry["solutions"], 1):
        lines += [f"{n}. **{solution['title']}**", "", _indent(solution["body"].rstrip()), ""]
    lines += ["## Example fix", ""]
    if examples.get("requires"):
        lines += [
            "These examples need "
            + " and ".join(REQUIREMENTS[r] for r in examples["requires"])
            + ".",
            "",
        ]
    if examples.get("setup"):
        lines += ["Every tab below starts from this setup:", "", _fence(examples["setup"]), ""]
    for key, title in EXAMPLE_TABS:
        if key not in examples:  # an upstream-only entry: fixed and predicate only
            continue
        if key == "recovery" and not is_capability_gap(entry):
            continue
        example = examples[key]
        lines += [f'=== "{title}"', ""]
        if key == "guard":  # it runs after the predicate's code (errors/examples.py)
            lines += [
                _indent(f"Decides with `{predicate_name(examples)}` from the Predicate tab:"),
                "",
            ]
        lines += [_indent(_fence(example["code"])), ""]
        if key == "predicate":
            for label, cases in (
                ("True (the call raises)", example["true_cases"]),
                ("False (the call is valid)", example["false_cases"]),
            ):
                lines += (
                    [_indent(f"{label} for:"), ""]
                    + [_indent(f"* `{case}`") for case in cases]
                    + [""]
                )
    if entry.get("upstream"):
        up = entry["upstream"]
        raised_as = f" as `{up['exception']}`" if up.get("exception") else ""
        lines += [
            "## Upstream",
            "",
            f"sglang raises this message too{raised_as}: `{up['repository']}`, "
            f"`{up['path']}`, in `{up['function']}`. {up['note']}",
            "",
        ]
    lines += upstream_section(entry)
    if entry["related"]:
        lines += ["## Related errors", ""]
        for link in entry["related"]:
            other = by_id[link["id"]]
            lines.append(
                f"* [{other['summary']}](../{page(other)}) ({link['relation'].replace('_', ' ')})"
            )
        lines.append("")
    return "\n".join(lines)


def _permalink(data: dict, message: dict) -> str:
    """The message's file on GitHub at the commit read (the repository's page where none is
    pinned)."""
    if message.get("commit"):
        return f"https://github.com/{data['repository']}/blob/{message['commit']}/{message['path']}"
    return f"https://github.com/{data['repository']}"


def _bare_note(message: dict) -> str:
    """Said of a bare assert, whose source stands for the message it lacks."""
    upstream = _upstream_module()
    return f"({upstream.BARE_NOTE}) " if message["kind"] == upstream.BARE else ""


def upstream_section(entry: dict) -> list[str]:
    """ "Also raised upstream as": every upstream wording mapped to the entry, with where it is
    raised, and the C++ argument names that differ from the Python ones."""
    upstream = _upstream_module()
    mapped = upstream.by_entry().get(entry["id"], [])
    if not mapped:
        return []
    lines = ["## Also raised upstream as", ""]
    for data, message in mapped:
        pin = f"`{message['commit'][:12]}`" if message.get("commit") else "unpinned"
        lines.append(
            "* "
            f"{_cell(upstream.pasted_form(message))}<br>"
            f"{_bare_note(message)}{html.escape(data['title'])}, "
            f"[`{message['path']}`]({_permalink(data, message)}) in "
            f"`{message['function']}` ({pin})"
        )
    names = upstream.translated_names([m for _, m in mapped])
    if names:
        lines += [
            "",
            "Argument names: "
            + ", ".join(f"`{a}` is `{b}`" for a, b in names)
            + " (upstream's C++ name, "
            "then the Python argument of `flash_attn_with_kvcache`).",
        ]
    return lines + [""]


def upstream_page(catalog: dict) -> str:
    """Every upstream message by source, each linked to its entry."""
    upstream = _upstream_module()
    by_id = {e["id"]: e for e in catalog["errors"]}
    lines = [
        "# Upstream errors",
        "",
        "The errors users of sglang, FlashAttention, ring-flash-attention and yunchang meet, read "
        "from their sources (`python -m errors scan --upstream`) and kept in "
        "`errors/upstream/*.json`. Each links to the catalog entry for the same condition: the "
        "one attn-ref raises, or an entry for a condition only upstream has. Pasting any of them "
        "into the search box (or into `python -m errors explain`) opens that entry. A bare "
        "`assert` has no message: it is listed by its source, the last code line of a traceback "
        "that ends in a bare `AssertionError`, and the whole traceback finds it.",
        "",
    ]
    for data in upstream.load_all():
        pins = sorted({m.get("commit", "")[:12] or "unpinned" for m in data["messages"]})
        lines += [
            f"## {data['title']}",
            "",
            f"`{data['repository']}` ({', '.join(pins)}): {len(data['messages'])} messages.",
            "",
            '<div class="error-index" markdown>',
            "",
        ]
        for message in data["messages"]:
            entry = by_id[message["entry"]]
            lines.append(
                f"* {_cell(upstream.pasted_form(message))}<br>"
                f"{_bare_note(message)}`{message['function']}` · "
                f"[{html.escape(entry['summary'])}]({page(entry)})"
            )
        lines += ["", "</div>", ""]
    return "\n".join(lines)


def _alias(alias: dict) -> str:
    """An external alias: its id, linked where it has a URL, its source and note."""
    name = f"[`{alias['id']}`]({alias['url']})" if alias.get("url") else f"`{alias['id']}`"
    return (
        f"{name} ({alias['source']}{': ' + alias['note'].rstrip('.') if alias.get('note') else ''})"
    )


def _listing(entries: list[dict]) -> list[str]:
    """One list item per entry: its summary as the link, then its type and message template."""
    items = [
        f"* [{html.escape(e['summary'])}]({page(e)}) · {e['exception']['type']}<br>"
        f"{_cell(e['message']['template'])}"
        for e in sorted(entries, key=lambda e: e["summary"].lower())
    ]
    return ['<div class="error-index" markdown>', "", *items, "", "</div>", ""]


def raised_class(entry: dict) -> Optional[type]:
    """The class of the entry's exception: a builtin, or the class of that name in the module that
    raises it (``source.path``)."""
    name = entry["exception"]["type"]
    if isinstance(getattr(builtins, name, None), type):
        return getattr(builtins, name)
    path = (entry.get("source") or {}).get("path", "")
    if not path.endswith(".py"):
        return None
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    found = getattr(module, name, None)
    return found if isinstance(found, type) else None


def is_capability_gap(entry: dict) -> bool:
    """Whether the entry's error says a backend cannot do the call (see :data:`RECOVERY_FOR`)."""
    raised = raised_class(entry)
    return raised is not None and issubclass(raised, RECOVERY_FOR)


def index_page(catalog: dict) -> str:
    lines = [
        "# Error catalog",
        "",
        catalog.get("scope", "").rstrip(),
        "",
        "**Got an error?** Paste its message (or a part of it) into the search box at the top of "
        "any page: the entry for it comes first.",
        "",
        "Every entry has a page with what the error means, when it happens, the raise statement "
        "in the source, solutions and runnable examples. Exceptions raised through the public API "
        "carry the entry's id, the command `python -m errors explain <id>` (works offline) and a "
        "link to its page as a note (`ATTN_REF_DOCS_URL` points the link at another build, empty "
        "drops it; `ATTN_REF_ERROR_NOTES=0` turns the notes off). From a shell, `python -m errors "
        "explain` takes the message (with or without its `ValueError: ` prefix), the id, or with "
        "`-` a whole pasted traceback on stdin, and prints the same page.",
        "",
    ]
    if catalog.get("upstream_shared"):
        lines += [catalog["upstream_shared"]["statement"], ""]
    lines += [
        "Errors of sglang, FlashAttention, ring-flash-attention and yunchang are listed by source "
        "on [Upstream errors](upstream.md), each linked to its entry.",
        "",
    ]
    lines += [
        "Machine-readable: [`api/errors/index.json`](../api/errors/index.json) lists every entry, "
        "`api/errors/<id>.json` holds one entry exactly as in `errors/catalog.json`, and "
        "[`api/errors/schema.json`](../api/errors/schema.json) is its JSON Schema.",
        "",
    ]
    for title, entries in sections(catalog):
        lines += [f"## {title}", ""] + _listing(entries)
    return "\n".join(lines)


def sections(catalog: dict) -> list[tuple[str, list[dict]]]:
    """``(title, entries)`` of the index and the nav: each area's active entries, then the removed
    ones."""
    active = [e for e in catalog["errors"] if e["status"] == "active"]
    by_area = sorted({e["area"] for e in active}, key=lambda area: area_title(area).lower())
    found = [(area_title(area), [e for e in active if e["area"] == area]) for area in by_area]
    only_upstream = [e for e in catalog["errors"] if e["status"] == "upstream_only"]
    removed = [e for e in catalog["errors"] if e["status"] == "removed"]
    return (
        found
        + ([("Raised only upstream", only_upstream)] if only_upstream else [])
        + ([("No longer raised", removed)] if removed else [])
    )


def on_config(config):
    catalog_module = _catalog_module(config)
    nav = [item for item in config["nav"] if SECTION not in item]
    if catalog_module.CATALOG_PATH.exists():
        catalog = _load(catalog_module)
        at = next((n + 1 for n, item in enumerate(nav) if AFTER in item), len(nav) - 1)
        pages = [
            {
                title: [
                    f"errors/{page(e)}" for e in sorted(entries, key=lambda e: e["summary"].lower())
                ]
            }
            for title, entries in sections(catalog)
        ]
        nav.insert(at, {SECTION: ["errors/index.md", "errors/upstream.md", *pages]})
    config["nav"] = nav
    return config


def _load(catalog_module) -> dict:
    try:
        return catalog_module.load()
    except catalog_module.CatalogError as exc:
        raise PluginError(f"error pages: {exc}") from None


def on_files(files, config):
    catalog_module = _catalog_module(config)
    if not catalog_module.CATALOG_PATH.exists():
        return files
    catalog = _load(catalog_module)
    by_id = {entry["id"]: entry for entry in catalog["errors"]}
    try:
        printed = error_outputs.outputs(catalog, Path(config["config_file_path"]).parent)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        raise PluginError(f"error pages: {exc}") from None
    generated = {
        "errors/index.md": index_page(catalog),
        "errors/upstream.md": upstream_page(catalog),
        "api/errors/index.json": index_json(catalog),
        "api/errors/schema.json": catalog_module.SCHEMA_PATH.read_bytes(),
    }
    for entry in catalog["errors"]:
        generated[f"errors/{page(entry)}"] = entry_page(entry, by_id, printed.get(entry["id"]))
        generated[f"errors/{entry['id']}/index.html"] = redirect_page(entry, 1)
        for alias in entry.get("aliases", []):
            generated[f"errors/{alias}/index.html"] = redirect_page(entry, 2)
        generated[f"api/errors/{entry['id']}.json"] = entry_json(entry)
    for src_uri, content in generated.items():
        if files.get_file_from_path(src_uri) is not None:
            raise PluginError(
                f"error pages: docs/{src_uri} exists; the catalog pages are generated, remove it"
            )
        files.append(File.generated(config, src_uri, content=content))
    return files
