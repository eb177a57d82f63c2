"""The errors tooling under junk input: a corrupt catalog, unscannable paths, huge or odd sources.

Every CLI verb answers with one ``error: ...`` line and exit 1 (``check``: a ``FAIL  load`` line),
never a traceback or a hang; a corrupt catalog never replaces the package's own exception.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from attn_ref import flash_attn_with_kvcache
from errors import catalog as cat, scan as scan_module
from errors.__main__ import main

VERBS = [
    ["explain", "q can only be None when only_qv=True"],
    ["search", "qv"],
    ["list"],
    ["sync"],
    ["check", "--no-examples", "--no-history"],
]


def _shipped() -> dict:
    return json.loads(cat.CATALOG_PATH.read_text(encoding="utf-8"))


def _duplicated_id() -> str:
    catalog = _shipped()
    catalog["errors"].append(catalog["errors"][0])
    return json.dumps(catalog)


CORRUPT = {
    "nested": lambda: "[" * 100_000 + "]" * 100_000,
    "nested-object": lambda: '{"errors": [' + '{"a": ' * 40 + "1" + "}" * 40 + "]}",
    "long-number": lambda: '{"errors": [], "schema_version": ' + "9" * 100_000 + "}",
    "duplicated-id": _duplicated_id,
    "binary": lambda: b"\x00\x01\x02\xff" * 100,
    "not-utf8": lambda: b'{"errors": [], "scope": "\xe9t\xe9"}',
}
REASONS = {
    "nested": "too deeply",
    "nested-object": "more than 32 levels",
    "long-number": "more digits",
    "duplicated-id": "duplicate id",
    "binary": "binary file",
    "not-utf8": "not UTF-8",
}


def _write(path, content):
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)


@pytest.mark.parametrize("kind", CORRUPT)
def test_corrupt_catalog_gives_every_verb_one_line_and_exit_1(capsys, tmp_path, kind):
    path = tmp_path / "catalog.json"
    _write(path, CORRUPT[kind]())
    before = path.read_bytes()
    for verb in VERBS:
        code = main(["--catalog", str(path), *verb])
        out, err = capsys.readouterr()
        assert code == 1, verb
        lines = err if verb[0] != "check" else out.splitlines()[0] + "\n"
        assert lines.count("\n") == 1 and REASONS[kind] in lines and "Traceback" not in out + err, (
            verb,
            out,
            err,
        )
        assert lines.startswith("error: " if verb[0] != "check" else "FAIL  load")
    assert path.read_bytes() == before  # sync wrote nothing


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo"])
def test_unreadable_catalog_paths(capsys, tmp_path, kind):
    path = tmp_path / "catalog.json"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    for verb in VERBS:
        code = main(["--catalog", str(path), *verb])
        out, err = capsys.readouterr()
        assert code == 1 and "cannot read the catalog" in out + err and "Traceback" not in out + err


def test_corrupt_catalog_never_replaces_the_real_exception(monkeypatch, tmp_path):
    path = tmp_path / "catalog.json"
    path.write_text(CORRUPT["nested"]())
    monkeypatch.setattr(cat, "CATALOG_PATH", path)
    cache = torch.randn(1, 8, 1, 16)
    with pytest.raises(ValueError, match="q can only be None when only_qv=True") as info:
        flash_attn_with_kvcache(None, cache, cache)
    assert not hasattr(info.value, "__notes__")

    def broken_load(*_):
        raise RecursionError("anything that goes wrong while finding the note")

    monkeypatch.setattr(cat, "load", broken_load)
    with pytest.raises(ValueError, match="q can only be None when only_qv=True"):
        flash_attn_with_kvcache(None, cache, cache)


def _scan(capsys, *argv):
    code = main(["scan", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda d: "", "the path is empty"),
        (lambda d: "/dev/null", "neither a regular file nor a folder"),
        (
            lambda d: (os.mkfifo(d / "pipe.py"), str(d / "pipe.py"))[1],
            "neither a regular file nor a folder",
        ),
        (lambda d: (d / "empty").mkdir() or str(d / "empty"), "no Python files under"),
        (lambda d: (d / "bad.py").write_text("def f(:\n") and str(d / "bad.py"), "SyntaxError"),
        (
            lambda d: (d / "bin.py").write_bytes(b"\x00\xff" * 50) and str(d / "bin.py"),
            "binary file",
        ),
        (
            lambda d: (d / "latin.py").write_bytes(b"x = '\xe9'\n") and str(d / "latin.py"),
            "not decodable",
        ),
        (
            lambda d: (
                (d / "deep.py").write_text("x = " + "(" * 5000 + ")" * 5000 + "\n")
                and str(d / "deep.py")
            ),
            "too many nested parentheses",
        ),
        (
            lambda d: (
                (d / "long.py").write_text(
                    "def f(a):\n    raise ValueError(f'{" + "a+" * 100_000 + "a}')\n"
                )
                and str(d / "long.py")
            ),
            "nested too deeply",
        ),
    ],
    ids=[
        "empty-path",
        "dev-null",
        "fifo",
        "empty-folder",
        "syntax-error",
        "binary",
        "not-utf8",
        "deep-parens",
        "huge-expression",
    ],
)
def test_scan_where_nothing_can_be_scanned(capsys, tmp_path, make, reason):
    code, out, err = _scan(capsys, make(tmp_path))
    assert (
        code == 1
        and out == ""
        and err.startswith("error: ")
        and reason in err
        and err.count("\n") == 1
    )


def test_scan_of_a_folder_reports_bad_files_and_scans_the_rest(capsys, tmp_path):
    os.mkfifo(tmp_path / "pipe.py")  # would block a reader forever
    (tmp_path / "bad.py").write_text("def f(:\n")
    (tmp_path / "good.py").write_text("def f(x):\n    raise ValueError(f'bad {x}')\n")
    code, out, err = _scan(capsys, str(tmp_path))
    assert code == 0 and out == "good.py:2 f ValueError: bad {x}\n"
    assert sorted(line.split(":")[0] for line in err.splitlines()) == ["warning", "warning"]
    assert (
        "pipe.py: not scanned (not a regular file)" in err
        and "bad.py: not scanned (SyntaxError" in err
    )


def test_lone_surrogate_in_a_message_prints_as_an_escape(tmp_path):
    (tmp_path / "odd.py").write_text('def f():\n    raise ValueError("bad \\udc80 byte")\n')
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    for extra in ([], ["--json"]):
        result = subprocess.run(
            [sys.executable, "-m", "errors", "scan", str(tmp_path), *extra],
            cwd=cat.ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert result.returncode == 0 and result.stderr == ""
        assert "bad \\udc80 byte" in result.stdout
    assert json.loads(result.stdout)[0]["template"] == "bad \udc80 byte"
    assert (
        cat.parse(cat.dumps({"errors": [{"id": "x", "t": "\udc80"}]}))["errors"][0]["t"] == "\udc80"
    )


def test_huge_expression_gets_a_short_placeholder_name(capsys, tmp_path):
    (tmp_path / "wide.py").write_text(
        "def f(x):\n    raise ValueError(f'got {x.a(" + ", ".join(["1"] * 3000) + ")}')\n"
    )
    code, out, _ = _scan(capsys, str(tmp_path))
    name = out.split("{")[1].split("}")[0]
    assert code == 0 and len(name) <= scan_module.MAX_NAME and name.startswith("x_a_1_1")


def test_message_held_in_a_variable_reads_as_the_variable(capsys, tmp_path):
    (tmp_path / "reason.py").write_text(
        "def f(x, why):\n    reason = unsupported_reason(x, mode=3, mask=None, prefix=2)\n    if "
        "reason:\n        raise NotImplementedError(reason)\n    a = b\n    b = a\n    raise "
        "NotImplementedError(a)\n"
    )
    code, out, _ = _scan(capsys, str(tmp_path))
    assert (
        code == 0
        and out
        == "reason.py:4 f NotImplementedError: {reason}\nreason.py:7 f NotImplementedError: {a}\n"
    )


def test_scan_is_linear_in_the_number_of_raises(tmp_path, monkeypatch):
    raises = 4000  # in one function: quadratic before (about 190 s), well under a second now
    lines = ["def f(x):"] + [
        f"    if x == {i}:\n        raise ValueError(f'bad {{x}} number {i}')"
        for i in range(raises)
    ]
    (tmp_path / "big.py").write_text("\n".join(lines) + "\n")
    calls = []
    real = scan_module._assignments
    monkeypatch.setattr(
        scan_module, "_assignments", lambda function: calls.append(1) or real(function)
    )
    started = time.perf_counter()
    sites, problems = scan_module.scan(tmp_path)
    # once per function, not per raise
    assert len(sites) == raises and problems == [] and len(calls) == 1
    assert time.perf_counter() - started < 20
