"""The AST scan: raise sites, templates and regexes, on small trees written for each test."""

import re
import textwrap

from errors.scan import scan


def _scan_source(tmp_path, source: str, name: str = "mod.py"):
    (tmp_path / name).write_text(textwrap.dedent(source))
    sites, problems = scan(tmp_path)
    assert problems == []
    return sites


def test_fstring_template_placeholders_and_location(tmp_path):
    (site,) = _scan_source(
        tmp_path,
        """
        import torch

        def _require_dtype(name: str, x, dtype: torch.dtype) -> None:
            if x.dtype != dtype:
                raise ValueError(f"{name} must have dtype {dtype}, got {x.dtype}")
        """,
    )
    assert (site.path, site.line, site.end_line, site.function) == (
        "mod.py",
        6,
        6,
        "_require_dtype",
    )
    assert site.exception == "ValueError"
    assert site.message.kind == "fstring"
    assert site.message.template == "{name} must have dtype {dtype}, got {x_dtype}"
    assert [(p.name, p.expr) for p in site.message.placeholders] == [
        ("name", "name"),
        ("dtype", "dtype"),
        ("x_dtype", "x.dtype"),
    ]
    regex = site.message.regex
    assert re.fullmatch(regex, "cache_seqlens must have dtype torch.int32, got torch.int64")
    # dtype placeholders are narrowed, so a specific message with a list of dtypes does not match
    assert not re.fullmatch(
        regex, "q must have dtype float16, bfloat16 or float32, got torch.float64"
    )
    assert not re.fullmatch(regex, "k must have dtype torch.int32, got torch.int64 (and more)")


def test_excerpt_is_clipped_to_the_function(tmp_path):
    (site,) = _scan_source(
        tmp_path,
        """
        def f(x):
            if x:
                raise TypeError(
                    "x must be falsy"
                )
            return x
        """,
    )
    assert (site.line, site.end_line) == (4, 6)
    assert site.excerpt_start == 2
    assert site.excerpt_text.splitlines()[0] == "def f(x):"
    assert site.source_json()["excerpt"]["end_line"] == 7


def test_message_forms(tmp_path):
    sites = _scan_source(
        tmp_path,
        """
        LIMIT = 256
        MESSAGE = "ring parallelism is not supported"

        class ShapeError(ValueError):
            pass

        class Outer:
            def method(self, n, items, mode):
                msg = f"n={n} is too big"
                if n > LIMIT:
                    raise ValueError(msg)
                if n < 0:
                    raise ValueError("n must be >= 0, got %d" % n)
                if not items:
                    raise ShapeError("{} items, need {need}".format(len(items), need=LIMIT))
                if mode:
                    raise NotImplementedError(MESSAGE)
                if n == 1:
                    raise ValueError(f"n must be <= {LIMIT}, got {n!r}")
                raise TypeError(compute_message(n))
        """,
    )
    got = [(s.function, s.exception, s.message.kind, s.message.template) for s in sites]
    assert got == [
        ("Outer.method", "ValueError", "fstring", "n={n} is too big"),
        ("Outer.method", "ValueError", "percent", "n must be >= 0, got {n}"),
        ("Outer.method", "ShapeError", "format", "{len_items} items, need {LIMIT}"),
        ("Outer.method", "NotImplementedError", "literal", "ring parallelism is not supported"),
        ("Outer.method", "ValueError", "fstring", "n must be <= 256, got {n}"),
        ("Outer.method", "TypeError", "dynamic", "{compute_message_n}"),
    ]
    assert re.fullmatch(sites[1].message.regex, "n must be >= 0, got -3")
    assert not re.fullmatch(sites[1].message.regex, "n must be >= 0, got x")  # %d is an int
    assert re.fullmatch(sites[2].message.regex, "0 items, need 256")


def test_repeated_expression_is_a_back_reference_and_empty_values_match(tmp_path):
    (site,) = _scan_source(
        tmp_path,
        """
        def f(a, extra):
            raise ValueError(f"{a} != {a}{extra}!")
        """,
    )
    assert site.message.template == "{a} != {a}{extra}!"
    assert re.fullmatch(site.message.regex, "3 != 3!")
    assert not re.fullmatch(site.message.regex, "3 != 4!")


def test_literal_braces_are_doubled_and_other_raises_ignored(tmp_path):
    sites = _scan_source(
        tmp_path,
        """
        def f(x):
            try:
                x()
            except KeyError:
                raise
            if x is None:
                raise RuntimeError("not catalogued")
            raise ValueError(f"{{x}} is {x}")
        """,
    )
    (site,) = sites
    assert site.message.template == "{{x}} is {x}"
    assert re.fullmatch(site.message.regex, "{x} is 3")


def test_tree_is_not_imported_and_unparsable_files_are_reported(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        'raise SystemExit("imported!")\ndef f():\n    raise ValueError("a")\n'
    )
    (tmp_path / "pkg" / "broken.py").write_text("def (:\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "skip.py").write_text('raise ValueError("skipped")\n')
    sites, problems = scan(tmp_path)
    assert [(s.path, s.message.template) for s in sites] == [("pkg/a.py", "a")]
    assert len(problems) == 1 and problems[0].startswith("pkg/broken.py: not scanned (SyntaxError")


def test_private_helper_names_narrow_to_the_literals_its_calls_pass(tmp_path):
    (site, *_) = _scan_source(
        tmp_path,
        """
        def _require_last_dim(name, x):
            if x.stride(-1) != 1:
                raise ValueError(f"{name} must have contiguous last dimension")

        def check(k_cache, v_cache):
            _require_last_dim("k_cache", k_cache)
            _require_last_dim(name="v_cache", x=v_cache)
        """,
    )
    regex = site.message.regex
    assert re.fullmatch(regex, "v_cache must have contiguous last dimension")
    assert not re.fullmatch(regex, "block_table must have contiguous last dimension")


def test_helpers_imported_by_name_narrow_to_the_literals_of_every_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "checks.py").write_text(
        "_LIMIT = 1\n\n\ndef _require_last_dim(name, x):\n    if x.stride(-1) != 1:\n"
        '        raise ValueError(f"{name} must have contiguous last dimension")\n'
    )
    (tmp_path / "pkg" / "a.py").write_text(
        "from .checks import _LIMIT, _require_last_dim\n\n\n"
        'def f(k_cache):\n    _require_last_dim("k_cache", k_cache)\n'
    )
    (tmp_path / "pkg" / "b.py").write_text(
        'from pkg.checks import _require_last_dim as last\n\n\ndef g(out):\n    last("out", out)\n'
    )
    (site,) = scan(tmp_path)[0]
    assert re.fullmatch(site.message.regex, "out must have contiguous last dimension")
    assert not re.fullmatch(site.message.regex, "block_table must have contiguous last dimension")
    (tmp_path / "pkg" / "c.py").write_text(
        "from pkg import checks\n\n\ndef h(x):\n    checks._require_last_dim(str(x), x)\n"
    )
    (opened,) = scan(tmp_path)[0]
    assert re.fullmatch(opened.message.regex, "block_table must have contiguous last dimension")


def test_helpers_called_with_other_values_or_imported_stay_open(tmp_path):
    (open_site,) = _scan_source(
        tmp_path,
        """
        def _require(name, x):
            if x is None:
                raise ValueError(f"{name} must be given")

        def check(pairs):
            _require("q", 1)
            for name, x in pairs:
                _require(name, x)
        """,
    )
    assert re.fullmatch(open_site.message.regex, "anything must be given")
    (tmp_path / "mod.py").unlink()
    (tmp_path / "a.py").write_text(
        'def _req(name, x):\n    if x is None:\n        raise ValueError(f"{name} is '
        'missing")\n\n\n'
        'def f(q):\n    _req("q", q)\n'
    )
    (tmp_path / "b.py").write_text("from a import _req\n\n\ndef g(k):\n    _req(str(k), k)\n")
    (imported,) = [s for s in scan(tmp_path)[0] if s.path == "a.py"]
    assert re.fullmatch(imported.message.regex, "k is missing")
