"""``python -m errors``: explain, search, list, check, sync and scan the error catalog.

Exit status: 0 on success, 1 when the answer is "no" (nothing found, drift found, unreadable input),
2 for a malformed command line, 141 (as for SIGPIPE) when whoever reads the output stops early
(``| head``). Problems are one line on stderr, never a traceback; a query that nothing fits is
followed by the closest entries and a ``search`` command to try. Input that is not text is
reported, never echoed. Text that UTF-8 cannot hold (a lone surrogate in a scanned message) is
printed as a ``\\uXXXX`` escape.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import catalog as cat, pasted
from .scan import ScanError, scan_path
from .sync import describe_site

#: Exit status when the reader of the output went away (128 + SIGPIPE, as a shell reports it).
CLOSED_PIPE = 141


def _read_stdin() -> str:
    data = sys.stdin.buffer.read(pasted.MAX_CHARS * 4 + 1)
    if b"\0" in data:
        raise KeyError("the input is not text (it holds NUL bytes: binary data)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(data) - 3:  # a character cut at the read limit
            return data[: exc.start].decode("utf-8")
        raise KeyError(
            f"the input is not text (byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
            "UTF-8)"
        ) from None


def _explain(args, catalog) -> int:
    query = _read_stdin() if args.query == ["-"] else " ".join(args.query)
    try:
        print(cat.explain(query, catalog), end="")
    except cat.NoMatch as miss:
        print(f"error: {miss.args[0]}", file=sys.stderr)
        near = cat.closest(miss.query, catalog)
        if near:
            print("closest entries:", file=sys.stderr)
            for entry in near:
                print(f"  {entry['id']}  {entry['slug']}  {entry['summary']}", file=sys.stderr)
        words = cat.search_words(miss.query, catalog, near)
        if words:
            print(f"try: python -m errors search {' '.join(words)}", file=sys.stderr)
        return 1
    return 0


def _search(args, catalog) -> int:
    words = [w.lower() for w in " ".join(args.words).split()]
    if not words:
        raise KeyError("the search is empty: give one or more words")
    found = cat.search(words, catalog)
    if not found:
        raise KeyError(f"no catalog entry contains all of: {' '.join(words)}")
    for entry in found:
        print(f"{entry['id']}  {entry['slug']}  {entry['summary']}")
    return 0


def _list(args, catalog) -> int:
    if args.json:
        rows = [
            {
                "id": e["id"],
                "slug": e["slug"],
                "status": e["status"],
                "exception": e["exception"]["type"],
                "summary": e["summary"],
                "template": e["message"]["template"],
                "area": e["area"],
                "shared_with_sglang": bool(e["upstream"]),
                "docs_url": e["docs_url"],
            }
            for e in catalog["errors"]
        ]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    for e in catalog["errors"]:
        shared = "sglang" if e["upstream"] else "own"
        print(
            f"{e['id']}  {e['status']:<7}  {e['exception']['type']:<19}  {shared:<6}  {e['slug']}"
        )
    return 0


def _check(args, catalog_path: Path) -> int:
    from .check import check

    report = check(
        catalog_path=catalog_path,
        run_examples=not args.no_examples,
        base=None if args.no_history else args.base,
    )
    for rule, where, reason in report.skipped:
        print(f"skipped  {rule}  {where}: {reason}")
    for rule, where, detail in report.problems:
        print(f"FAIL  {rule}  {where}: {detail}")
    counts = ", ".join(f"{k} {v}" for k, v in report.counts.items())
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    print(f"errors check: {verdict} ({counts}) in {report.seconds:.1f} s")
    return 0 if report.ok else 1


def _sync(args, catalog_path: Path) -> int:
    from .sync import sync_file

    result, changed = sync_file(catalog_path)
    print(f"{catalog_path}: {'updated' if changed else 'already up to date'}")
    for site in result.unmatched_sites:
        print(f"no entry for: {describe_site(site)}")
    for entry in result.unmatched_entries:
        print(f"no raise for: {entry['id']} {entry['slug']}")
    return 0 if not (result.unmatched_sites or result.unmatched_entries) else 1


def _scan_messages(args) -> int:
    from . import upstream
    from .upstream_scan import scan_upstream

    try:
        if args.upstream is not None:
            data, unmapped = upstream.refresh_file(Path(args.path), args.upstream)
            print(f"{args.upstream}: {len(data['messages'])} messages, {unmapped} without an entry")
            return 1 if unmapped else 0
        found = scan_upstream(Path(args.path), ["."])
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise ScanError(f"cannot scan {args.path}: {exc}") from None
    if args.json:
        print(json.dumps([m.as_json() for m in found], indent=2, ensure_ascii=False))
    else:
        for m in found:
            print(f"{m.path} {m.function} {m.exception}: {m.message.template}")
    return 0 if found else 1


def _scan(args) -> int:
    if args.messages or args.upstream is not None:
        return _scan_messages(args)
    sites, problems = scan_path(args.path)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    if args.json:
        rows = [
            {"exception": s.exception, **s.message_json(), "source": s.source_json()} for s in sites
        ]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        for site in sites:
            print(describe_site(site))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m errors", description="The attn-ref error catalog.")
    p.add_argument(
        "--catalog",
        type=Path,
        default=cat.CATALOG_PATH,
        help="catalog file (default: the shipped one)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    explain = sub.add_parser(
        "explain", help="print the entry for a message, traceback, note, id or slug (markdown)"
    )
    explain.add_argument(
        "query", nargs="+", help="what you have; '-' reads it (a whole traceback) from stdin"
    )
    search = sub.add_parser("search", help="entries containing all the words")
    search.add_argument("words", nargs="+")
    listing = sub.add_parser("list", help="every entry, one per line")
    listing.add_argument("--json", action="store_true", help="a JSON array instead")
    check = sub.add_parser("check", help="every validation; exit 1 on any problem")
    check.add_argument("--no-examples", action="store_true", help="do not run the examples")
    check.add_argument(
        "--base", default="HEAD", help="git revision for the never-delete rule (default HEAD)"
    )
    check.add_argument("--no-history", action="store_true", help="skip the never-delete rule")
    sub.add_parser("sync", help="refresh the derived fields (source, message) from the code")
    scan_p = sub.add_parser(
        "scan", help="list the raise sites of any Python tree, without importing it"
    )
    scan_p.add_argument("path")
    scan_p.add_argument("--json", action="store_true", help="a JSON array instead")
    scan_p.add_argument(
        "--messages",
        action="store_true",
        help="every error text instead: C++ TORCH_CHECK / CHECK_* and Python raise / assert",
    )
    scan_p.add_argument(
        "--upstream",
        metavar="FILE",
        type=Path,
        help="rescan PATH (an upstream checkout) as errors/upstream/FILE.json describes, and "
        "rewrite FILE (each message's entry is kept)",
    )
    return p


def _run(args) -> int:
    try:
        if args.command == "scan":
            return _scan(args)
        if args.command == "check":
            return _check(args, args.catalog)
        if args.command == "sync":
            return _sync(args, args.catalog)
        catalog = cat.load(args.catalog)
        return {"explain": _explain, "search": _search, "list": _list}[args.command](args, catalog)
    except (cat.CatalogError, ScanError, KeyError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv=None) -> int:
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    args = parser().parse_args(argv)
    try:
        status = _run(args)
        sys.stdout.flush()  # here, where a closed pipe can still be caught
        return status
    except BrokenPipeError:
        _drop_stdout()
        return CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
