"""The conformance suite (:mod:`attn_ref.conformance`): both implementations pass its quick size,
each deliberately broken implementation (:mod:`broken_kvcache`) is caught by the feature it breaks,
declared capabilities are reported "not supported", and the command line, the JSON report, the
repro snippets and the pytest entry work as documented."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attn_ref
import broken_kvcache
import kernels
from attn_ref.conformance import CAPABILITIES, FEATURES, KNOWN_TARGETS, SIZES, run_conformance
from attn_ref.conformance.grid import FAMILIES, select

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(
    os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), TRITON_INTERPRET="1"
)


def run_cli(*argv, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "attn_ref.conformance", *argv],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "fn",
    [attn_ref.flash_attn_with_kvcache, kernels.flash_attn_with_kvcache],
    ids=["ref", "kernels"],
)
def test_implementations_pass_quick(fn):
    """Every feature passes, except the prefill section's features of functions the package does
    not export (reported "not exported"; see test_conformance_prefill.py)."""
    report = run_conformance(fn, select="quick")
    assert report.exit_status == 0, report.text()
    assert {f.name for f in report.features} == {f.name for f in FEATURES}
    exported = {name.partition(":")[2] for name in report.exports}
    features = {feature.name: feature for feature in FEATURES}
    for result in report.features:
        feature = features[result.name]
        if feature.function is None or (feature.function in exported and not feature.keywords):
            assert result.status == "pass" and result.probes >= 1, result.name
        else:
            assert result.status in ("pass", "not exported"), result.name


@pytest.mark.parametrize(
    "broken, caught_by",
    broken_kvcache.CAUGHT_BY.items(),
    ids=[fn.__name__ for fn in broken_kvcache.CAUGHT_BY],
)
def test_broken_implementation_is_caught_by_its_feature(broken, caught_by):
    names = [caught_by] if isinstance(caught_by, str) else list(caught_by)
    report = run_conformance(broken, select=[*names, "values/basic"])
    assert report.exit_status == 1
    assert report.status("values/basic") == "pass"  # the bug is named, not everything
    for name in names:
        assert report.status(name) == "fail", report.text(repros=False)
        failure = next(f for f in report.features if f.name == name).failures[0]
        assert (
            "fn(" in failure.repro and f"broken_kvcache import {broken.__name__}" in failure.repro
        )


def test_repro_snippet_runs_standalone(tmp_path):
    report = run_conformance(broken_kvcache.ignores_leftpad, select="values/leftpad")
    script = tmp_path / "repro.py"
    script.write_text(report.features[0].failures[0].repro)
    failing = subprocess.run(
        [sys.executable, str(script)], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert (
        failing.returncode == 1
        and "AssertionError" in failing.stderr
        and failing.stdout.startswith("FAIL")
    )
    # The same script against the reference passes.
    script.write_text(
        script.read_text().replace(
            "from broken_kvcache import ignores_leftpad as fn",
            "from attn_ref import flash_attn_with_kvcache as fn",
        )
    )
    fixed = subprocess.run(
        [sys.executable, str(script)], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert fixed.returncode == 0 and fixed.stdout.startswith("PASS"), fixed.stderr


def test_not_implemented_fails_unless_declared():
    report = run_conformance(broken_kvcache.no_qv, select="values/qv")
    assert report.status("values/qv") == "fail"
    assert "NotImplementedError: qv is not implemented" in report.features[0].failures[0].detail
    report = run_conformance(broken_kvcache.no_qv, select="values", unsupported=["qv", "only_qv"])
    assert report.exit_status == 0
    assert report.status("values/qv") == report.status("values/only_qv") == "not supported"
    assert "not supported" in report.text() and "declared unsupported: qv" in report.text()


def test_module_attribute_declares_capabilities(monkeypatch):
    monkeypatch.setattr(broken_kvcache, "CONFORMANCE_UNSUPPORTED", ("qv", "only_qv"), raising=False)
    report = run_conformance(broken_kvcache.no_qv, select="values/qv,values/only_qv")
    assert report.exit_status == 0 and report.unsupported == ["only_qv", "qv"]


def test_unknown_names_are_refused():
    with pytest.raises(
        ValueError, match=r"^unknown --select entry 'leftpad'; known: quick, default, full, values"
    ):
        select(FEATURES, "leftpad")
    with pytest.raises(ValueError, match=r"^unknown capability 'values/fp8'; known: paged"):
        run_conformance(
            attn_ref.flash_attn_with_kvcache, select="values/basic", unsupported=["values/fp8"]
        )
    with pytest.raises(
        ValueError,
        match=r"^cannot load the conformance target 'kernels': expected 'module:function'",
    ):
        run_conformance("kernels")


def test_sizes_cover_every_feature_and_family():
    for name, size in SIZES.items():
        chosen_size, features = select(FEATURES, name)
        assert chosen_size is size and features == FEATURES
        for feature in features:
            assert feature.probes(size, torch.bfloat16, 0, "cpu"), (name, feature.name)
            assert set(feature.needs) <= set(CAPABILITIES)
    assert {f.family for f in FEATURES} == set(FAMILIES)
    size, features = select(FEATURES, "default,errors,values/paged")
    assert size.name == "default" and [f.name for f in features] == [
        "values/paged",
        "errors/ver",
        "errors/sglang_order",
        "errors/caches_untouched",
    ]


def test_cli_report_and_exit_status(tmp_path):
    path = tmp_path / "report.json"
    ok = run_cli(
        "attn_ref:flash_attn_with_kvcache", "--select", "values/basic,errors", "--report", str(path)
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    data = json.loads(path.read_text())
    assert (
        data["passed"]
        and data["target"] == "attn_ref:flash_attn_with_kvcache"
        and data["dtype"] == "bfloat16"
    )
    assert [f["name"] for f in data["features"]] == [
        "values/basic",
        "errors/ver",
        "errors/sglang_order",
        "errors/caches_untouched",
    ]
    broken = run_cli(
        "broken_kvcache:causal_off_by_one",
        "--select",
        "values/causal,values/basic",
        "--dtype",
        "fp16",
        "--unsupported",
        "fp8",
    )
    assert broken.returncode == 1
    assert (
        "FAIL          values/causal" in broken.stdout
        and "PASS          values/basic" in broken.stdout
    )
    assert "from broken_kvcache import causal_off_by_one as fn" in broken.stdout
    for argv in (["no_such_module:fn"], ["attn_ref:flash_attn_with_kvcache", "--select", "nope"]):
        usage = run_cli(*argv)
        assert usage.returncode == 2 and "error:" in usage.stderr


def test_pytest_entry(tmp_path):
    (tmp_path / "test_mine.py").write_text(
        textwrap.dedent("""
        from attn_ref.conformance.pytest import conformance_test

        test_reference = conformance_test("attn_ref:flash_attn_with_kvcache", select="values/basic,values/qv",
                                          unsupported=["qv"])
        test_broken = conformance_test("broken_kvcache:ignores_leftpad", select="values/leftpad")
    """)
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "1 failed, 1 passed, 1 skipped" in result.stdout, result.stdout
    assert "not supported: values/qv needs qv" in result.stdout
    assert (
        "test_broken[values/leftpad]" in result.stdout
        and "from broken_kvcache import ignores_leftpad" in result.stdout
    )


def test_docs_page_lists_every_feature_capability_and_target():
    page = (ROOT / "docs" / "conformance.md").read_text()
    for name in [f.name for f in FEATURES] + list(KNOWN_TARGETS):
        assert f"| `{name}` |" in page, name
    for name in CAPABILITIES:
        assert f"`{name}`" in page.split("## Capabilities")[1].split("## The report")[0], name
