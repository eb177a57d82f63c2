"""Examples a user would write: what can be checked of them without running them.

* the guard decides with the entry's predicate: it calls the function the predicate defines;
* the fixed example makes the trigger's own call (the same function, the cause corrected);
* a guard or recovery that drops, skips or truncates something says so at run time
  (``warnings.warn``).

Each rule is also run on a bad sample, so that none of them passes by construction.
"""

import ast
import copy
import re

import pytest

from errors import catalog as cat
from errors.examples import predicate_name

CATALOG = cat.load()
ACTIVE = [e for e in CATALOG["errors"] if e["status"] == "active"]
#: Entries whose fix is a different call, and why.
OTHER_CALL_FIXES = {
    "environment/kernels-name-clash": (
        "the fix imports attn-ref's kernels by path instead of the name transformers checks"
    ),
    "kernels/no-device": (
        "without a GPU the fix is the reference implementation, not the kernel launch"
    ),
    "sequence-parallel/kv-gather-varlen": (
        "the fix is a module in 'auto' mode instead of the 'kv_gather' one"
    ),
}
#: Words that say an example loses data (``dropout`` is not one of them).
LOSS = re.compile(
    r"\b(drop|drops|dropped|dropping|skip|skips|skipped|truncat\w*|discard\w*)\b", re.IGNORECASE
)


def _called_names(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None))
    return names - {None}


def _trigger_target(code: str) -> str:
    """The function the trigger calls: the outermost call of its last statement that is a call."""
    calls = [
        st.value
        for st in ast.parse(code).body
        if isinstance(st, (ast.Expr, ast.Assign)) and isinstance(st.value, ast.Call)
    ]
    func = calls[-1].func
    return func.attr if isinstance(func, ast.Attribute) else func.id


def guard_problem(entry: dict):
    name = predicate_name(entry["examples"])
    if name not in _called_names(entry["examples"]["guard"]["code"]):
        return f"the guard never calls the predicate {name!r}"
    return None


def fixed_problem(entry: dict):
    examples = entry["examples"]
    target = _trigger_target(examples["trigger"]["code"])
    if target not in _called_names(examples["fixed"]["code"]):
        return f"the fixed example never calls {target!r}, the trigger's call"
    return None


def loss_problems(entry: dict) -> list[str]:
    return [
        f"the {kind} mentions {LOSS.search(code).group(0)!r} but does not warn"
        for kind in ("guard", "recovery")
        if LOSS.search(code := entry["examples"][kind]["code"]) and "warnings.warn(" not in code
    ]


@pytest.mark.parametrize("entry", ACTIVE, ids=[e["slug"] for e in ACTIVE])
def test_examples_are_honest(entry):
    problems = [guard_problem(entry), *loss_problems(entry)]
    if entry["slug"] not in OTHER_CALL_FIXES:
        problems.append(fixed_problem(entry))
    assert [p for p in problems if p] == []


def test_other_call_fixes_are_current():
    by_slug = {e["slug"]: e for e in ACTIVE}
    for slug in OTHER_CALL_FIXES:
        assert slug in by_slug and fixed_problem(by_slug[slug]) is not None, (
            f"{slug}: exemption not needed"
        )


def _sample() -> dict:
    return copy.deepcopy(next(e for e in ACTIVE if e["slug"] == "kv-cache/capacity-exceeded"))


def test_a_guard_that_ignores_the_predicate_fails():
    entry = _sample()
    assert guard_problem(entry) is None
    entry["examples"]["guard"]["code"] = "out = flash_attn_with_kvcache(q, k_cache, v_cache)\n"
    assert guard_problem(entry) == "the guard never calls the predicate 'overflows'"


def test_a_fix_with_another_call_fails():
    entry = _sample()
    assert fixed_problem(entry) is None
    entry["examples"]["fixed"]["code"] = "out = other_attention(q, k_cache, v_cache)\n"
    assert (
        fixed_problem(entry)
        == "the fixed example never calls 'flash_attn_with_kvcache', the trigger's call"
    )


def test_a_recovery_that_drops_silently_fails():
    entry = _sample()
    assert loss_problems(entry) == []
    entry["examples"]["recovery"]["code"] = (
        "out = f(k_new[:, :1])  # drop the tokens that do not fit\n"
    )
    assert loss_problems(entry) == ["the recovery mentions 'drop' but does not warn"]
    entry["examples"]["recovery"]["code"] = "import warnings\nwarnings.warn('dropped 1 token')\n"
    assert loss_problems(entry) == []
