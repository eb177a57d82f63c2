"""``python -m errors``: answers, and a clear one-line error (never a traceback) on bad input."""

import io
import json
import os
import subprocess
import sys

import pytest

import errors
from errors import catalog as cat
from errors.__main__ import main

Q_NONE = "q can only be None when only_qv=True"


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "query", [Q_NONE, "only-qv/q-none-without-only-qv", "kvcache/q-none-without-only-qv"]
)
def test_explain_by_message_slug_or_old_slug(capsys, query):
    code, out, err = _run(capsys, "explain", *query.split())
    assert code == 0 and err == ""
    entry = errors.get("only-qv/q-none-without-only-qv")
    assert out.startswith(f"# {entry['slug']}: {entry['summary']}")
    for section in (
        "## What it means",
        "## When it happens",
        "## Solutions",
        "## Examples",
        "## Source",
        "## Upstream",
    ):
        assert section in out
    assert entry["docs_url"] in out


def test_explain_by_id_and_rendered_message(capsys):
    entry = errors.get("kv-cache/capacity-exceeded")
    assert _run(capsys, "explain", entry["id"])[1].startswith(f"# {entry['slug']}")
    message = (
        "batch entry 1: cache_seqlens (15) + new tokens (2) exceeds the cache capacity "
        "(16 tokens per sequence)"
    )
    assert _run(capsys, "explain", message)[1].startswith(f"# {entry['slug']}")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["explain", " "], "the query is empty"),
        (["search", " "], "the search is empty"),
        (["search", "no-such-word-anywhere"], "no catalog entry contains"),
        (["scan", "/no/such/path"], "does not exist"),
    ],
)
def test_bad_queries_exit_1_with_one_line(capsys, argv, words):
    code, out, err = _run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and words in err and err.count("\n") == 1


@pytest.mark.parametrize("content", ["{not json", '{"errors": 3}', '{"errors": [{"id": "x"}]}'])
def test_corrupt_catalog_file(capsys, tmp_path, content):
    path = tmp_path / "catalog.json"
    path.write_text(content)
    for command in (["explain", Q_NONE], ["list"], ["sync"]):
        code, out, err = _run(capsys, "--catalog", str(path), *command)
        assert code == 1 and err.startswith("error: ") and "Traceback" not in err
    code, out, _ = _run(capsys, "--catalog", str(path), "check", "--no-examples")
    assert code == 1 and ("FAIL  load" in out or "FAIL  schema" in out)


def test_missing_catalog_file(capsys, tmp_path):
    code, _, err = _run(capsys, "--catalog", str(tmp_path / "none.json"), "list")
    assert code == 1 and err.startswith("error: cannot read the catalog")


def test_list_and_search(capsys):
    code, out, _ = _run(capsys, "list", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["id"] for r in rows] == [e["id"] for e in cat.load()["errors"]]
    assert {r["shared_with_sglang"] for r in rows} == {True, False}
    code, out, _ = _run(capsys, "list")
    assert code == 0 and len(out.splitlines()) == len(rows)
    code, out, _ = _run(capsys, "search", "only_qv", "qv")
    slugs = {line.split()[1] for line in out.splitlines()}
    assert (
        code == 0
        and "only-qv/q-none-without-only-qv" in slugs
        and "only-qv/only-qv-without-qv" in slugs
    )


def test_scan_any_tree(capsys, tmp_path):
    (tmp_path / "lib.py").write_text('def f(x):\n    raise ValueError(f"bad {x}")\n')
    code, out, _ = _run(capsys, "scan", str(tmp_path))
    assert code == 0 and out == "lib.py:2 f ValueError: bad {x}\n"
    code, out, _ = _run(capsys, "scan", str(tmp_path / "lib.py"), "--json")
    (row,) = json.loads(out)
    assert (row["exception"], row["template"], row["source"]["line"]) == (
        "ValueError",
        "bad {x}",
        2,
    )


def test_module_entry_point_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "errors", "explain", "no such error"],
        capture_output=True,
        text=True,
        cwd=cat.ROOT,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def test_a_reader_that_stops_early_gets_no_traceback(capsys, monkeypatch):
    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert main(["list"]) == 141
    # a real pipe whose reader is gone (`python -m errors list | head -0`)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "errors", "list"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cat.ROOT,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141 and result.stderr == ""
