"""Upstream error messages as data: ``errors/upstream/<source>.json``, one file per upstream source.

A file says what was read and holds every message found there (:mod:`errors.upstream_scan`):

* ``source`` (the file's name), ``title``, ``repository``;
* ``files``: ``[{path, commit | unpinned, functions?}]``, what is scanned in a checkout of the
  repository (``functions``: only messages raised there; absent: every message of the file);
* ``messages``: ``[{path, commit | unpinned, function, kind, exception, template, regex,
  occurrences, entry}]`` in source order, one per distinct (path, function, template). ``entry`` is
  authored: the catalog id of the entry for the same condition (an entry the package raises, or an
  upstream-only entry). Everything else is derived by :func:`refresh`, which keeps each message's
  ``entry`` (by template) when the list is scanned again.

``python -m errors scan-upstream CHECKOUT FILE`` refreshes a file from a checkout;
``python -m errors check`` fails when a message has no entry or names one the catalog lacks.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Optional

from .upstream_scan import scan_upstream

#: Where the data files live, and the order in which sources are listed (site, ``explain``).
UPSTREAM_DIR = Path(__file__).with_name("upstream")
SOURCE_ORDER = ("sglang-wrapper", "fa3", "fa2", "sglang-sp", "ring-flash-attention", "yunchang")
_HEADER_KEYS = ("source", "title", "repository", "files")


def data_files(folder: Path = UPSTREAM_DIR) -> list[Path]:
    """The data files, in :data:`SOURCE_ORDER` (others after, by name)."""
    rank = {name: i for i, name in enumerate(SOURCE_ORDER)}
    return sorted(folder.glob("*.json"), key=lambda p: (rank.get(p.stem, len(rank)), p.stem))


def refresh(data: dict, checkout: Path) -> dict:
    """``data`` with its messages scanned again from ``checkout``; authored ``entry`` fields
    kept."""
    entries = {m["template"]: m.get("entry") for m in data.get("messages", [])}
    messages, index = [], {}
    for spec in data["files"]:
        pin = {k: spec[k] for k in ("commit", "unpinned") if k in spec}
        functions = set(spec["functions"]) if spec.get("functions") else None
        for found in scan_upstream(Path(checkout), [spec["path"]], functions):
            key = (found.path, found.function, found.message.template)
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


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def refresh_file(checkout: Path, path: Path) -> tuple[dict, int]:
    """Rescan ``path``'s source in ``checkout`` and rewrite it; returns the data and the number of
    messages without an entry."""
    data = refresh(json.loads(Path(path).read_text(encoding="utf-8")), checkout)
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


def match(text: str, folder: Path = UPSTREAM_DIR) -> list[dict]:
    """Upstream messages whose regex matches ``text`` in full, most literal text first."""
    found = [m for _, m in messages(folder) if re.fullmatch(m["regex"], text)]
    return sorted(found, key=lambda m: -literal_length(m["template"]))


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
        lines.append(
            f"- `{message['exception']}: {message['template']}` ({data['title']}: "
            f"`{message['path']}`, `{message['function']}`, {pin})"
        )
    names = translated_names([m for _, m in mapped])
    if names:
        lines += ["", "Argument names: " + ", ".join(f"`{a}` is `{b}`" for a, b in names) + "."]
    return lines + [""]
