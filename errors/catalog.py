"""Load the catalog and answer questions about it: get, match, lookup, explain.

The catalog is ``errors/catalog.json`` (format: ``errors/README.md``). Entries are plain dicts, exactly
as stored. Nothing here imports :mod:`attn_ref` or :mod:`kernels`.
"""

from __future__ import annotations

import hashlib
import json
import re
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Optional, Union

#: The catalog shipped with the package, its JSON Schema, and the repository root it describes.
CATALOG_PATH = Path(__file__).with_name("catalog.json")
SCHEMA_PATH = Path(__file__).with_name("schema.json")
ROOT = Path(__file__).resolve().parent.parent
#: Folders (relative to :data:`ROOT`) whose raises the catalog covers.
PACKAGE_DIRS = ("attn_ref", "kernels")
#: ``id = sha256(ID_PREFIX + type + "\x1f" + template)[:16]``, computed once at birth and then frozen.
ID_PREFIX = "attn-ref\x1f"
ID_ALGORITHM = "sha256/64"

#: Key order of the stored JSON (keys not listed follow in sorted order).
KEY_ORDER = [
    "$schema", "schema_version", "package", "package_version", "docs_base_url", "scope", "upstream_shared",
    "errors",
    "id", "id_basis", "algorithm", "input", "slug", "aliases", "status", "removed_note", "exception", "type",
    "message", "template", "kind", "placeholders", "name", "expr", "conversion", "spec", "pattern", "regex",
    "previous_templates", "summary", "what_it_means", "when_it_happens", "trigger", "common_situations",
    "solutions", "title", "body", "examples", "setup", "requires", "fixed", "guard", "predicate", "true_cases",
    "false_cases", "recovery", "code", "source", "path", "line", "end_line", "function", "excerpt",
    "start_line", "text", "docs_url", "api_url", "related", "relation", "area", "tags", "upstream",
    "repository", "commit", "statement", "ids", "note",
]
_RANK = {key: i for i, key in enumerate(KEY_ORDER)}


class CatalogError(Exception):
    """The catalog file is missing, is not JSON, or lacks the expected structure."""


def entry_id(exception_type: str, template: str, qualifier: str = "") -> tuple[str, str]:
    """``(id, id_basis_input)`` for a new entry: the first 64 bits of SHA-256, as 16 hex digits.

    ``qualifier`` (``path:function``) is appended only when the same message is raised in two places,
    so that the second entry gets its own id.
    """
    basis = f"{ID_PREFIX}{exception_type}\x1f{template}" + (f"\x1f{qualifier}" if qualifier else "")
    return id_of_basis(basis), basis


def id_of_basis(basis: str) -> str:
    """The first 16 hex digits of SHA-256 of the UTF-8 ``id_basis.input``."""
    return hashlib.sha256(basis.encode("utf-8")).hexdigest()[:16]


def canonical(value):
    """``value`` with every dict's keys in :data:`KEY_ORDER` (unknown keys after, sorted)."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (_RANK.get(k, len(_RANK)), k))
        return {k: canonical(value[k]) for k in keys}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def dumps(catalog: dict) -> str:
    """The stored text: canonical key order, entries sorted by id, 2-space indent, final newline."""
    catalog = dict(catalog, errors=sorted(catalog.get("errors", []), key=lambda e: e.get("id", "")))
    return json.dumps(canonical(catalog), indent=2, ensure_ascii=False) + "\n"


def parse(text: str, origin: str = "catalog") -> dict:
    """Parse catalog text; raise :class:`CatalogError` with a readable reason if it is unusable."""
    try:
        catalog = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{origin} is not valid JSON: {exc}") from None
    if not isinstance(catalog, dict) or not isinstance(catalog.get("errors"), list):
        raise CatalogError(f"{origin} has no 'errors' list at the top level")
    if not all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in catalog["errors"]):
        raise CatalogError(f"{origin}: every item of 'errors' must be an object with a string 'id'")
    return catalog


def schema_problems(catalog: dict) -> list[tuple[str, str]]:
    """``(json path, message)`` for every violation of ``errors/schema.json`` (needs ``jsonschema``)."""
    import jsonschema  # a test/tooling dependency: imported only when a check is asked for

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(catalog), key=lambda e: [str(p) for p in e.absolute_path])
    return [("/" + "/".join(str(p) for p in e.absolute_path), e.message) for e in errors]


def load(path: Union[str, Path, None] = None) -> dict:
    """The catalog at ``path`` (default: the shipped one), cached until the file changes.

    ``CatalogError`` if it cannot be read, is not JSON, or (where ``jsonschema`` is installed) does not
    validate against the schema.
    """
    path = Path(path) if path is not None else CATALOG_PATH
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc.strerror}") from None
    return _load_cached(str(path), stamp)


@lru_cache(maxsize=8)
def _load_cached(path: str, stamp: int) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc}") from None
    catalog = parse(text, path)
    try:
        problems = schema_problems(catalog)
    except ImportError:
        problems = []
    if problems:
        where, message = problems[0]
        raise CatalogError(f"{path} does not match the catalog schema at {where}: {message}")
    return catalog


def docs_url(entry: dict, catalog: Optional[dict] = None) -> str:
    """The entry's page: ``<docs_base_url>/errors/<id>/``."""
    catalog = catalog if catalog is not None else load()
    return f"{catalog['docs_base_url'].rstrip('/')}/errors/{entry['id']}/"


def api_url(entry: dict, catalog: Optional[dict] = None) -> str:
    """The entry's JSON document: ``<docs_base_url>/api/errors/<id>.json``."""
    catalog = catalog if catalog is not None else load()
    return f"{catalog['docs_base_url'].rstrip('/')}/api/errors/{entry['id']}.json"


def get(id_or_slug: str, catalog: Optional[dict] = None) -> dict:
    """The entry with this id, slug or alias; ``KeyError`` if there is none."""
    catalog = catalog if catalog is not None else load()
    key = id_or_slug.strip().lower()
    for entry in catalog["errors"]:
        if key == entry["id"] or key == entry.get("slug") or key in entry.get("aliases", []):
            return entry
    raise KeyError(f"no catalog entry has the id or slug {id_or_slug!r}")


def literal_length(entry: dict) -> int:
    """Characters of literal text in the template: the more, the more specific the entry."""
    return len(re.sub(r"\{[^{}]*\}", "", entry["message"]["template"]))


def match(message: str, exception_type: Optional[str] = None, catalog: Optional[dict] = None) -> list[dict]:
    """Entries whose regex matches ``message`` in full: active before removed, most specific first.

    Entries whose template has no literal text (messages computed elsewhere) never match by message.
    """
    catalog = catalog if catalog is not None else load()
    found = []
    for entry in catalog["errors"]:
        if exception_type is not None and entry["exception"]["type"] != exception_type:
            continue
        if literal_length(entry) and re.fullmatch(entry["message"]["regex"], message):
            found.append(entry)
    return sorted(found, key=lambda e: (e["status"] != "active", -literal_length(e), e["id"]))


def raise_location(exc: BaseException, root: Path = ROOT) -> Optional[tuple[str, int]]:
    """``(path relative to root, line)`` of the innermost traceback frame inside :data:`PACKAGE_DIRS`."""
    location = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            rel = Path(frame.filename).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        if rel.split("/", 1)[0] in PACKAGE_DIRS:
            location = (rel, frame.lineno)
    return location


def at_location(path: str, line: int, catalog: Optional[dict] = None) -> Optional[dict]:
    """The active entry whose raise statement spans ``path:line``."""
    catalog = catalog if catalog is not None else load()
    for entry in catalog["errors"]:
        source = entry.get("source") or {}
        if entry["status"] == "active" and source.get("path") == path and source["line"] <= line <= source["end_line"]:
            return entry
    return None


def lookup(message_or_exception: Union[str, BaseException], catalog: Optional[dict] = None) -> Optional[dict]:
    """The entry for an exception (by its raise location, else its message and type) or a message text.

    Returns None when nothing in the catalog matches.
    """
    catalog = catalog if catalog is not None else load()
    if isinstance(message_or_exception, BaseException):
        exc = message_or_exception
        location = raise_location(exc)
        entry = at_location(*location, catalog=catalog) if location else None
        if entry is not None and entry["exception"]["type"] == type(exc).__name__:
            return entry
        found = match(str(exc), type(exc).__name__, catalog)
    else:
        found = match(str(message_or_exception).strip(), catalog=catalog)
    return found[0] if found else None


def resolve(query: Union[str, BaseException], catalog: Optional[dict] = None) -> dict:
    """An entry from an exception, an id, a slug or a message; ``KeyError`` if none fits."""
    catalog = catalog if catalog is not None else load()
    if isinstance(query, str):
        if not query.strip():
            raise KeyError("the query is empty: give an error message, an id or a slug")
        try:
            return get(query, catalog)
        except KeyError:
            pass
    entry = lookup(query, catalog)
    if entry is None:
        raise KeyError(f"no catalog entry matches {str(query)!r}")
    return entry


def explain(query: Union[str, BaseException], catalog: Optional[dict] = None) -> str:
    """The entry for an exception, message, id or slug, as markdown (``KeyError`` if none fits)."""
    catalog = catalog if catalog is not None else load()
    return render_markdown(resolve(query, catalog), catalog)


def _code_block(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def render_markdown(entry: dict, catalog: dict) -> str:
    """One entry as a markdown page: the same sections, in the same order, as the docs site."""
    message, when, examples = entry["message"], entry["when_it_happens"], entry["examples"]
    lines = [f"# {entry['slug']}: {entry['summary']}", ""]
    if entry["status"] == "removed":
        lines += [f"> **Note:** this error is no longer raised. {entry.get('removed_note', '')}".rstrip(), ""]
    lines += [
        f"`{entry['exception']['type']}` · id `{entry['id']}` · area `{entry['area']}` · {docs_url(entry, catalog)}",
        "",
        "## Error message",
        "",
        "```text",
        message["template"],
        "```",
        "",
        "## What it means",
        "",
        entry["what_it_means"].rstrip(),
        "",
        "## When it happens",
        "",
        when["trigger"].rstrip(),
        "",
        *[f"- {s}" for s in when["common_situations"]],
        "",
        "## Solutions",
        "",
    ]
    for n, solution in enumerate(entry["solutions"], 1):
        lines += [f"{n}. **{solution['title']}** {solution['body'].rstrip()}", ""]
    lines += ["## Examples", ""]
    if examples.get("setup"):
        lines += ["Setup:", "", _code_block(examples["setup"]), ""]
    for key, title in (("trigger", "Triggers the error"), ("fixed", "Fixed"), ("guard", "Guard"),
                       ("predicate", "Predicate (True when the error would be raised)"), ("recovery", "Recovery")):
        lines += [f"{title}:", "", _code_block(examples[key]["code"]), ""]
        if key == "predicate":
            predicate = examples["predicate"]
            lines += [f"- True (raises): {', '.join(f'`{c}`' for c in predicate['true_cases'])}",
                      f"- False (fine): {', '.join(f'`{c}`' for c in predicate['false_cases'])}", ""]
    source = entry.get("source")
    if source:
        lines += [f"## Source: {source['path']}:{source['line']} in `{source['function']}`", "",
                  _code_block(source["excerpt"]["text"]), ""]
    if entry.get("upstream"):
        up = entry["upstream"]
        lines += ["## Upstream", "", f"Shared with `{up['repository']}`: `{up['path']}`, `{up['function']}`. "
                  f"{up.get('note', '')}".rstrip(), ""]
    if entry.get("related"):
        lines += ["## Related errors", ""]
        by_id = {e["id"]: e for e in catalog["errors"]}
        for link in entry["related"]:
            other = by_id.get(link["id"])
            label = f"{other['slug']}: {other['summary']}" if other else "(unknown entry)"
            lines.append(f"- `{link['id']}` ({link['relation']}) {label}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
