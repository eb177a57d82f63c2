"""The check rules fail on drift, and ``sync`` repairs derived fields only.

Each test builds a tiny project (``attn_ref/mod.py`` plus a catalog) in a temporary folder, so the
real catalog is never touched. Examples are not run here (they are covered by test_errors_catalog).
"""

import copy
import json
import subprocess
import textwrap

import pytest

from errors import catalog as cat
from errors.check import NoHistory, check, git_text, history_problems
from errors.sync import scan_package, sync, sync_file

SOURCE = textwrap.dedent("""\
    def check_n(n: int) -> None:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n > 9:
            raise ValueError("n is too big")
    """)


def _authored(site, slug):
    eid, basis = cat.entry_id(site.exception, site.message.template)
    code = {"code": "pass\n"}
    return {
        "id": eid,
        "id_basis": {"algorithm": "sha256/64", "input": basis},
        "slug": slug,
        "status": "active",
        "exception": {"type": site.exception},
        "message": site.message_json(),
        "summary": "s",
        "what_it_means": "m",
        "when_it_happens": {"trigger": "t", "common_situations": ["c"]},
        "solutions": [{"title": "t", "body": "b"}],
        "examples": {
            "trigger": code,
            "fixed": code,
            "guard": code,
            "recovery": code,
            "predicate": {"code": "pass\n", "true_cases": ["True"], "false_cases": ["False"]},
        },
        "source": site.source_json(),
        "related": [],
        "area": "test",
        "tags": [],
        "upstream": None,
    }


@pytest.fixture
def project(tmp_path):
    (tmp_path / "attn_ref").mkdir()
    (tmp_path / "attn_ref" / "mod.py").write_text(SOURCE)
    sites = scan_package(tmp_path)
    base = {
        "$schema": "https://attn-ref.github.io/attn-ref/api/errors/schema.json",
        "schema_version": 1,
        "package": "attn-ref",
        "docs_base_url": "https://example.org/docs",
        "scope": "test",
        "errors": [_authored(s, f"test/e{i}") for i, s in enumerate(sites)],
    }
    path = tmp_path / "catalog.json"
    path.write_text(cat.dumps(sync(base, sites, tmp_path).catalog))
    return tmp_path, path


def _rules(root, path):
    return sorted(
        {rule for rule, _, _ in check(root, path, run_examples=False, base=None).problems}
    )


def _edit(root, old, new):
    mod = root / "attn_ref" / "mod.py"
    mod.write_text(mod.read_text().replace(old, new))


def test_fresh_catalog_passes(project):
    assert _rules(*project) == []


def test_moved_raise_is_drift_and_sync_repairs_only_derived_fields(project):
    root, path = project
    before = json.loads(path.read_text())
    _edit(root, "def check_n", "# a comment that moves every line\ndef check_n")
    assert _rules(root, path) == ["derived", "determinism"]
    _, changed = sync_file(path, root)
    assert changed and _rules(root, path) == []
    after = json.loads(path.read_text())
    for old, new in zip(before["errors"], after["errors"]):
        assert new["source"]["line"] == old["source"]["line"] + 1
        assert {k: v for k, v in new.items() if k != "source"} == {
            k: v for k, v in old.items() if k != "source"
        }
    text = path.read_text()
    sync_file(path, root)
    assert path.read_text() == text  # a second sync changes nothing


def test_reworded_message_keeps_its_id_and_the_old_wording(project):
    root, path = project
    _edit(root, "n is too big", "n must be <= 9")
    assert "derived" in _rules(root, path)
    sync_file(path, root)
    entry = next(e for e in json.loads(path.read_text())["errors"] if e["slug"] == "test/e1")
    assert entry["message"]["template"] == "n must be <= 9"
    assert entry["message"]["previous_templates"] == ["n is too big"]
    assert entry["id"] == cat.entry_id("ValueError", "n is too big")[0]


def test_new_raise_without_entry_fails(project):
    root, path = project
    _edit(
        root,
        'raise ValueError("n is too big")',
        'raise ValueError("n is too big")\n    raise TypeError("new")',
    )
    problems = check(root, path, run_examples=False, base=None).problems
    assert [(rule, detail.split(":")[0]) for rule, _, detail in problems if rule == "coverage"] == [
        ("coverage", "raise without a catalog entry")
    ]


def test_deleted_raise_fails_until_the_entry_is_marked_removed(project):
    root, path = project
    _edit(root, '    if n > 9:\n        raise ValueError("n is too big")\n', "")
    assert "coverage" in _rules(root, path)
    catalog = json.loads(path.read_text())
    entry = next(e for e in catalog["errors"] if e["slug"] == "test/e1")
    entry["status"], entry["removed_note"] = "removed", "n is no longer bounded."
    path.write_text(cat.dumps(catalog))
    sync_file(path, root)
    assert _rules(root, path) == []


def test_identity_and_schema_rules(project):
    root, path = project
    good = json.loads(path.read_text())
    for damage, rule in (
        (lambda c: c["errors"][1].update(slug=c["errors"][0]["slug"]), "ids"),
        (lambda c: c["errors"][0].update(id="0" * 16), "ids"),
        (
            lambda c: c["errors"][0]["related"].append({"id": "f" * 16, "relation": "same_area"}),
            "ids",
        ),
        (lambda c: c["errors"][0].update(summary="x" * 81), "schema"),
        (lambda c: c["errors"][0].update(colour="red"), "schema"),
        (lambda c: c["errors"][0].update(solutions=[]), "schema"),
    ):
        catalog = copy.deepcopy(good)
        damage(catalog)
        path.write_text(cat.dumps(catalog))
        assert rule in _rules(root, path)


def test_unreadable_catalog_is_one_load_problem(project):
    root, path = project
    path.write_text("{not json")
    report = check(root, path, run_examples=False, base=None)
    assert [rule for rule, _, _ in report.problems] == ["load"]


def test_history_never_deletes_or_changes_identity(project):
    _, path = project
    old_text = path.read_text()
    catalog = json.loads(old_text)
    assert history_problems(catalog, old_text) == []
    renamed = copy.deepcopy(catalog)
    renamed["errors"][0]["slug"] = "test/renamed"
    assert len(history_problems(renamed, old_text)) == 1
    renamed["errors"][0]["aliases"] = [catalog["errors"][0]["slug"]]
    assert history_problems(renamed, old_text) == []
    deleted = copy.deepcopy(catalog)
    deleted["errors"].pop()
    assert "was deleted" in history_problems(deleted, old_text)[0][1]


def test_the_shipped_catalog_detects_a_tampered_line(tmp_path):
    catalog = json.loads(cat.CATALOG_PATH.read_text())
    catalog["errors"][0]["source"]["line"] += 1
    path = tmp_path / "catalog.json"
    path.write_text(cat.dumps(catalog))
    rules = {
        rule for rule, _, _ in check(catalog_path=path, run_examples=False, base=None).problems
    }
    assert rules == {"derived", "determinism"}


def _git(root, *args):
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_history_base_unknown_revision_fails_and_no_repository_skips(project):
    root, path = project
    report = check(root, path, run_examples=False, base="HEAD")
    assert report.ok and [rule for rule, _, _ in report.skipped] == ["history"]
    assert "not a git work tree" in report.skipped[0][2]
    _git(root, "init", "-q")
    _git(root, "add", "catalog.json")
    _git(root, "commit", "-q", "-m", "catalog")
    assert check(root, path, run_examples=False, base="HEAD").skipped == []
    for revision in ("no-such-revision", "--output=/tmp/x", ""):
        problems = check(root, path, run_examples=False, base=revision).problems
        assert [rule for rule, _, _ in problems] == ["history"], revision
    with pytest.raises(ValueError, match="unknown git revision 'no-such-revision'"):
        git_text(root, "no-such-revision", path)
    with pytest.raises(NoHistory, match="no catalog at"):
        git_text(root, "HEAD", root / "attn_ref" / "mod.py.json")


def _with_upstream(path, **fields):
    catalog = json.loads(path.read_text())
    catalog["errors"][0]["upstream"] = {
        "repository": "sgl-project/sglang",
        "path": "x.py",
        "function": "f",
        "note": "Same message.",
        **fields,
    }
    path.write_text(cat.dumps(catalog))


@pytest.mark.parametrize(
    "fields, ok",
    [
        ({}, False),
        ({"commit": "3f1d78438341015afc5ad309b63713c5c68f8de0"}, True),
        ({"unpinned": "the spec pins no commit"}, True),
        ({"commit": "3f1d78438341015afc5ad309b63713c5c68f8de0", "unpinned": "x"}, False),
    ],
)
def test_upstream_notes_say_what_they_were_checked_against(project, fields, ok):
    root, path = project
    _with_upstream(path, **fields)
    sync_file(path, root)
    assert _rules(root, path) == ([] if ok else ["upstream"])


def test_external_aliases_are_kept_by_sync_unique_and_never_dropped(project):
    root, path = project
    catalog = json.loads(path.read_text())
    alias = {"id": "f0e8c28e3c1dd042", "source": "sglang error-explanation page"}
    catalog["errors"][0]["external_aliases"] = [alias]
    path.write_text(cat.dumps(catalog))
    old_text = path.read_text()
    _edit(root, "def check_n", "# moves every line\ndef check_n")
    sync_file(path, root)
    synced = json.loads(path.read_text())
    assert synced["errors"][0]["external_aliases"] == [alias] and _rules(root, path) == []
    assert cat.get("f0e8c28e3c1dd042", synced) == synced["errors"][0]
    taken = copy.deepcopy(synced)
    taken["errors"][1]["external_aliases"] = [dict(alias, source="someone else")]
    path.write_text(cat.dumps(taken))
    assert _rules(root, path) == ["ids"]
    dropped = copy.deepcopy(synced)
    del dropped["errors"][0]["external_aliases"]
    assert (
        "external alias f0e8c28e3c1dd042 was dropped" in history_problems(dropped, old_text)[0][1]
    )
    bad = copy.deepcopy(synced)
    bad["errors"][0]["external_aliases"] = [{"id": "not-hex", "source": "x"}]
    path.write_text(cat.dumps(bad))
    assert _rules(root, path) == ["schema"]


def test_duplicated_id_is_named_as_such(project):
    root, path = project
    catalog = json.loads(path.read_text())
    catalog["errors"].append(copy.deepcopy(catalog["errors"][0]))
    path.write_text(json.dumps(catalog))
    (problem,) = check(root, path, run_examples=False, base=None).problems
    assert problem[0] == "load" and f"duplicate id '{catalog['errors'][0]['id']}'" in problem[2]
