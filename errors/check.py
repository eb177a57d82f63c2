"""Every validation of the catalog against itself, its schema, its git history and the code.

Rules (each problem is reported with the rule's name):

* ``load``: the file is JSON with an ``errors`` list.
* ``schema``: it validates against ``errors/schema.json`` (draft 2020-12, with a ``FormatChecker``).
* ``load``: also fails on a duplicated id (:func:`errors.catalog.parse`).
* ``ids``: ``id`` is the first 16 hex digits of SHA-256 of ``id_basis.input``; ids, slugs, aliases
  and external alias ids are unique; every ``related`` id exists and is not the entry itself.
* ``upstream``: every ``upstream`` note says what it was checked against: ``commit`` (40 hex
  digits), or, where the upstream version has no commit that can be named, ``unpinned`` saying so;
  not both.
* ``upstream-messages``: every message of ``errors/upstream/*.json`` names the commit it was read at
  and maps to an entry the catalog has (:func:`errors.upstream.problems`).
* ``coverage``: the AST scan of ``attn_ref/`` and ``kernels/`` and the active entries map one to
  one.
* ``derived``: path, lines, function, excerpt and message (template, placeholders, regex) equal what
  the code says now (``python -m errors sync`` fixes this).
* ``determinism``: syncing twice gives byte-identical text, equal to the file.
* ``history``: against the catalog at a git revision (default ``HEAD``), no entry disappears, no
  ``id_basis`` changes, no slug or external alias is lost (an old slug must stay as slug or alias),
  no removed entry comes back. Skipped, and said so, outside a git work tree or where the catalog
  did not exist at that revision; a revision git does not know is a problem, not a skip.
* ``examples``: see :mod:`errors.examples`.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import catalog as cat
from .examples import example_problems, skip_reason
from .sync import describe_site, scan_package, sync
from .upstream import UPSTREAM_DIR, problems as upstream_message_problems


@dataclass
class Report:
    problems: list = field(default_factory=list)  # (rule, where, detail)
    skipped: list = field(default_factory=list)  # (rule, where, reason)
    counts: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, rule: str, where: str, detail: str) -> None:
        self.problems.append((rule, where, detail))


def id_problems(catalog: dict) -> list[tuple[str, str]]:
    problems, owners = [], {}
    ids = {e["id"] for e in catalog["errors"]}
    for entry in catalog["errors"]:
        basis = entry.get("id_basis", {}).get("input", "")
        if not basis.startswith(cat.ID_PREFIX) or entry["id"] != cat.id_of_basis(basis):
            problems.append((entry["id"], "id is not sha256/64 of id_basis.input"))
        for name in cat.names(entry):
            if name in owners and owners[name] != entry["id"]:
                problems.append((entry["id"], f"{name!r} is also used by entry {owners[name]}"))
            owners.setdefault(name, entry["id"])
        for link in entry.get("related", []):
            if link["id"] == entry["id"]:
                problems.append((entry["id"], "related to itself"))
            elif link["id"] not in ids:
                problems.append((entry["id"], f"related id {link['id']} does not exist"))
    return problems


def upstream_problems(catalog: dict) -> list[tuple[str, str]]:
    """Entries whose upstream note does not say which upstream version it was checked against."""
    problems = []
    for entry in catalog["errors"]:
        upstream = entry.get("upstream")
        if not upstream:
            continue
        given = [key for key in ("commit", "unpinned") if upstream.get(key)]
        if not given:
            problems.append(
                (
                    entry["id"],
                    "the upstream note names no commit: add upstream.commit (the upstream commit "
                    "it was checked against) or upstream.unpinned (why none can be named)",
                )
            )
        elif len(given) == 2:
            problems.append(
                (entry["id"], "upstream has both commit and unpinned; keep the one that is true")
            )
    return problems


def history_problems(catalog: dict, old_text: str) -> list[tuple[str, str]]:
    """Compare with an earlier catalog text: nothing may disappear or change identity."""
    old = cat.parse(old_text, "the catalog at the base revision")
    now = {e["id"]: e for e in catalog["errors"]}
    problems = []
    for entry in old["errors"]:
        new = now.get(entry["id"])
        if new is None:
            problems.append(
                (
                    entry["id"],
                    f"entry {entry.get('slug')} was deleted; set status to removed instead",
                )
            )
            continue
        if new.get("id_basis") != entry.get("id_basis"):
            problems.append((entry["id"], "id_basis changed; it is frozen at birth"))
        if entry.get("slug") != new.get("slug") and entry.get("slug") not in new.get("aliases", []):
            problems.append((entry["id"], f"old slug {entry.get('slug')} must stay as an alias"))
        if entry.get("status") == "removed" and new.get("status") != "removed":
            problems.append((entry["id"], "a removed entry came back; write a new entry instead"))
        kept = {alias["id"] for alias in new.get("external_aliases", [])}
        for alias in entry.get("external_aliases", []):
            if alias.get("id") not in kept:
                problems.append(
                    (entry["id"], f"external alias {alias.get('id')} was dropped; users paste it")
                )
    return problems


class NoHistory(Exception):
    """There is no earlier catalog to compare with: the ``history`` rule is skipped, and says
    why."""


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
        )
    except OSError as exc:
        raise NoHistory(f"git cannot run: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise ValueError("git did not answer within 60 s") from None


def git_text(root: Path, revision: str, path: Path) -> str:
    """The catalog file as it was at ``revision``.

    ``NoHistory`` outside a git work tree, for a catalog outside ``root``, or where the file did not
    exist at that revision; ``ValueError`` for a revision git does not know (a typo must not pass).
    """
    if not revision.strip() or revision.startswith("-"):
        raise ValueError(f"{revision!r} is not a git revision")
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise NoHistory(f"the catalog is outside {root}") from None
    if _git(root, "rev-parse", "--is-inside-work-tree").returncode != 0:
        raise NoHistory(f"{root} is not a git work tree")
    commit = _git(
        root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}"
    )
    if commit.returncode != 0:
        raise ValueError(f"unknown git revision {revision!r}")
    shown = _git(root, "show", f"{commit.stdout.strip()}:{rel}")
    if shown.returncode != 0:
        raise NoHistory(f"no catalog at {rel} in revision {revision}")
    return shown.stdout


def check(
    root: Path = cat.ROOT,
    catalog_path: Path = cat.CATALOG_PATH,
    run_examples: bool = True,
    base: Optional[str] = "HEAD",
    upstream_dir: Optional[Path] = None,
) -> Report:
    """Run every rule; ``run_examples=False`` skips executing examples, ``base=None`` the git rule.

    ``upstream_dir`` holds the upstream messages (default: ``upstream/`` beside the catalog
    file)."""
    started = time.perf_counter()
    report = Report()
    root, catalog_path = Path(root), Path(catalog_path)
    try:
        text = cat.read_text(catalog_path)
        catalog = cat.parse(text, str(catalog_path))
    except cat.CatalogError as exc:
        report.add("load", str(catalog_path), str(exc))
        report.seconds = time.perf_counter() - started
        return report

    for where, message in cat.schema_problems(catalog):
        report.add("schema", where, message)
    if report.problems:  # the other rules assume the structure the schema guarantees
        report.seconds = time.perf_counter() - started
        return report
    for where, message in id_problems(catalog):
        report.add("ids", where, message)
    for where, message in upstream_problems(catalog):
        report.add("upstream", where, message)

    upstream_dir = (
        upstream_dir if upstream_dir is not None else catalog_path.with_name(UPSTREAM_DIR.name)
    )
    for where, message in upstream_message_problems(catalog, upstream_dir):
        report.add("upstream-messages", where, message)

    sites = scan_package(root)
    result = sync(catalog, sites, root)
    for site in result.unmatched_sites:
        report.add(
            "coverage",
            f"{site.path}:{site.line}",
            f"raise without a catalog entry: {describe_site(site)}",
        )
    for entry in result.unmatched_entries:
        report.add(
            "coverage",
            entry["id"],
            f"active entry {entry['slug']} has no raise in the code; "
            "fix its source or set status to removed",
        )
    synced = cat.dumps(result.catalog)
    stored = {e["id"]: e for e in catalog["errors"]}
    for entry in result.catalog["errors"]:
        for key in ("source", "message", "docs_url", "api_url"):
            if entry.get(key) != stored[entry["id"]].get(key):
                report.add(
                    "derived",
                    entry["id"],
                    f"{key} differs from the code (run: python -m errors sync)",
                )
    again = cat.dumps(sync(cat.parse(synced), sites, root).catalog)
    if again != synced:
        report.add("determinism", str(catalog_path), "syncing twice gives different text")
    elif synced != text:
        report.add(
            "determinism",
            str(catalog_path),
            "the file differs from a fresh sync (run: python -m errors sync)",
        )

    if base is not None:
        try:
            old_text = git_text(root, base, catalog_path)
        except NoHistory as exc:
            report.skipped.append(("history", base, str(exc)))
        except ValueError as exc:
            report.add("history", base, str(exc))
        else:
            try:
                for where, message in history_problems(catalog, old_text):
                    report.add("history", where, message)
            except cat.CatalogError as exc:
                report.add("history", base, str(exc))

    if run_examples:
        for entry in catalog["errors"]:
            reason = skip_reason(entry)
            if reason:
                report.skipped.append(("examples", entry["slug"], reason))
                continue
            for message in example_problems(entry, catalog, root):
                report.add("examples", entry["slug"], message)

    report.counts = {
        "entries": len(catalog["errors"]),
        "active": sum(e["status"] == "active" for e in catalog["errors"]),
        "removed": sum(e["status"] == "removed" for e in catalog["errors"]),
        "raise_sites": len(sites),
        "upstream_only": sum(e["status"] == "upstream_only" for e in catalog["errors"]),
        "shared_with_sglang": sum(bool(e.get("upstream")) for e in catalog["errors"]),
    }
    report.seconds = time.perf_counter() - started
    return report
