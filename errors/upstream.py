"""Upstream error messages as data: ``errors/upstream/<source>.json``, one file per upstream source.

A file says what was read and holds every message found there (:mod:`errors.upstream_scan`):

* ``source`` (the file's name), ``title``, ``repository``;
* ``files``: ``[{path, commit | unpinned, functions?, bare_asserts?, fork_of?}]``, what is scanned
  in a checkout of the repository (``functions``: only messages raised there; absent: every message
  of the file; ``bare_asserts``: Python asserts without a message too, by their source text;
  ``fork_of``: the file is a fork of what another source reads, and only the wordings that
  source's data lacks are kept);
* ``messages``: ``[{path, commit | unpinned, function, kind, exception, template, regex,
  occurrences, entry}]`` in source order, one per distinct (path, function, template). ``entry`` is
  authored: the catalog id of the entry for the same condition (an entry the package raises, or an
  upstream-only entry). Everything else is derived by :func:`refresh`, which keeps each message's
  ``entry`` (by template) when the list is scanned again.

``python -m errors scan CHECKOUT --upstream FILE`` refreshes a file from a checkout;
``python -m errors check`` fails when a message has no entry or names one the catalog lacks.

:func:`match` finds the messages a pasted text is (exactly, or ``loose``: case, trailing
punctuation, white space and quote style aside, :func:`errors.pasted.loose_forms`);
:func:`match_code` the bare asserts whose source a traceback's last code lines are.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Optional

from . import pasted
from .upstream_scan import BARE, scan_upstream

#: Where the data files live, and the order in which sources are listed (site, ``explain``).
UPSTREAM_DIR = Path(__file__).with_name("upstream")
SOURCE_ORDER = (
    "sglang-wrapper",
    "fa3",
    "sgl-flash-attn",
    "fa2",
    "sglang-sp",
    "ring-flash-attention",
    "yunchang",
    "transformers",
)
_HEADER_KEYS = ("source", "title", "repository", "files")


def data_files(folder: Path = UPSTREAM_DIR) -> list[Path]:
    """The data files, in :data:`SOURCE_ORDER` (others after, by name)."""
    rank = {name: i for i, name in enumerate(SOURCE_ORDER)}
    return sorted(folder.glob("*.json"), key=lambda p: (rank.get(p.stem, len(rank)), p.stem))


def refresh(data: dict, checkout: Path, folder: Path = UPSTREAM_DIR) -> dict:
    """``data`` with its messages scanned again from ``checkout``; authored ``entry`` fields
    kept. A file that is a ``fork_of`` another source keeps only the wordings that source's data
    file (in ``folder``) lacks."""
    entries = {m["template"]: m.get("entry") for m in data.get("messages", [])}
    messages, index = [], {}
    for spec in data["files"]:
        pin = {k: spec[k] for k in ("commit", "unpinned") if k in spec}
        functions = set(spec["functions"]) if spec.get("functions") else None
        known = _templates(Path(folder) / f"{spec['fork_of']}.json") if "fork_of" in spec else set()
        scanned = scan_upstream(
            Path(checkout), [spec["path"]], functions, spec.get("bare_asserts", False)
        )
        for found in scanned:
            key = (found.path, found.function, found.message.template)
            if found.message.template in known:
                continue
            if key in index:
                index[key]["occurrences"] += 1
                continue
            row = {
                "path": found.path,
                **pin,
                **{k: v for k, v in found.as_json().items() if k != "path"},
                "occurrences": 1,
                "entry": entries.get(found.message.template),
            }
            index[key] = row
            messages.append(row)
    return {**{k: data[k] for k in _HEADER_KEYS}, "messages": messages}


def _templates(path: Path) -> set[str]:
    return {m["template"] for m in json.loads(path.read_text(encoding="utf-8"))["messages"]}


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def refresh_file(checkout: Path, path: Path) -> tuple[dict, int]:
    """Rescan ``path``'s source in ``checkout`` and rewrite it; returns the data and the number of
    messages without an entry."""
    data = refresh(json.loads(Path(path).read_text(encoding="utf-8")), checkout, Path(path).parent)
    Path(path).write_text(dumps(data), encoding="utf-8")
    return data, sum(m["entry"] is None for m in data["messages"])


@lru_cache(maxsize=4)
def _load(folder: str, stamp: tuple) -> tuple[dict, ...]:
    return tuple(json.loads(p.read_text(encoding="utf-8")) for p in data_files(Path(folder)))


def load_all(folder: Path = UPSTREAM_DIR) -> tuple[dict, ...]:
    """Every data file (cached until a file changes)."""
    stamp = tuple((p.name, p.stat().st_mtime_ns) for p in data_files(folder))
    return _load(str(folder), stamp)


def messages(folder: Path = UPSTREAM_DIR) -> list[tuple[dict, dict]]:
    """``(source data, message)`` for every upstream message."""
    return [(data, m) for data in load_all(folder) for m in data["messages"]]


def by_entry(folder: Path = UPSTREAM_DIR) -> dict[str, list[tuple[dict, dict]]]:
    """Catalog id -> the upstream messages mapped to it."""
    found: dict = {}
    for data, message in messages(folder):
        found.setdefault(message["entry"], []).append((data, message))
    return found


#: FlashAttention's C++ argument names (the first word of its messages) -> the Python argument of
#: ``flash_attn_with_kvcache`` (sglang's wrapper and attn-ref) that reaches it.
CPP_NAMES = {
    "seqused_k": "cache_seqlens",
    "seqlens_k": "cache_seqlens",
    "leftpad_k": "cache_leftpad",
    "kv_batch_idx": "cache_batch_idx",
    "k_new": "k",
    "v_new": "v",
    "q_v": "qv",
    "kcache": "k_cache",
    "vcache": "v_cache",
    "block_table": "page_table",
    "seqlens_rotary": "rotary_seqlens",
}


def translated_names(found: list[dict]) -> list[tuple[str, str]]:
    """``(C++ name, Python name)`` for the differing names that the messages start with."""
    names = []
    for message in found:
        first = re.match(r"\w+", message["template"])
        python = CPP_NAMES.get(first.group(0)) if first else None
        if python and python != first.group(0) and (first.group(0), python) not in names:
            names.append((first.group(0), python))
    return names


def literal_length(template: str) -> int:
    return len(re.sub(r"\{[^{}]*\}", "", template))


def match(text: str, folder: Path = UPSTREAM_DIR, loose: bool = False) -> list[dict]:
    """Upstream messages whose regex matches ``text`` in full, most literal text first; ``loose``:
    a form of it that :func:`errors.pasted.loose_forms` gives, in any case."""
    forms = pasted.loose_forms(text) if loose else [text]
    found = [
        m
        for _, m in messages(folder)
        if any(pasted.compiled(m["regex"], loose).fullmatch(form) for form in forms)
    ]
    return sorted(found, key=lambda m: -literal_length(m["template"]))


def match_code(
    code: str, path: Optional[str] = None, folder: Path = UPSTREAM_DIR, loose: bool = False
) -> list[dict]:
    """The bare asserts whose source ``code`` (a traceback's last code lines) is (``loose``: as
    :func:`match`); those of the traceback's file ``path`` (which ends with theirs) first."""
    forms = pasted.loose_forms(code) if loose else [code]
    found = [
        m
        for _, m in messages(folder)
        if m["kind"] == BARE
        and any(pasted.compiled(m["regex"], loose).fullmatch(form) for form in forms)
    ]
    return sorted(found, key=lambda m: not _same_file(path, m["path"]))


def source_of(message: dict, folder: Path = UPSTREAM_DIR) -> dict:
    """The data file (``source``, ``title``, ...) that holds ``message``."""
    return next(data for data, m in messages(folder) if m is message)


def _same_file(pasted_path: Optional[str], path: str) -> bool:
    """Whether a traceback's file (any prefix: site-packages, a checkout) is upstream's ``path``."""
    if not pasted_path:
        return False
    pasted_path = pasted_path.replace("\\", "/")
    return pasted_path == path or pasted_path.endswith("/" + path)


def pasted_form(message: dict) -> str:
    """What a user copies of the message: ``Type: text``, or a bare assert's source line (the last
    code line of a traceback that ends in a bare ``AssertionError``)."""
    if message["kind"] == BARE:
        return message["template"]
    return f"{message['exception']}: {message['template']}"


#: Said of a bare assert wherever its source stands for a message.
BARE_NOTE = "a bare assert: `AssertionError` without a message"


def problems(catalog: dict, folder: Path = UPSTREAM_DIR) -> list[tuple[str, str]]:
    """``(where, what)`` for every upstream message without an entry, or mapped to an entry the
    catalog does not have, and for every data file that does not say which commit it read."""
    ids = {e["id"] for e in catalog["errors"]}
    found = []
    for data, message in messages(folder):
        where = f"upstream/{data['source']}.json: {message['path']} {message['function']}"
        if not (message.get("commit") or message.get("unpinned")):
            found.append((where, "names no commit (commit, or unpinned saying why none)"))
        if not message.get("entry"):
            found.append(
                (where, f"upstream message without a catalog entry: {message['template']!r}")
            )
        elif message["entry"] not in ids:
            found.append((where, f"mapped to {message['entry']}, which is not in the catalog"))
    return found


def render_markdown_section(entry: dict, folder: Optional[Path] = None) -> list[str]:
    """Markdown lines: "Also raised upstream as" with every upstream wording mapped to ``entry``."""
    mapped = by_entry(folder or UPSTREAM_DIR).get(entry["id"], [])
    if not mapped:
        return []
    lines = ["## Also raised upstream as", ""]
    for data, message in mapped:
        pin = message.get("commit", "")[:12] or "unpinned"
        bare = f"{BARE_NOTE}; " if message["kind"] == BARE else ""
        lines.append(
            f"- `{pasted_form(message)}` ({bare}{data['title']}: "
            f"`{message['path']}`, `{message['function']}`, {pin})"
        )
    names = translated_names([m for _, m in mapped])
    if names:
        lines += ["", "Argument names: " + ", ".join(f"`{a}` is `{b}`" for a, b in names) + "."]
    return lines + [""]
