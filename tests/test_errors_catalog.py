"""The shipped error catalog against the code: every rule of ``python -m errors check``.

The examples run once per entry (parametrised), so a failure names the entry.
"""

import copy

import pytest

import errors
from errors import catalog as cat
from errors.check import check
from errors.examples import example_problems, skip_reason

CATALOG = cat.load()


def _report(problems) -> str:
    return "\n".join(f"{rule} {where}: {detail}" for rule, where, detail in problems)


def test_catalog_matches_code_schema_and_history():
    report = check(run_examples=False, base="HEAD")
    assert report.ok, _report(report.problems)
    assert report.counts["active"] == report.counts["raise_sites"]


@pytest.mark.parametrize("entry", CATALOG["errors"], ids=[e["slug"] for e in CATALOG["errors"]])
def test_examples(entry):
    reason = skip_reason(entry)
    if reason:
        pytest.skip(reason)
    assert example_problems(entry, CATALOG) == []


def test_q_none_entry_is_the_one_users_search_for():
    entry = errors.get("only-qv/q-none-without-only-qv")
    assert entry["message"]["template"] == "q can only be None when only_qv=True"
    assert (
        "flash_attn_with_kvcache(q=None, k_cache=kc, v_cache=vc)"
        in entry["examples"]["trigger"]["code"]
    )
    assert (
        "only_qv=True, qv=qv" in entry["examples"]["fixed"]["code"]
        or "qv=qv, only_qv=True" in entry["examples"]["fixed"]["code"]
    )
    upstream = entry["upstream"]
    assert upstream["repository"] == "sgl-project/sglang"
    assert upstream["path"] == "python/sglang/kernels/aot/python/sgl_kernel/flash_attn.py"
    assert upstream["function"] == "flash_attn_with_kvcache"


def test_replicated_qkv_entry_is_shared_with_sglang():
    entry = errors.lookup("Replicated Q, K, and V must be provided together.")
    assert entry["slug"] == "sequence-parallel/replicated-qkv-together"
    assert "replicated_q=rq)" in entry["examples"]["trigger"]["code"]
    assert (
        entry["upstream"]["path"]
        == "python/sglang/multimodal_gen/runtime/layers/attention/layer.py"
    )


def test_upstream_messages_of_the_kvcache_spec_are_all_shared():
    shared = {e["message"]["template"] for e in CATALOG["errors"] if e["upstream"]}
    for message in (
        "v_cache must be provided",
        "k_cache can only be None when only_qv=True",
        "q can only be None when only_qv=True",
        "q must be provided unless qv is provided with only_qv=True",
        "only_qv=True requires qv to be provided",
        "{name} must have contiguous last dimension",
    ):
        assert message in shared


def test_shared_statement_lists_exactly_the_entries_with_upstream():
    assert CATALOG["upstream_shared"]["ids"] == sorted(
        e["id"] for e in CATALOG["errors"] if e["upstream"]
    )


def test_example_rules_can_fail():
    entry = copy.deepcopy(errors.get("kv-cache/v-cache-missing"))
    examples = entry["examples"]
    examples["recovery"]["code"] = "out = flash_attn_with_kvcache(q, k_cache, v_cache)\n"
    examples["fixed"]["code"] = examples["trigger"]["code"]
    examples["trigger"]["code"] = "flash_attn_with_kvcache(q, None, v_cache)  # another error\n"
    examples["predicate"]["true_cases"] = ["v_cache_missing(v_cache)"]
    problems = example_problems(entry, CATALOG)
    own, other = entry["source"], errors.get("only-qv/k-cache-none-without-only-qv")["source"]
    assert problems == [
        "trigger: message 'k_cache can only be None when only_qv=True' does not match the entry's "
        "regex",
        "trigger: message 'k_cache can only be None when only_qv=True' also matches "
        "only-qv/k-cache-none-without-only-qv",
        f"trigger: raised at {other['path']}:{other['line']}, expected "
        f"{own['path']}:{own['line']}-{own['end_line']}",
        "fixed: raised ValueError: v_cache must be provided",
        "recovery: this entry's error was never raised (and recovered from) while it ran",
        "predicate: v_cache_missing(v_cache) gave False, expected True",
    ]
