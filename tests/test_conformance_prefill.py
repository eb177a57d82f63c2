"""The conformance suite's prefill section (:mod:`attn_ref.conformance.prefill`): the reference
passes it, each deliberately broken prefill function (:mod:`broken_prefill`) is caught by the
features it breaks and by no other, a backward that raises or computes nothing is reported, a
target with only ``flash_attn_with_kvcache`` reports the section not applicable, a function or
keyword the target does not export is reported "not exported", and the command line, the repro
snippets and the pytest entry handle the section."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attn_ref
import broken_prefill
from attn_ref.conformance import FEATURES, run_conformance
from attn_ref.conformance.prefill import PREFILL
from attn_ref.conformance.prefill_errors import INVALID_CALLS, valid_call
from attn_ref.conformance.pytest import conformance_test
from attn_ref.conformance.target import PREFILL_FUNCTIONS

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(
    os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), TRITON_INTERPRET="1"
)
NAMES = [feature.name for feature in PREFILL]


def statuses(report) -> dict:
    return {f.name: f.status for f in report.features}


def test_reference_passes_the_section():
    report = run_conformance(attn_ref.flash_attn_with_kvcache, select="prefill")
    assert report.exit_status == 0, report.text()
    assert set(statuses(report).values()) == {"pass"} and list(statuses(report)) == NAMES
    assert all(f.probes >= 1 for f in report.features)
    assert report.exports == [f"attn_ref:{name}" for name in PREFILL_FUNCTIONS]
    assert "prefill section: attn_ref:flash_attn_func, attn_ref:flash_attn_varlen_func" in (
        report.text()
    )
    assert [f for f in FEATURES if f.family == "prefill"] == PREFILL


def test_each_broken_function_fails_its_features_and_no_other():
    report = run_conformance("broken_prefill:flash_attn_with_kvcache", select="prefill")
    failing = {name for names in broken_prefill.CAUGHT_BY.values() for name in names}
    expected = {name: "fail" if name in failing else "pass" for name in NAMES}
    assert statuses(report) == expected, report.text(repros=False)
    details = {f.name: f.failures[0].detail for f in report.failed}
    assert details["prefill/func"].startswith("out: max error")  # the scale
    assert details["prefill/varlen_grads"].startswith("dk: max error")  # values pass, dk wrong
    assert details["prefill/qkvpacked_grads"].startswith("the output does not require grad")
    assert details["prefill/combine_errors"] == (
        "accepted a call upstream refuses (out_dtype_float64): returned tuple"
    )
    repro = next(f for f in report.failed if f.name == "prefill/func").failures[0].repro
    assert "from broken_prefill import flash_attn_func as fn" in repro
    assert "outcome = fn(q=args['q'], k=args['k'], v=args['v'], return_attn_probs=True)" in repro


def test_backward_that_raises_is_reported_and_backward_can_be_declared(monkeypatch):
    monkeypatch.setattr(broken_prefill, "flash_attn_func", broken_prefill.backward_raises)
    report = run_conformance(
        "broken_prefill:flash_attn_with_kvcache", select="prefill/func,prefill/func_grads"
    )
    assert statuses(report) == {"prefill/func": "pass", "prefill/func_grads": "fail"}
    assert report.failed[0].failures[0].detail == (
        "the backward raised RuntimeError: this backward is not implemented"
    )
    report = run_conformance(
        "broken_prefill:flash_attn_with_kvcache",
        select="prefill/func_grads,prefill/qkvpacked_grads,prefill/qkvpacked",
        unsupported=["backward"],
    )
    assert report.exit_status == 0
    assert statuses(report) == {
        "prefill/qkvpacked": "pass",
        "prefill/func_grads": "not supported",
        "prefill/qkvpacked_grads": "not supported",
    }


def test_kvcache_only_target_reports_the_section_not_applicable():
    report = run_conformance("broken_kvcache:ignores_leftpad", select="prefill,values/basic")
    assert report.exit_status == 0 and report.exports == []
    assert report.status("values/basic") == "pass"
    prefill = [f for f in report.features if f.name.startswith("prefill/")]
    assert len(prefill) == len(PREFILL)
    assert all(f.status == "not exported" and f.probes == 0 for f in prefill)
    assert report.features[-1].not_exported == ["flash_attn_combine"]
    text = report.text()
    assert "prefill section: not applicable, the target exports none of FA3's prefill" in text
    assert "1 pass, 0 fail, 0 not supported, 31 not exported" in text
    assert "prefill/func" not in text  # the section's rows are left out of the table


def test_functions_and_keywords_not_exported(monkeypatch):
    """A target beside only a varlen function of FA3's signature: its features run (the LSE asked
    with FA3's ``return_attn_probs``), the ``sinks`` ones and the other functions' are not
    exported; a function found in a package above the target's module counts."""
    for name in ("flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_combine"):
        monkeypatch.delattr(broken_prefill, name)
    monkeypatch.setattr(broken_prefill, "flash_attn_varlen_func", broken_prefill.fa3_varlen_func)
    report = run_conformance(
        "broken_prefill:flash_attn_with_kvcache",
        select="prefill/varlen,prefill/varlen_sinks,prefill/varlen_grads_sinks,prefill/combine",
    )
    assert report.exit_status == 0, report.text()
    assert statuses(report) == {
        "prefill/varlen": "pass",
        "prefill/varlen_sinks": "not exported",
        "prefill/varlen_grads_sinks": "not exported",
        "prefill/combine": "not exported",
    }
    assert report.features[1].not_exported == ["flash_attn_varlen_func(sinks=)"]
    assert "prefill section: broken_prefill:flash_attn_varlen_func" in report.text()
    found = run_conformance("attn_ref.kvcache:flash_attn_with_kvcache", select="prefill/combine")
    assert found.exports[-1] == "attn_ref:flash_attn_combine" and found.exit_status == 0


@pytest.mark.parametrize("function", PREFILL_FUNCTIONS)
def test_invalid_calls_change_one_thing_of_a_valid_call(function):
    """The base of the error cases is valid; each case is refused by the reference."""
    assert getattr(attn_ref, function)(**valid_call(function, torch.bfloat16)) is not None
    assert any(entry[0] == function for entry in INVALID_CALLS.values())


def test_gradient_repro_runs_standalone(tmp_path):
    target = "broken_prefill:flash_attn_with_kvcache"
    report = run_conformance(target, select="prefill/varlen_grads")
    script = tmp_path / "repro.py"
    script.write_text(report.features[0].failures[0].repro)
    assert "outcome = gradient_call(fn, args, {})" in script.read_text()
    failing = subprocess.run(
        [sys.executable, str(script)], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert failing.returncode == 1 and "AssertionError" in failing.stderr
    assert failing.stdout.startswith("FAIL (error ratio")
    script.write_text(
        script.read_text().replace(
            "from broken_prefill import flash_attn_varlen_func as fn",
            "from attn_ref import flash_attn_varlen_func as fn",
        )
    )
    fixed = subprocess.run(
        [sys.executable, str(script)], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert fixed.returncode == 0 and fixed.stdout.startswith("PASS"), fixed.stderr


def test_cli_report_of_a_kvcache_only_target(tmp_path):
    path = tmp_path / "report.json"
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "attn_ref.conformance",
            "broken_kvcache:ignores_leftpad",
            "--select",
            "values/basic,prefill",
            "--report",
            str(path),
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "prefill section: not applicable" in cli.stdout
    data = json.loads(path.read_text())
    assert data["passed"] and data["exports"] == []
    combine = data["features"][-1]
    assert combine["status"] == "not exported" and combine["not_exported"] == ["flash_attn_combine"]


def test_pytest_entry_skips_what_is_not_exported():
    test = conformance_test("broken_kvcache:ignores_leftpad", select="prefill/func")
    feature = next(f for f in PREFILL if f.name == "prefill/func")
    with pytest.raises(pytest.skip.Exception, match=r"not exported: prefill/func calls flash_at"):
        test(feature)
    test = conformance_test("broken_prefill:flash_attn_with_kvcache", select="prefill/func")
    with pytest.raises(pytest.fail.Exception, match=r"from broken_prefill import flash_attn_func"):
        test(feature)
