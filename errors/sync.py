"""Refresh the derived fields of the catalog from the code; never touch the authored ones.

Derived (rewritten here): ``source`` (path, line, end_line, function, excerpt), ``message``
(template, kind, placeholders, regex; an old template moves to ``previous_templates`` when the
wording changes), ``docs_url``/``api_url`` per entry, and at the top ``package_version`` and
``upstream_shared``. Everything else (id, id_basis, slug, summary, explanations, solutions,
examples, related, area, tags, upstream, status) is authored and copied through unchanged.

Active entries are paired with raise sites in three passes, each taking only what is left:

1. same exception type, template, path and function (the usual case; several identical sites pair
   in line order);
2. same type and template (the raise moved to another function or file);
3. same type, path and function, when exactly one entry and one site are left there (the wording
   changed).

What stays unpaired is reported: a site without an entry needs one written, an entry without a site
needs ``status: removed``.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import tomllib

from . import catalog as cat
from .scan import RaiseSite, scan

UPSTREAM_STATEMENT = (
    "Entries with an 'upstream' field are raised with the same message by sglang (or by the "
    "FlashAttention code it builds on), possibly as a different exception type (see each entry's "
    "upstream note); all other entries are this package's own."
)


@dataclass
class SyncResult:
    catalog: dict
    pairs: list = field(default_factory=list)  # (entry, site) for every active entry with a raise
    unmatched_sites: list = field(default_factory=list)
    unmatched_entries: list = field(default_factory=list)


def _pair(entries: list[dict], sites: list[RaiseSite]):
    pairs, entries, sites = [], list(entries), list(sites)
    keys = (
        lambda e: (
            e["exception"]["type"],
            e["message"]["template"],
            e["source"]["path"],
            e["source"]["function"],
        ),
        lambda e: (e["exception"]["type"], e["message"]["template"]),
        lambda e: (e["exception"]["type"], e["source"]["path"], e["source"]["function"]),
    )
    site_keys = (
        lambda s: (s.exception, s.message.template, s.path, s.function),
        lambda s: (s.exception, s.message.template),
        lambda s: (s.exception, s.path, s.function),
    )
    for step, (entry_key, site_key) in enumerate(zip(keys, site_keys)):
        by_key: dict = {}
        for site in sites:
            by_key.setdefault(site_key(site), deque()).append(site)
        entries_per_key = Counter(entry_key(e) for e in entries)
        kept, paired = [], set()
        for entry in sorted(entries, key=lambda e: (e["source"]["path"], e["source"]["line"])):
            candidates = by_key.get(entry_key(entry), ())
            unique = step < 2 or (len(candidates) == 1 and entries_per_key[entry_key(entry)] == 1)
            if candidates and unique:
                site = candidates.popleft()
                pairs.append((entry, site))
                paired.add(id(site))
            else:
                kept.append(entry)
        entries, sites = kept, [s for s in sites if id(s) not in paired]
    return pairs, sites, entries


def package_version(root: Path) -> Optional[str]:
    """``version`` from ``root/pyproject.toml``, or None where there is none."""
    try:
        with open(root / "pyproject.toml", "rb") as f:
            return tomllib.load(f).get("project", {}).get("version")
    except (OSError, tomllib.TOMLDecodeError):
        return None


def sync(catalog: dict, sites: list[RaiseSite], root: Optional[Path] = None) -> SyncResult:
    """A copy of ``catalog`` with its derived fields recomputed from ``sites``."""
    fresh = copy.deepcopy(catalog)
    active = [e for e in fresh["errors"] if e.get("status") == "active"]
    pairs, unmatched_sites, unmatched_entries = _pair(active, sites)
    for entry, site in pairs:
        message = site.message_json()
        previous = list(entry["message"].get("previous_templates", []))
        if (
            entry["message"]["template"] != message["template"]
            and entry["message"]["template"] not in previous
        ):
            previous.append(entry["message"]["template"])
        if previous:
            message["previous_templates"] = previous
        entry["message"] = message
        entry["source"] = site.source_json()
    for entry in fresh["errors"]:
        entry["docs_url"] = cat.docs_url(entry, fresh)
        entry["api_url"] = cat.api_url(entry, fresh)
    version = package_version(root) if root is not None else None
    if version is not None:
        fresh["package_version"] = version
    fresh["upstream_shared"] = {
        "statement": UPSTREAM_STATEMENT,
        "ids": sorted(e["id"] for e in fresh["errors"] if e.get("upstream")),
    }
    fresh["errors"] = sorted(fresh["errors"], key=lambda e: e["id"])
    return SyncResult(fresh, pairs, unmatched_sites, unmatched_entries)


def scan_package(root: Path = cat.ROOT) -> list[RaiseSite]:
    """Raise sites of the folders the catalog covers (:data:`errors.catalog.PACKAGE_DIRS`)."""
    folders = [d for d in cat.PACKAGE_DIRS if (root / d).is_dir()]
    sites, _ = scan(root, folders)
    return sites


def describe_site(site: RaiseSite) -> str:
    """``path:line function Type: template`` on one line."""
    template = re.sub(r"\s+", " ", site.message.template)
    return f"{site.path}:{site.line} {site.function} {site.exception}: {template}"


def sync_file(path: Path = cat.CATALOG_PATH, root: Path = cat.ROOT) -> tuple[SyncResult, bool]:
    """Sync the catalog file in place; returns the result and whether the file changed.

    ``CatalogError`` (and the file untouched) when it cannot be read or is not a valid catalog. The
    new text replaces the file in one step (write a sibling, then rename), never half-written.
    """
    text = cat.read_text(path)
    catalog = cat.parse(text, str(path))
    problems = cat.schema_problems(catalog)
    if problems:
        raise cat.CatalogError(
            f"{path} does not match the catalog schema at {problems[0][0]}: {problems[0][1]}"
        )
    result = sync(catalog, scan_package(root), root)
    new_text = cat.dumps(result.catalog)
    if new_text != text:
        try:
            _replace(Path(path), new_text)
        except OSError as exc:
            raise cat.CatalogError(
                f"cannot write the catalog {path}: {exc.strerror or exc}"
            ) from None
    return result, new_text != text


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling of ``path``, then rename it over ``path``."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
