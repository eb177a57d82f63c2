"""Load the catalog and answer questions about it: get, match, lookup, explain, search.

The catalog is ``errors/catalog.json`` (format: ``errors/README.md``). Entries are plain dicts,
exactly as stored. Nothing here imports :mod:`attn_ref` or :mod:`kernels`.

A pasted message is matched exactly first, then loosely (case, trailing punctuation, white space
and quote style aside: :func:`errors.pasted.loose_forms`); a traceback that ends in a bare
``AssertionError`` by its last code lines (:func:`errors.upstream.match_code`). :func:`find` says
which upstream wording matched, so that :func:`explain` leads with it and with the translation of
upstream's argument names; a miss (:class:`NoMatch`) comes with the :func:`closest` entries and
:func:`search_words` to try.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import stat
import sys
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Union

from . import pasted, upstream

#: The catalog shipped with the package, its JSON Schema, and the repository root it describes.
CATALOG_PATH = Path(__file__).with_name("catalog.json")
SCHEMA_PATH = Path(__file__).with_name("schema.json")
ROOT = Path(__file__).resolve().parent.parent
#: Folders (relative to :data:`ROOT`) whose raises the catalog covers.
PACKAGE_DIRS = ("attn_ref", "kernels")
#: ``id = sha256(ID_PREFIX + type + "\x1f" + template)[:16]``, computed once at birth and then
#: frozen.
ID_PREFIX = "attn-ref\x1f"
ID_ALGORITHM = "sha256/64"
#: Environment variable with the docs site that notes and ``explain`` link to (default:
#: ``docs_base_url``).
DOCS_URL_ENV = "ATTN_REF_DOCS_URL"
#: Bounds on what is read as a catalog: file size, and nesting of JSON containers (the catalog has
#: 6).
MAX_CATALOG_BYTES = 32 * 1024 * 1024
MAX_DEPTH = 32

#: Key order of the stored JSON (keys not listed follow in sorted order).
KEY_ORDER = [
    "$schema",
    "schema_version",
    "package",
    "package_version",
    "docs_base_url",
    "scope",
    "upstream_shared",
    "errors",
    "id",
    "id_basis",
    "algorithm",
    "input",
    "slug",
    "aliases",
    "external_aliases",
    "status",
    "removed_note",
    "exception",
    "type",
    "message",
    "template",
    "kind",
    "placeholders",
    "name",
    "expr",
    "conversion",
    "spec",
    "pattern",
    "regex",
    "previous_templates",
    "summary",
    "what_it_means",
    "when_it_happens",
    "trigger",
    "common_situations",
    "solutions",
    "title",
    "body",
    "examples",
    "setup",
    "requires",
    "fixed",
    "guard",
    "predicate",
    "true_cases",
    "false_cases",
    "recovery",
    "code",
    "source",
    "path",
    "line",
    "end_line",
    "function",
    "excerpt",
    "start_line",
    "text",
    "docs_url",
    "api_url",
    "related",
    "relation",
    "area",
    "tags",
    "upstream",
    "repository",
    "commit",
    "unpinned",
    "url",
    "statement",
    "ids",
    "note",
]
_RANK = {key: i for i, key in enumerate(KEY_ORDER)}


class CatalogError(Exception):
    """The catalog file is missing, is not JSON, or lacks the expected structure."""


class NoMatch(KeyError):
    """Nothing in the catalog fits the query (``query``: what was asked)."""

    def __init__(self, message: str, query: str):
        super().__init__(message)
        self.query = query


@dataclass
class Found:
    """What a lookup found: the entry, the upstream message it matched through (None: the entry
    itself), and whether only loosely (case, punctuation, white space or quotes aside)."""

    entry: dict
    upstream: Optional[dict] = None
    loose: bool = False


def entry_id(exception_type: str, template: str, qualifier: str = "") -> tuple[str, str]:
    """``(id, id_basis_input)`` for a new entry: the first 64 bits of SHA-256, as 16 hex digits.

    ``qualifier`` (``path:function``) is appended only when the same message is raised in two
    places, so that the second entry gets its own id.
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
    """The stored text: canonical key order, entries sorted by id, 2-space indent, final newline.

    Characters UTF-8 cannot hold (a lone surrogate in a message) are written as JSON ``\\uXXXX``
    escapes, which read back as the same character.
    """
    catalog = dict(catalog, errors=sorted(catalog.get("errors", []), key=lambda e: e.get("id", "")))
    text = json.dumps(canonical(catalog), indent=2, ensure_ascii=False) + "\n"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def read_text(path: Union[str, Path]) -> str:
    """The text of a catalog file; :class:`CatalogError` if it is missing, not a regular file, too
    large, binary or not UTF-8 (never blocks on a FIFO or a device)."""
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise CatalogError(f"cannot read the catalog {path}: not a regular file")
        if info.st_size > MAX_CATALOG_BYTES:
            raise CatalogError(
                f"cannot read the catalog {path}: {info.st_size} bytes, more than a catalog "
                f"can be ({MAX_CATALOG_BYTES})"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc.strerror or exc}") from None
    if b"\0" in data:
        raise CatalogError(f"cannot read the catalog {path}: it is a binary file, not JSON text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CatalogError(
            f"cannot read the catalog {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} "
            f"at offset {exc.start})"
        ) from None


def _depth_exceeds(value, limit: int) -> bool:
    """Whether JSON containers in ``value`` nest deeper than ``limit`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return False


def parse(text: str, origin: str = "catalog") -> dict:
    """Parse catalog text; raise :class:`CatalogError` with a readable reason if it is unusable.

    Unusable: not JSON, containers nested more than :data:`MAX_DEPTH` deep, a number too long to
    read, no ``errors`` list of objects with string ids, or one id used by two entries.
    """
    try:
        catalog = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{origin} is not valid JSON: {exc}") from None
    except RecursionError:
        raise CatalogError(f"{origin} nests JSON arrays or objects too deeply to read") from None
    # json.loads raises a plain ValueError only for an integer too long to convert
    except ValueError:
        raise CatalogError(
            f"{origin} holds a number with more digits than can be read "
            f"({sys.get_int_max_str_digits()})"
        ) from None
    if _depth_exceeds(catalog, MAX_DEPTH):
        raise CatalogError(
            f"{origin} nests JSON arrays or objects more than {MAX_DEPTH} levels deep"
        )
    if not isinstance(catalog, dict) or not isinstance(catalog.get("errors"), list):
        raise CatalogError(f"{origin} has no 'errors' list at the top level")
    if not all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in catalog["errors"]):
        raise CatalogError(f"{origin}: every item of 'errors' must be an object with a string 'id'")
    first = {}
    for index, entry in enumerate(catalog["errors"]):
        if entry["id"] in first:
            raise CatalogError(
                f"{origin}: duplicate id {entry['id']!r} (entries {first[entry['id']]} and {index} "
                "of 'errors')"
            )
        first[entry["id"]] = index
    return catalog


def schema_problems(catalog: dict) -> list[tuple[str, str]]:
    """``(json path, message)`` for every violation of ``errors/schema.json`` (needs
    ``jsonschema``)."""
    import jsonschema  # a test/tooling dependency: imported only when a check is asked for

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(catalog), key=lambda e: [str(p) for p in e.absolute_path])
    return [("/" + "/".join(str(p) for p in e.absolute_path), e.message) for e in errors]


def load(path: Union[str, Path, None] = None) -> dict:
    """The catalog at ``path`` (default: the shipped one), cached until the file changes.

    ``CatalogError`` if it cannot be read, is not JSON, or (where ``jsonschema`` is installed) does
    not validate against the schema.
    """
    path = Path(path) if path is not None else CATALOG_PATH
    try:
        info = path.stat()
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc.strerror or exc}") from None
    return _load_cached(str(path), info.st_mtime_ns, info.st_size)


@lru_cache(maxsize=8)
def _load_cached(path: str, stamp: int, size: int) -> dict:
    catalog = parse(read_text(path), path)
    try:
        problems = schema_problems(catalog)
    except ImportError:
        problems = []
    if problems:
        where, message = problems[0]
        raise CatalogError(f"{path} does not match the catalog schema at {where}: {message}")
    return catalog


def docs_path(entry: dict) -> str:
    """The entry page's path under the site's root: ``errors/<slug>/`` (``errors/<id>/`` redirects
    there)."""
    return f"errors/{entry['slug']}/"


def docs_url(entry: dict, catalog: Optional[dict] = None) -> str:
    """The entry's page on the published site: ``<docs_base_url>/errors/<slug>/`` (the stored
    field)."""
    catalog = catalog if catalog is not None else load()
    return f"{catalog['docs_base_url'].rstrip('/')}/{docs_path(entry)}"


def reader_docs_url(entry: dict, catalog: Optional[dict] = None) -> Optional[str]:
    """The entry's page on the site readers use: under ``$ATTN_REF_DOCS_URL`` when that is set (an
    empty value means no site, and gives None), else :func:`docs_url`."""
    base = os.environ.get(DOCS_URL_ENV)
    if base is None:
        return docs_url(entry, catalog)
    base = base.strip().rstrip("/")
    return f"{base}/{docs_path(entry)}" if base else None


def api_url(entry: dict, catalog: Optional[dict] = None) -> str:
    """The entry's JSON document: ``<docs_base_url>/api/errors/<id>.json``."""
    catalog = catalog if catalog is not None else load()
    return f"{catalog['docs_base_url'].rstrip('/')}/api/errors/{entry['id']}.json"


def names(entry: dict) -> list[str]:
    """Everything that names the entry: id, slug, aliases and the ids of its external aliases."""
    return [
        entry["id"],
        entry.get("slug"),
        *entry.get("aliases", []),
        *(alias["id"] for alias in entry.get("external_aliases", [])),
    ]


def get(id_or_slug: str, catalog: Optional[dict] = None) -> dict:
    """The entry with this id, slug, alias or external alias id; ``KeyError`` if there is none."""
    catalog = catalog if catalog is not None else load()
    key = id_or_slug.strip().lower()
    for entry in catalog["errors"]:
        if key in names(entry):
            return entry
    raise KeyError(f"no catalog entry has the id or slug {id_or_slug!r}")


def literal_length(entry: dict) -> int:
    """Characters of literal text in the template: the more, the more specific the entry."""
    return len(re.sub(r"\{[^{}]*\}", "", entry["message"]["template"]))


def match(
    message: str,
    exception_type: Optional[str] = None,
    catalog: Optional[dict] = None,
    loose: bool = False,
) -> list[dict]:
    """Entries whose regex matches ``message`` in full (``loose``: one of its
    :func:`~errors.pasted.loose_forms`, in any case): active before removed, most specific first.

    Entries whose template has no literal text (messages computed elsewhere) never match by message.
    """
    catalog = catalog if catalog is not None else load()
    forms = pasted.loose_forms(message) if loose else [message]
    found = []
    for entry in catalog["errors"]:
        if exception_type is not None and entry["exception"]["type"] != exception_type:
            continue
        regex = pasted.compiled(entry["message"]["regex"], loose)
        if literal_length(entry) and any(regex.fullmatch(form) for form in forms):
            found.append(entry)
    return sorted(found, key=lambda e: (e["status"] == "removed", -literal_length(e), e["id"]))


def match_pasted(
    message: str,
    exception_type: Optional[str],
    catalog: dict,
    upstream_dir: Optional[Path] = None,
    loose: bool = False,
) -> list[Found]:
    """Entries for a pasted message, best first, each with the upstream message it matched
    through: the package's own templates and every upstream wording (``errors/upstream/*.json``,
    each mapped to its entry) compete on literal text, so an exact upstream wording
    (``block_table must have contiguous last dimension``) wins over a broad package template
    (``{name} must have contiguous last dimension``). At equal specificity the pasted exception
    type decides, then the package's own template."""
    by_id = {e["id"]: e for e in catalog["errors"]}
    scored = [
        (literal_length(e), e["exception"]["type"] == exception_type, 1, Found(e, None, loose))
        for e in match(message, catalog=catalog, loose=loose)
    ]
    for found in upstream.match(message, upstream_dir or upstream.UPSTREAM_DIR, loose):
        entry = by_id.get(found["entry"])
        if entry is not None:
            scored.append(
                (
                    upstream.literal_length(found["template"]),
                    found["exception"] == exception_type,
                    0,
                    Found(entry, found, loose),
                )
            )
    scored.sort(key=lambda s: (s[3].entry["status"] == "removed", -s[0], not s[1], -s[2]))
    seen, ordered = set(), []
    for *_, found in scored:
        if found.entry["id"] not in seen:
            seen.add(found.entry["id"])
            ordered.append(found)
    return ordered


def raise_location(exc: BaseException, root: Path = ROOT) -> Optional[tuple[str, int]]:
    """``(path relative to root, line)`` of the innermost traceback frame inside
    :data:`PACKAGE_DIRS`."""
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
        if (
            entry["status"] == "active"
            and source.get("path") == path
            and source["line"] <= line <= source["end_line"]
        ):
            return entry
    return None


def lookup(query: Union[str, BaseException], catalog: Optional[dict] = None) -> Optional[dict]:
    """The entry for an exception, or for text a user pasted; None when nothing in the catalog fits.

    An exception is found by its raise location, else by its message and type. Text is an id, slug,
    alias or external alias id, or what :func:`errors.pasted.read` understands: a traceback (its
    last exception; a bare ``AssertionError`` by the code lines above it), a ``Type: message``
    line, an attn-ref note, a docs URL, or a bare message, matched exactly, else loosely.
    """
    found = find(query, catalog)
    return found.entry if found else None


def find(query: Union[str, BaseException], catalog: Optional[dict] = None) -> Optional[Found]:
    """:func:`lookup`, saying also which upstream message matched and whether only loosely."""
    catalog = catalog if catalog is not None else load()
    if isinstance(query, BaseException):
        location = raise_location(query)
        entry = at_location(*location, catalog=catalog) if location else None
        if entry is not None and entry["exception"]["type"] == type(query).__name__:
            return Found(entry)
        found = match(str(query), type(query).__name__, catalog)
        return Found(found[0]) if found else None
    text = str(query)
    try:
        return Found(get(text, catalog))
    except KeyError:
        pass
    said = pasted.read(text)
    if said.id is not None:
        try:
            return Found(get(said.id, catalog))
        except KeyError:
            pass
    by_id = {e["id"]: e for e in catalog["errors"]}
    for loose in (False, True):
        for message in filter(str.strip, said.messages):
            found = match_pasted(message, said.exception_type, catalog, loose=loose)
            if found:
                return found[0]
        if said.code:
            for message in upstream.match_code(said.code, said.code_path, loose=loose):
                if message["entry"] in by_id:
                    return Found(by_id[message["entry"]], message, loose)
    return None


def resolve(query: Union[str, BaseException], catalog: Optional[dict] = None) -> dict:
    """:func:`lookup`, but ``KeyError`` (with a readable reason) where nothing fits."""
    return _resolve(query, catalog if catalog is not None else load()).entry


def _resolve(query: Union[str, BaseException], catalog: dict) -> Found:
    if isinstance(query, str):
        if not query.strip():
            raise KeyError(
                "the query is empty: give an error message, a traceback, an id or a slug"
            )
        why = pasted.not_text_reason(query)
        if why:
            raise KeyError(
                f"the query is not text ({why}): give an error message, a traceback, an id or a "
                "slug"
            )
    found = find(query, catalog)
    if found is None:
        shown = str(query).strip()
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise NoMatch(f"no catalog entry matches {shown!r}", str(query))
    return found


def explain(query: Union[str, BaseException], catalog: Optional[dict] = None) -> str:
    """The entry for an exception, message, id or slug, as markdown (``KeyError`` if none fits;
    :class:`NoMatch` where the query is read but nothing fits)."""
    catalog = catalog if catalog is not None else load()
    found = _resolve(query, catalog)
    return render_markdown(found.entry, catalog, found)


#: Words that say nothing about which entry is meant (a search for them finds too much).
_COMMON_WORDS = frozenset(
    (
        "the and for with not must can only but are was has have does got than when from into "
        "this that per all any same every each one two should cannot need needs supports "
        "support supported expected error exception runtimeerror valueerror typeerror "
        "assertionerror notimplementederror traceback most recent call last file line"
    ).split()
)
#: Characters of a query that :func:`closest` compares (the start of a message says the most).
CLOSEST_CHARS = 300


def _folded(text: str) -> str:
    return " ".join(re.sub(r"\{[^{}]*\}", " ", text).lower().split())


def _said(query: str) -> str:
    """What a query says of its error: a bare assert's code, else its most complete message, cut
    to :data:`CLOSEST_CHARS`."""
    said = pasted.read(query)
    return (said.code or next(filter(str.strip, said.messages), query))[:CLOSEST_CHARS]


def closest(query: str, catalog: dict, n: int = 3) -> list[dict]:
    """The ``n`` entries whose messages (their own template and every upstream wording mapped to
    them) read most like the query's message (``difflib`` ratio, case and white space aside)."""
    text = _folded(_said(query))
    by_id = {e["id"]: e for e in catalog["errors"]}
    best: dict[str, float] = {}
    templates = [(e["id"], e["message"]["template"]) for e in catalog["errors"]]
    templates += [
        (m["entry"], m["template"]) for _, m in upstream.messages() if m["entry"] in by_id
    ]
    for entry_id, template in templates:
        ratio = difflib.SequenceMatcher(None, text, _folded(template), autojunk=False).ratio()
        best[entry_id] = max(ratio, best.get(entry_id, 0.0))
    ranked = sorted(best, key=lambda i: (by_id[i]["status"] == "removed", -best[i], i))
    return [by_id[i] for i in ranked[:n]]


def _haystack(entry: dict) -> str:
    return " ".join(
        [
            entry["id"],
            entry["slug"],
            entry["summary"],
            entry["message"]["template"],
            entry["area"],
            entry["exception"]["type"],
            *entry["tags"],
            entry["what_it_means"],
        ]
    ).lower()


def search(words: list[str], catalog: dict) -> list[dict]:
    """Entries whose id, slug, summary, template, area, type, tags or meaning contain every word
    (case aside)."""
    words = [w.lower() for w in words]
    return [e for e in catalog["errors"] if all(w in _haystack(e) for w in words)]


def search_words(query: str, catalog: dict, near: list[dict]) -> list[str]:
    """Words to try with ``python -m errors search``: the query's rarest words that, together,
    still find an entry (at most two), else the name of the nearest entry (``near[0]``)."""
    words = []
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]+", _said(query).lower()):
        if len(word) > 2 and word not in _COMMON_WORDS and word not in words:
            words.append(word)
    counts = {w: len(search([w], catalog)) for w in words}
    chosen: list[str] = []
    for word in sorted((w for w in words if counts[w]), key=lambda w: counts[w]):
        if len(chosen) < 2 and search(chosen + [word], catalog):
            chosen.append(word)
    return chosen or ([near[0]["slug"].split("/")[-1]] if near else [])


def _code_block(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def matched_lines(found: Found) -> list[str]:
    """What an answer leads with when the query matched an upstream wording or only loosely: the
    translation of upstream's argument names, then the wording matched and where it comes from."""
    lines = []
    message = found.upstream
    if message is not None:
        for cpp, python in upstream.translated_names([message]):
            lines.append(
                f"> **`{cpp}` is `{python}`**: upstream's C++ argument `{cpp}` is `{python}` in "
                "`flash_attn_with_kvcache` (sglang's and attn-ref's)."
            )
        data = upstream.source_of(message)
        bare = f"{upstream.BARE_NOTE}; " if message["kind"] == upstream.BARE else ""
        lines.append(
            f"> Matched upstream's `{upstream.pasted_form(message)}` ({bare}{data['title']}: "
            f"`{message['path']}`, `{message['function']}`)."
        )
    if found.loose:
        lines.append(
            "> Matched loosely: letter case, trailing punctuation, white space or quote style "
            "differ from the message."
        )
    return lines + [""] if lines else []


def render_markdown(entry: dict, catalog: dict, found: Optional[Found] = None) -> str:
    """One entry as a markdown page: the same sections, in the same order, as the docs site;
    ``found`` (how a query matched it) adds :func:`matched_lines` under the title."""
    message, when, examples = entry["message"], entry["when_it_happens"], entry["examples"]
    lines = [f"# {entry['slug']}: {entry['summary']}", ""]
    lines += matched_lines(found) if found else []
    if entry["status"] == "upstream_only":
        lines += [
            '> **Note:** attn-ref never raises this error; upstream does (see "Also raised '
            'upstream as"). '
            "The examples show the same computation done with attn-ref.",
            "",
        ]
    if entry["status"] == "removed":
        lines += [
            f"> **Note:** this error is no longer raised. {entry.get('removed_note', '')}".rstrip(),
            "",
        ]
    link = reader_docs_url(entry, catalog)
    lines += [
        " · ".join(
            [
                f"`{entry['exception']['type']}`",
                f"id `{entry['id']}`",
                f"area `{entry['area']}`",
                *([link] if link else []),
            ]
        ),
        "",
    ]
    for alias in entry.get("external_aliases", []):
        lines += [f"Also known as `{alias['id']}` ({alias['source']}).", ""]
    lines += [
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
    for key, title in (
        ("trigger", "Triggers the error"),
        ("fixed", "Fixed"),
        ("predicate", "Predicate (True when the error would be raised)"),
        ("guard", "Guard (after the predicate's definition)"),
        ("recovery", "Recovery"),
    ):
        if key not in examples:  # an upstream-only entry has only fixed and predicate
            continue
        lines += [f"{title}:", "", _code_block(examples[key]["code"]), ""]
        if key == "predicate":
            predicate = examples["predicate"]
            lines += [
                f"- True (raises): {', '.join(f'`{c}`' for c in predicate['true_cases'])}",
                f"- False (fine): {', '.join(f'`{c}`' for c in predicate['false_cases'])}",
                "",
            ]
    source = entry.get("source")
    if source:
        lines += [
            f"## Source: {source['path']}:{source['line']} in `{source['function']}`",
            "",
            _code_block(source["excerpt"]["text"]),
            "",
        ]
    if entry.get("upstream"):
        up = entry["upstream"]
        where = f"`{up['repository']}`" + (
            f" at `{up['commit']}`"
            if up.get("commit")
            else f" ({up['unpinned']})"
            if up.get("unpinned")
            else ""
        )
        lines += [
            "## Upstream",
            "",
            f"Shared with {where}: `{up['path']}`, `{up['function']}`. "
            f"{up.get('note', '')}".rstrip(),
            "",
        ]
    lines += upstream.render_markdown_section(entry)
    if entry.get("related"):
        lines += ["## Related errors", ""]
        by_id = {e["id"]: e for e in catalog["errors"]}
        for link in entry["related"]:
            other = by_id.get(link["id"])
            label = f"{other['slug']}: {other['summary']}" if other else "(unknown entry)"
            lines.append(f"- `{link['id']}` ({link['relation']}) {label}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
